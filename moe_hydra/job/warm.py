"""Warm starts: job processes forked from a server that has imported torch and Megatron-Core already.

A fresh rank spends seconds importing torch and Megatron-Core before it builds anything (docs/cpu.md). A warm server
(:mod:`moe_hydra.job.warm_server`) imports them once, with the job's own modules, and forks one process per
request; a local run's ranks are forked from that process (:func:`moe_hydra.launch.local.launch_local`), and so
are ``stage=fit``'s builds (:func:`moe_hydra.job.fit.run`). This module is the client: standard library only, so
the launching process (``python -m moe_hydra``) never imports torch on this path.

**One server per equivalence class.** A server serves a request only when a process started fresh by that client
would be the same process: :func:`key` digests the interpreter, its import path, where torch, megatron and numpy
resolve, their installed versions, every moe_hydra source file's size and modification time (an edited checkout
gets a new server), the environment variables read at import time (:data:`KEYED_ENV`), the CPU affinity, the
resource limits, the umask and the cgroup. Whatever differs per request travels with it: the working directory,
the whole environment, ``sys.argv``, ``sys.path`` and the standard streams (their file descriptors, passed over
the socket).

**Where.** A Unix socket ``<dir>/<key[:16]>.sock`` in a private directory (mode 0700, owned by this user):
``$MOE_HYDRA_WARM_DIR``, else ``$XDG_RUNTIME_DIR/moe_hydra``, else ``<tmp>/moe_hydra-<uid>``; beside it the lock
that settles two commands starting one server at once (``fcntl.flock``), the server's pid and its log. A server
that refuses to serve (it found CUDA initialised, or threads started, after its imports) leaves
``<key[:16]>.refused`` with the reason, and clients of that key start cold without trying again.

**Lifetime.** Started on demand, detached (a session of its own), by the first request that finds none; it exits
``$MOE_HYDRA_WARM_IDLE_S`` seconds (default :data:`DEFAULT_IDLE_S`) after its last request when none of its
processes is running, on SIGTERM, and when its socket file is removed or replaced.

**A request** (:class:`Remote`): the server forks; the process reads the call, takes the client's streams as its
0/1/2, its directory and environment, replies with its pid, runs ``module.function(*args, **kwargs)`` and
replies with the outcome (the value, or the exception rebuilt here: :func:`rebuild`). :meth:`Remote.wait`
forwards SIGINT, SIGTERM, SIGUSR2 and SIGHUP to it (a terminal's Ctrl-C reaches only the terminal's own process
group). When the client goes away (the socket's end), the process stops its work as SIGTERM would: a job's ranks
finish their step and record what they measured. A process that ends without a reply is :class:`Ended`.

Switch: ``MOE_HYDRA_WARM=0`` never, ``=1`` always (GPU runs too); unset: the config (``launcher.warm``, null = on
for a CPU job on a machine without GPUs, off otherwise: :func:`wanted`).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import moe_hydra
from moe_hydra.core.errors import Failed
from moe_hydra.core.versions import installed_version

SWITCH = "MOE_HYDRA_WARM"  # 0: never; 1: always; unset: the config
IDLE = "MOE_HYDRA_WARM_IDLE_S"  # seconds a server waits for its next request
DIR = "MOE_HYDRA_WARM_DIR"  # the directory of the sockets
DEFAULT_IDLE_S = 600
START_TIMEOUT_S = 120  # a server's imports take ~5 s here; a loaded machine may take much longer
HANDSHAKE_TIMEOUT_S = 60  # from a request's sending to its process's pid
TIDY_AGE_S = 7 * 86400  # files of servers that are gone are removed after a week
# Read at import time by the interpreter, torch, OpenMP/MKL, CUDA, the loader, moe_hydra: a server started under
# other values would not be the process a fresh start gives. PYTHONUNBUFFERED is honoured per request.
KEYED_ENV = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH_", "LD_", "PYTHON", "CUDA_", "MOE_HYDRA_")
UNKEYED_ENV = frozenset({SWITCH, IDLE, DIR, "PYTHONUNBUFFERED"})
RESOLVED = ("torch", "megatron", "numpy")  # top-level packages whose location is part of the key
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP)
SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path, less its terminating NUL


class Unavailable(Failed):
    """No warm server can take this request (the message says why); the caller starts its processes cold."""


class Ended(Failed):
    """The request's process ended without replying (killed, or its server's process group was)."""


class RemoteError(Failed):
    """An exception raised in the request's process whose class this process does not rebuild; ``remote_type``
    names it and ``remote_traceback`` is its traceback there."""

    def __init__(self, remote_type: str, message: str, remote_traceback: str):
        self.remote_type, self.remote_traceback = remote_type, remote_traceback
        super().__init__(f"{remote_type}: {message}")


def wanted(setting: bool | None, gpu: bool) -> bool:
    """Whether a job's processes start warm: ``MOE_HYDRA_WARM`` (0 or 1) when set, else ``setting``
    (``launcher.warm``), else on for a CPU job (``gpu`` false) on a machine without GPUs (:func:`gpu_machine`). A
    server that never touched CUDA forks processes that then initialise it, which torch supports, but no warm
    start was ever run on a GPU machine (docs/cpu.md): there it is opt-in."""
    switch = os.environ.get(SWITCH, "").strip()
    if switch in ("0", "1"):
        return switch == "1"
    if setting is not None:
        return bool(setting)
    return not gpu and not gpu_machine()


def gpu_machine() -> bool:
    """This machine shows a GPU driver's device (NVIDIA's control device, or ROCm's ``/dev/kfd``): a CPU job there
    may still see CUDA (the job trains on GPUs whenever torch finds one)."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


# ----------------------------------------------------------------------------- the key

def import_path() -> list[str]:
    """``sys.path`` without the entry Python put first for the script or the working directory (absent under -P):
    what a server resolves its imports on, whatever the directory its first client started in."""
    return list(sys.path) if sys.flags.safe_path else list(sys.path[1:])


def _origin(name: str) -> Any:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin or sorted(spec.submodule_search_locations or [])


def origins() -> dict[str, Any]:
    """Where :data:`RESOLVED` and moe_hydra resolve for this process (found, not imported)."""
    return {**{name: _origin(name) for name in RESOLVED}, "moe_hydra": list(moe_hydra.__path__)}


def sources() -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of every moe_hydra source file, as the key has them."""
    root = Path(moe_hydra.__file__).parent
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("conf", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                out.append((os.path.relpath(os.path.join(folder, name), root), st.st_size, st.st_mtime_ns))
    return out


def _umask() -> int:
    try:  # read, not set and restored: another thread may be creating a file
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def key_facts() -> dict[str, Any]:
    """What makes a forked process equivalent to a fresh one started by this process (:func:`key` digests it)."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroup = None
    return {
        "executable": sys.executable,
        "version": sys.version,
        "path": import_path(),
        "origins": origins(),
        "distributions": {d: installed_version(d) for d in ("torch", "megatron-core", "numpy")},
        "sources": sources(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(KEYED_ENV) and k not in UNKEYED_ENV},
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource))
                    if n.startswith("RLIMIT_")},
        "umask": _umask(),
        "cgroup": cgroup,
    }


def key(facts: dict[str, Any] | None = None) -> str:
    """The server's name: a digest of :func:`key_facts`."""
    return hashlib.sha256(json.dumps(facts or key_facts(), sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- where

def directory() -> Path:
    """The private directory of the sockets (created mode 0700).

    Raises:
        Unavailable: it is not a directory of this user's that only this user can open.
    """
    given = os.environ.get(DIR)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if given:
        path = Path(given)
    elif runtime and os.path.isdir(runtime):
        path = Path(runtime) / "moe_hydra"
    else:
        path = Path(tempfile.gettempdir()) / f"moe_hydra-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise Unavailable(f"cannot make the warm-start directory {path}: {e.strerror}") from None
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise Unavailable(f"{path} is not a private directory of this user's (mode {st.st_mode & 0o777:o}, owner "
                          f"{st.st_uid}); chmod 700 it, or set {DIR}")
    return path


def paths(k: str | None = None) -> dict[str, Path]:
    """The server's files for key ``k`` (this process's when None): socket, lock, pid, log, refused."""
    stem = directory() / (k or key())[:16]
    out = {kind: stem.with_suffix(f".{kind}") for kind in ("sock", "lock", "pid", "log", "refused")}
    if len(os.fsencode(out["sock"])) > SOCKET_PATH_MAX:
        raise Unavailable(f"the socket path {out['sock']} is longer than {SOCKET_PATH_MAX} bytes; set {DIR} to a "
                          "shorter directory")
    return out


def idle_s() -> float:
    raw = os.environ.get(IDLE, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_IDLE_S
    except ValueError:
        raise Unavailable(f"{IDLE}={raw!r} is not a number of seconds") from None
    return max(1.0, value)


# ----------------------------------------------------------------------------- the wire

def send(sock: socket.socket, kind: bytes, obj: Any, fds: tuple[int, ...] = ()) -> None:
    """One message: its kind (one byte), the pickle's length, the pickle; ``fds`` ride on the first bytes."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    head = kind + struct.pack("!Q", len(body))
    if fds:
        sent = socket.send_fds(sock, [head], list(fds))
        sock.sendall(head[sent:] + body)
    else:
        sock.sendall(head + body)


def _exactly(sock: socket.socket, n: int, first: bytes = b"") -> bytes:
    data = bytearray(first)
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the connection closed")
        data += chunk
    return bytes(data)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[bytes, Any, list[int]]:
    """(kind, object, file descriptors) of the next message. Raises EOFError at the connection's end."""
    fds: list[int] = []
    if max_fds:
        first, fds, _, _ = socket.recv_fds(sock, 9, max_fds)
        if not first:
            raise EOFError("the connection closed")
    else:
        first = b""
    head = _exactly(sock, 9, first)
    return head[:1], pickle.loads(_exactly(sock, struct.unpack("!Q", head[1:])[0])), fds


def rebuild(info: dict[str, Any]) -> BaseException:
    """The exception the request's process raised: moe_hydra's and the built-in classes rebuilt with their
    arguments and attributes (``JobFailed``'s rank, error and logs), any other as :class:`RemoteError`."""
    module, qualname = info["module"], info["qualname"]
    cls: Any = None
    if module == "builtins" or module == "moe_hydra" or module.startswith("moe_hydra."):
        try:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError):
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return RemoteError(qualname, info["message"], info["traceback"])
    e = cls.__new__(cls)
    e.args = tuple(info["args"])
    if hasattr(e, "__dict__"):
        e.__dict__.update(info["attrs"])
    return e


# ----------------------------------------------------------------------------- the server

def _connect(path: Path) -> socket.socket | None:
    """A connection to the server at ``path``; None where none listens (no socket file, or a dead server's)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None
    except OSError as e:
        s.close()
        raise Unavailable(f"cannot connect to the warm server at {path}: {e.strerror or e}") from None
    return s


def _tidy(folder: Path) -> None:
    """Remove what servers that are gone left behind (their log, lock, pid, refusal) once it is
    :data:`TIDY_AGE_S` old: the files of a key nobody asked for since (an edited checkout has a new key)."""
    now = time.time()
    for f in folder.iterdir():
        if f.suffix in (".log", ".lock", ".pid", ".refused") and not f.with_suffix(".sock").exists():
            try:
                if now - f.stat().st_mtime > TIDY_AGE_S:
                    f.unlink()
            except FileNotFoundError:
                pass  # tidied by another client


def _start(files: dict[str, Path], k: str) -> subprocess.Popen:
    """The server, detached: its own session, the root as its directory, its output in its log."""
    boot = ("# moe_hydra warm server\nimport json, sys; sys.path[:] = json.loads(sys.argv[1]); "
            "from moe_hydra.job.warm_server import main; main(sys.argv[2:])")
    args = [sys.executable, "-P", "-c", boot, json.dumps(import_path()), "--socket", str(files["sock"]),
            "--key", k, "--idle-s", str(idle_s()), "--origins", json.dumps(origins())]
    with open(files["log"], "wb") as log:
        return subprocess.Popen(args, cwd="/", stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


def connect() -> tuple[socket.socket, str]:
    """A connection to this process's server, and how it was found: ``warm`` (running) or ``warm_started`` (this
    call started it and waited for its imports).

    Raises:
        Unavailable: the server refuses this key, or could not be started (the reason, with its log's tail).
    """
    k = key()
    files = paths(k)
    if files["refused"].exists():
        raise Unavailable(files["refused"].read_text().strip())
    sock = _connect(files["sock"])
    if sock is not None:
        return sock, "warm"
    with open(files["lock"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the holder waits START_TIMEOUT_S at most
        sock = _connect(files["sock"])  # started while this one waited
        if sock is not None:
            return sock, "warm"
        files["sock"].unlink(missing_ok=True)  # a dead server's
        _tidy(files["sock"].parent)
        proc = _start(files, k)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            sock = _connect(files["sock"])
            if sock is not None:
                return sock, "warm_started"
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if files["refused"].exists():
                    raise Unavailable(files["refused"].read_text().strip())
                tail = files["log"].read_text(errors="replace").strip().splitlines()[-5:]
                raise Unavailable(f"the warm server did not start (exit code {proc.returncode}; "
                                  f"{files['log']}):\n    " + "\n    ".join(tail))
            time.sleep(0.05)


def _stdio(stdio: tuple[int, int, int]) -> tuple[list[int], list[int]]:
    """The three descriptors to pass (a closed one replaced by /dev/null), and those opened here to close."""
    fds, opened = [], []
    for fd in stdio:
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
    return fds, opened


Call = tuple[str, str, tuple, dict]  # module, function, args, kwargs


def submit(make: Callable[[str], Call], *, stdio: tuple[int, int, int] = (0, 1, 2), program: bool = False) -> Remote:
    """Send the call ``make(how)`` to this process's server (``how``: ``warm`` or ``warm_started``, as
    :func:`connect` found it), starting one if none runs; once more to a new server when the one found exits
    between the connection and the request (its idle timeout).

    ``stdio``: the descriptors the call's process takes as its 0, 1 and 2. ``program``: behave as ``python -m``
    would: an exception's traceback goes to that stderr as well (:attr:`Remote.returncode` 1).

    Raises:
        Unavailable: as :func:`connect`, or the server closed twice before taking a request.
    """
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED") or getattr(sys.stdout, "write_through", False))  # -u
    problem: Exception | None = None
    for _ in range(2):
        sock, how = connect()
        fds, opened = _stdio(stdio)
        request = {"call": make(how), "cwd": os.getcwd(), "env": dict(os.environ), "argv": list(sys.argv),
                   "path": list(sys.path), "program": program, "unbuffered": unbuffered}
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            send(sock, b"R", request, tuple(fds))
            _, pid, _ = receive(sock)
            sock.settimeout(None)
            return Remote(sock, how, pid)
        except (EOFError, ConnectionError, TimeoutError) as e:
            sock.close()
            problem = e
        finally:
            for fd in opened:
                os.close(fd)
    raise Unavailable(f"the warm server closed the connection before the request started ({problem})")


class Remote:
    """One request's process: ``pid``, ``how`` (``warm`` | ``warm_started``); :meth:`wait` for its outcome,
    :meth:`poll` and ``returncode`` as :class:`subprocess.Popen` has them."""

    def __init__(self, sock: socket.socket, how: str, pid: int):
        self.sock, self.how, self.pid = sock, how, pid
        self.returncode: int | None = None
        self._outcome: tuple[str, Any] | None = None

    def _read(self) -> None:
        try:
            _, outcome, _ = receive(self.sock)
        except (EOFError, ConnectionError) as e:
            why = f"the warm-started process {self.pid} ended without a reply ({e}): killed, or its server's group was"
            outcome = ("ended", why)
        self.sock.close()
        self._outcome = outcome
        self.returncode = {"ok": 0, "exit": outcome[1] if outcome[0] == "exit" else 0}.get(outcome[0], 1)

    def poll(self) -> int | None:
        """The return code once the outcome arrived (0 a value, 1 an exception, SystemExit's code), else None."""
        if self._outcome is None and select.select([self.sock], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, forward: tuple[signal.Signals, ...] = FORWARDED) -> Any:
        """The call's value; ``forward``: signals sent on to the process while waiting (main thread only).

        Raises:
            the call's exception, rebuilt (:func:`rebuild`); :class:`Ended` when no reply came.
        """
        previous = {}
        if forward and self._outcome is None:
            import threading

            if threading.current_thread() is threading.main_thread():
                def relay(signum: int, frame) -> None:
                    try:
                        os.kill(self.pid, signum)
                    except ProcessLookupError:
                        pass  # it has ended: its reply (or the end of the socket) is on the way

                previous = {sig: signal.signal(sig, relay) for sig in forward}
        try:
            if self._outcome is None:
                self._read()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        kind, payload = self._outcome
        if kind == "ok":
            return payload
        if kind == "exit":
            raise SystemExit(payload)
        if kind == "ended":
            raise Ended(payload)
        raise rebuild(payload)
