"""The warm server: imports torch, Megatron-Core and the job's modules once, then forks a process per request.

Started by :func:`moe_hydra.job.warm.connect` (never by hand) as ``python -P -c <boot> PATH --socket S --key K
--idle-s N --origins O``; the client's module docstring says what a request is and when a server is reused.

**The imports** (:data:`PRELOAD`) are what a rank and a ``stage=fit`` build import: torch, torch's elastic
launcher, Megatron-Core's model, layer specs, parallel state, optimizer, DDP, pipeline schedules, and moe_hydra's
job. Their warnings are kept (:func:`replay_warnings` writes them into a rank's ``ranks/warnings.rank<N>.log``,
where a fresh rank's own imports would have put them). Nothing may touch CUDA: the imports run with
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (``torch.cuda.is_available`` asks NVML instead of creating a context), and a
server that finds CUDA initialised afterwards refuses to serve, as it does when its imports started a thread
that a forked process would lack (torch's OpenMP pool; OpenBLAS's, started by numpy, is rebuilt after a fork) or
resolved a package elsewhere than its client (``--origins``). A refusal is written to ``<key>.refused`` and the
clients of that key start cold.

**A request's process** closes the listening socket, takes the client's streams, directory, environment,
``sys.argv`` and ``sys.path``, replies with its pid and runs the call. It watches its connection (SIGIO on the
socket): when the client goes away, it raises SIGTERM in itself, which stops a job as a signal to the command
would. Its descendants (a job's ranks) close the connection when they are forked, so the client sees its end when
this process ends. ``ru_maxrss`` of a forked process starts at the memory it inherited, not at the server's peak
while importing: :func:`peak_rss_kib` counts that peak, as a fresh process's figure does. The server does not
``gc.freeze`` its imports: a forked rank's garbage collector walks what a fresh rank's does, so its steps cost the
same.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import io
import json
import os
import pickle
import resource
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from moe_hydra.core.errors import EXIT_FAILED
from moe_hydra.job import warm

# numpy first: its OpenBLAS starts its threads at import, and rebuilds them after a fork (pthread_atfork)
PRELOAD = (
    "numpy",
    "torch",
    "torch.distributed",
    "torch.distributed.elastic.multiprocessing",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.distributed.launcher.api",
    "torch.testing._internal.distributed.fake_pg",
    "megatron.core",
    "megatron.core.parallel_state",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.pipeline_parallel",
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.tensor_parallel.random",
    "megatron.core.transformer.module",
    "megatron.core.transformer.moe.moe_layer",
    "megatron.core.transformer.transformer_config",
    "megatron.core.transformer.enums",
    "megatron.core.fusions.fused_bias_geglu",
    "omegaconf",
    "rich.console",
    "rich.progress",
    "rich.table",
    "moe_hydra.job.train",
    "moe_hydra.job.compat",
    "moe_hydra.job.mcore_args",
    "moe_hydra.job.data",
    "moe_hydra.job.weights",
    "moe_hydra.job.profile",
    "moe_hydra.job.telemetry",
    "moe_hydra.job.tracking",
    "moe_hydra.job.built",
    "moe_hydra.job.fit",
)

SOURCES_CHECK_S = 10  # how often an idle server looks for edited sources (it then exits: nobody will ask for it)
_preloaded: list[warnings.WarningMessage] = []  # the imports' warnings, kept for the forked processes
_preload_peak_kib = 0  # the server's ru_maxrss after its imports (0: this process is no server's)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; what makes this process unfit to fork ranks from (empty when nothing does)."""
    global _preload_peak_kib
    nvml = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        with warnings.catch_warnings(record=True) as caught:
            importlib.import_module(PRELOAD[0])
            threads = _native_threads()
            for name in PRELOAD[1:]:
                importlib.import_module(name)
    finally:
        if nvml is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = nvml
    _preloaded[:] = caught
    _preload_peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    problems = []
    import torch

    if torch.cuda.is_initialized():
        problems.append("CUDA was initialised by the imports: a forked rank could not use it")
    if threading.active_count() > 1 or _native_threads() > threads:
        problems.append(f"the imports started threads ({_native_threads() - threads} native, "
                        f"{threading.active_count() - 1} Python) that forked ranks would lack")
    return problems


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def replay_warnings() -> None:
    """Show the server's import warnings again in this process (a rank, after it routed warnings to its file);
    nothing in a process that imported the job itself."""
    for w in _preloaded:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno, None, w.line)


def peak_rss_kib() -> int:
    """This process's peak resident set size, KiB, as a fresh process's ``ru_maxrss`` gives it: a process forked
    from the server counts the server's peak while importing, which its own ``ru_maxrss`` leaves out."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _preload_peak_kib)


# ----------------------------------------------------------------------------- serving

class _Server:
    def __init__(self, path: Path, idle_s: float):
        self.path, self.idle_s = path, idle_s
        self.children: set[int] = set()
        self.stopping = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.inode = os.stat(path).st_ino

    def ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except FileNotFoundError:
            return False

    def reap(self) -> None:
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def serve(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        sources, checked = warm.sources(), time.monotonic()
        last = time.monotonic()
        while not self.stopping:
            ready, _, _ = select.select([self.listener], [], [], 1.0)
            self.reap()
            if ready:
                self._accept()
            if ready or self.children:
                last = time.monotonic()
            if not self.ours():
                print(f"moe_hydra.warm_server: {self.path} was removed or replaced; exiting", flush=True)
                return
            if time.monotonic() - last > self.idle_s:
                print(f"moe_hydra.warm_server: idle for {self.idle_s:g} s; exiting", flush=True)
                break
            if time.monotonic() - checked > SOURCES_CHECK_S:  # an edited checkout: its clients have a new key
                checked = time.monotonic()
                if warm.sources() != sources:
                    print("moe_hydra.warm_server: moe_hydra's sources changed; exiting", flush=True)
                    break
        self.path.unlink(missing_ok=True)  # ours: no new client connects
        self.listener.setblocking(False)
        while True:  # those that connected before the unlink are served
            try:
                self._accept()
            except BlockingIOError:
                return

    def _stop(self, signum: int, frame) -> None:
        self.stopping = True

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.setblocking(True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _request(conn, self.listener)  # never returns
        conn.close()
        self.children.add(pid)


def _request(conn: socket.socket, listener: socket.socket) -> None:
    """A request's process: take the client's world, reply with the pid, run the call, reply with its outcome."""
    code = 0
    try:
        listener.close()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.settimeout(warm.HANDSHAKE_TIMEOUT_S)
        try:
            _, req, fds = warm.receive(conn, max_fds=3)
        except (EOFError, OSError):  # the client went away before its request: nothing to run
            os._exit(1)
        conn.settimeout(None)
        _take_world(req, fds)
        warm.send(conn, b"P", os.getpid())
        _watch(conn)
        outcome = _run(req)
    except BaseException:  # noqa: BLE001 - the request itself failed (any way): nothing to reply to
        traceback.print_exc()
        os._exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the client closes after the reply: no stop now
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    try:
        warm.send(conn, b"O", outcome)
    except OSError:
        code = 1  # the client went away; what the call wrote is on disk
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing left to save
    os._exit(code)


def _take_world(req: dict[str, Any], fds: list[int]) -> None:
    """The client's standard streams as 0/1/2 (Python's as a fresh process opens them), directory, environment,
    argv and import path."""
    if len(fds) != 3:
        raise RuntimeError(f"a request carries 3 file descriptors, not {len(fds)}")
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv[:] = req["argv"]
    sys.path[:] = req["path"]
    unbuffered = req["unbuffered"]
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                                 encoding=sys.stdin.encoding, errors=sys.stdin.errors)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "wb", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding,
                                  errors=old.errors, write_through=unbuffered,
                                  line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _watch(conn: socket.socket) -> None:
    """SIGTERM to this process when the client goes away: the socket signals (SIGIO) when it turns readable,
    and a client sends nothing after its request, so readable is its end. Forked descendants close it."""
    fd = conn.fileno()

    def ended(signum: int, frame) -> None:
        try:
            if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b"":
                return
        except BlockingIOError:
            return
        except OSError:
            pass  # reset by the peer: gone too
        signal.signal(signal.SIGIO, signal.SIG_IGN)
        signal.raise_signal(signal.SIGTERM)

    closed = []

    def close_in_child() -> None:
        if not closed:
            closed.append(True)
            signal.signal(signal.SIGIO, signal.SIG_DFL)
            try:
                os.close(conn.detach())
            except OSError:
                pass  # closed already
    signal.signal(signal.SIGIO, ended)
    os.register_at_fork(after_in_child=close_in_child)
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    ended(signal.SIGIO, None)  # gone already


def _run(req: dict[str, Any]) -> tuple[str, Any]:
    """The call's outcome: ("ok", value) | ("exit", code) | ("raise", the exception's description)."""
    module, function, args, kwargs = req["call"]
    try:
        value = getattr(importlib.import_module(module), function)(*args, **kwargs)
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)  # an unpicklable value is an error, here
        return "ok", value
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        return "exit", code
    except BaseException as e:  # noqa: BLE001 - every outcome goes back, KeyboardInterrupt too
        if req["program"]:
            traceback.print_exc()
        return "raise", describe(e)


def describe(e: BaseException) -> dict[str, Any]:
    """An exception as data that any client can read (:func:`moe_hydra.job.warm.rebuild`)."""
    attrs = {k: v for k, v in getattr(e, "__dict__", {}).items() if _plain(v)}
    return {"module": type(e).__module__, "qualname": type(e).__qualname__, "message": str(e),
            "args": e.args if _plain(e.args) else (str(e),), "attrs": attrs,
            "traceback": "".join(traceback.format_exception(e))[-4000:]}


def _plain(x: Any) -> bool:
    """Data any client unpickles without importing a module (torch's objects stay here)."""
    if x is None or isinstance(x, (str, int, float, bool, Path)):
        return True
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    if isinstance(x, dict):
        return all(_plain(k) and _plain(v) for k, v in x.items())
    return False


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="moe_hydra.job.warm_server")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--idle-s", type=float, required=True)
    parser.add_argument("--origins", required=True)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        problems = preload()
    except ImportError as e:  # a planner-only or broken install: the client says what to install
        print(f"moe_hydra.warm_server: cannot import the job's packages: {e}", flush=True)
        sys.exit(EXIT_FAILED)
    found = warm.origins()
    if found != json.loads(args.origins):
        problems.append(f"packages resolve elsewhere here than in the client: {found} != {args.origins}")
    if problems:
        refusal = "the warm server refuses to serve: " + "; ".join(problems)
        args.socket.with_suffix(".refused").write_text(refusal + "\n")
        print(refusal, flush=True)
        sys.exit(EXIT_FAILED)
    server = _Server(args.socket, args.idle_s)
    pid_file = args.socket.with_suffix(".pid")
    pid_file.write_text(f"{os.getpid()}\n")
    print(f"moe_hydra.warm_server: pid {os.getpid()}, key {args.key[:16]}, imports {time.monotonic() - t0:.1f} s, "
          f"idle timeout {args.idle_s:g} s, {args.socket}", flush=True)
    try:
        server.serve()
    finally:
        if pid_file.read_text().strip() == str(os.getpid()):  # not a successor's
            pid_file.unlink()
