"""Warm starts (moe_hydra.job.warm): ranks forked from a server that imported torch and Megatron-Core already train
exactly as spawned ones do, stop on a signal as they do, fail cleanly when the server dies, and never make the
command import torch; a server is only reused by clients it is equivalent for (the key)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from moe_hydra.job import warm, warm_server
from moe_hydra.launch import local

SHORT = ("logger=none", "train.train_iters=4", "contract.warmup_steps=1", "contract.window=[2,4]")
LONG = ("logger=none", "contract.warmup_steps=1", "contract.window=[2,400]")
TWO_RANKS = ("hardware.devices_per_node=2", "expert_mesh=ep2")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **extra}


def _run(tmp_path: Path, name: str, *args: str, **env: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={tmp_path}/{name}", *args], cwd=tmp_path,
                       env=_env(**env), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / name / "results.json").read_text())


@pytest.fixture
def private_dir():
    """A socket directory of this test's own (short: socket paths are limited to 107 bytes); its servers are
    stopped at the end."""
    path = Path(tempfile.mkdtemp(prefix="mhw"))
    yield path
    for pid_file in path.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ the same training

@pytest.mark.slow
@pytest.mark.parametrize("args", [(), TWO_RANKS], ids=["one_rank", "two_ranks_ep2"])
def test_warm_and_spawned_ranks_train_bit_identically(tmp_path, args):
    warm_res = _run(tmp_path, "warm", *SHORT, *args, MOE_HYDRA_WARM="1")
    cold_res = _run(tmp_path, "cold", *SHORT, *args, MOE_HYDRA_WARM="0")
    assert warm_res["startup"]["start"] in ("warm", "warm_started") and cold_res["startup"]["start"] == "spawn"
    assert warm_res["loss"]["per_step"] == cold_res["loss"]["per_step"]  # exactly: the same bits
    assert warm_res["grad_norms"] == cold_res["grad_norms"]
    assert warm_res["evidence"] == cold_res["evidence"]
    for res in (warm_res, cold_res):
        assert res["startup"]["from"] == "command" and res["startup"]["seconds"] > 0
        assert "CLOCK_BOOTTIME" in res["startup"]["counter"]
    # the import warnings a spawned rank logs, a forked one logs too (replayed from the server's imports)
    warnings_of = {name: {line for line in (tmp_path / name / "ranks" / "warnings.rank0.log").read_text().splitlines()
                          if "Warning:" in line} for name in ("warm", "cold")}
    assert warnings_of["warm"] == warnings_of["cold"]


@pytest.mark.slow
def test_the_command_imports_no_torch_on_the_warm_path(tmp_path):
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'megatron'}), file=sys.__stderr__))\n"
            f"sys.argv = ['moe_hydra', 'hydra.run.dir={tmp_path}/run', *{list(SHORT)!r}]\n"
            "runpy.run_module('moe_hydra', run_name='__main__', alter_sys=True)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(MOE_HYDRA_WARM="1"), capture_output=True,
                       text=True, timeout=300)
    assert "LOADED []" in r.stderr, r.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["status"] == "ok" and res["startup"]["start"] in ("warm", "warm_started")


# ------------------------------------------------------------------ signals and deaths

def _start_long(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.Popen, Path]:
    """A long warm run; returns once step 5's metric line is out."""
    log = tmp_path / "out.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={tmp_path}/run", *LONG, *args],
                            cwd=tmp_path, env=_env(MOE_HYDRA_WARM="1", **env), stdout=out, stderr=subprocess.STDOUT)
    out.close()
    deadline = time.monotonic() + 240
    while (not re.search(r"^step\s+5\s+loss", log.read_text(), re.M) and time.monotonic() < deadline
           and proc.poll() is None):
        time.sleep(0.2)
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc, log


def _results(tmp_path: Path, wait_s: float = 0) -> dict | None:
    deadline = time.monotonic() + wait_s
    while True:
        path = tmp_path / "run" / "results.json"
        if path.exists():
            return json.loads(path.read_text())
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("signame,status", [("SIGINT", "interrupted"), ("SIGTERM", "terminated")])
def test_a_signal_to_the_command_stops_warm_ranks_after_recording(tmp_path, signame, status):
    proc, log = _start_long(tmp_path, *TWO_RANKS)
    sig = signal.Signals[signame]
    proc.send_signal(sig)  # the command alone: the ranks are in the server's session, no terminal reaches them
    assert proc.wait(timeout=120) == 128 + sig.value, log.read_text()[-3000:]
    res = _results(tmp_path)
    assert res["status"] == status and res["signal"] == signame and res["startup"]["start"].startswith("warm")
    assert 5 <= res["steps"] == res["stopped_at_step"] == len(res["step_times_ms"]) < 400
    assert "Traceback" not in log.read_text() and f"stopped by {signame}" in log.read_text()


@pytest.mark.slow
def test_a_killed_command_still_gets_its_steps_recorded(tmp_path):
    """The command dies without a word (SIGKILL): its end of the socket closes, and the warm process stops the job
    as SIGTERM would."""
    proc, log = _start_long(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    res = _results(tmp_path, wait_s=60)
    assert res is not None, log.read_text()[-3000:]
    assert res["status"] == "terminated" and res["signal"] == "SIGTERM" and 5 <= res["steps"] < 400


@pytest.mark.slow
def test_a_killed_warm_server_fails_the_run_cleanly_and_the_next_run_starts_a_new_one(tmp_path, private_dir):
    env = {warm.DIR: str(private_dir), warm.IDLE: "3"}
    proc, log = _start_long(tmp_path, **env)
    (pid_file,) = private_dir.glob("*.pid")
    server = int(pid_file.read_text())
    os.killpg(server, signal.SIGKILL)  # the server, its request's process and the ranks: no reply will come
    assert proc.wait(timeout=60) == 1, log.read_text()[-3000:]
    text = log.read_text()
    assert "ended without a reply" in text and "Traceback" not in text
    # the dead server's socket is left behind: the next run replaces it with a server of its own
    res = _run(tmp_path, "next", *SHORT, MOE_HYDRA_WARM="1", **env)
    assert res["status"] == "ok" and res["startup"]["start"] == "warm_started"
    new = int(pid_file.read_text())
    assert new != server
    deadline = time.monotonic() + 30  # idle for 3 s: it exits by itself
    while _alive(new) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(new) and not list(private_dir.glob("*.sock"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of this process (the server's parent is the command, which exited) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ the key and the wire

def test_an_edited_source_or_an_import_time_variable_changes_the_key(tmp_path, monkeypatch):
    package = tmp_path / "moe_hydra"
    (package / "job").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "job" / "train.py").write_text("x = 1\n")
    fake = type(sys)("moe_hydra")
    fake.__file__, fake.__path__ = str(package / "__init__.py"), [str(package)]
    monkeypatch.setattr(warm, "moe_hydra", fake)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = warm.key()
    assert warm.key() == before  # deterministic
    monkeypatch.setenv(warm.IDLE, "5")
    monkeypatch.setenv(warm.DIR, str(tmp_path))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    assert warm.key() == before  # per request, or the warm start's own settings
    (package / "job" / "train.py").write_text("x = 2\n")  # same size: the modification time tells it
    os.utime(package / "job" / "train.py", ns=(1, 1))
    edited = warm.key()
    assert edited != before
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert warm.key() not in (before, edited)
    assert warm.paths(edited)["sock"] != warm.paths(before)["sock"]  # another server, never the stale one


def test_the_socket_directory_must_be_private(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    monkeypatch.setenv(warm.DIR, str(shared))
    with pytest.raises(warm.Unavailable, match="not a private directory"):
        warm.directory()
    monkeypatch.setenv(warm.DIR, str(tmp_path / "new"))
    assert warm.directory().stat().st_mode & 0o777 == 0o700


def test_the_launchers_exceptions_come_back_whole():
    failed = local.JobFailed(1, "failing on purpose", Path("/x/ranks"))
    back = warm.rebuild(warm_server.describe(failed))
    assert type(back) is local.JobFailed and str(back) == str(failed)
    assert (back.rank, back.error, back.logs) == (1, "failing on purpose", Path("/x/ranks"))
    stopped = warm.rebuild(warm_server.describe(local.JobStopped("SIGUSR2", Path("/x/ranks"))))
    assert type(stopped) is local.JobStopped and (stopped.signame, stopped.code) == ("SIGUSR2", 140)

    class Foreign(Exception):  # not moe_hydra's, nor a built-in: named, with its remote traceback
        pass

    other = warm.rebuild(warm_server.describe(Foreign("boom")))
    assert type(other) is warm.RemoteError and "Foreign: boom" in str(other)


def test_the_default_is_on_for_cpu_jobs_and_the_environment_decides_first(monkeypatch):
    monkeypatch.delenv(warm.SWITCH, raising=False)
    monkeypatch.setattr(warm, "gpu_machine", lambda: False)
    assert warm.wanted(None, gpu=False) and not warm.wanted(None, gpu=True)
    assert warm.wanted(True, gpu=True) and not warm.wanted(False, gpu=False)
    monkeypatch.setattr(warm, "gpu_machine", lambda: True)
    assert not warm.wanted(None, gpu=False)  # a CPU job on a GPU machine may still see CUDA
    monkeypatch.setenv(warm.SWITCH, "0")
    assert not warm.wanted(True, gpu=False)
    monkeypatch.setenv(warm.SWITCH, "1")
    assert warm.wanted(False, gpu=True)
