"""Where moe_hydra meets what it does not control: the directories it writes into, an install without torch, files
written for another command, Ctrl-C. Each case is refused (exit 2) or stopped (128 + n) with one message, no
traceback, and nothing of anyone else's lost."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_hydra.commands import COMMANDS
from moe_hydra.launch import directories
from tests.conftest import run_cli

# A planner-only install, as `pip install moe_hydra` leaves it: torch and Megatron-Core cannot be found (a finder put
# first on sys.path's meta path by a sitecustomize answers "no such module" for them).
NO_TORCH = '''import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "megatron"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NotInstalled())
'''


@pytest.fixture
def planner_only(tmp_path) -> dict[str, str]:
    site = tmp_path / "planner_only"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TORCH)
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def quiet(r: subprocess.CompletedProcess) -> bool:
    return "Traceback" not in r.stdout + r.stderr


# ----------------------------------------------------------------------------- run and sweep directories

def test_a_run_directory_another_command_holds_is_refused_and_left_as_it_was(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(f"hydra.run.dir={run_dir}", "stage=plan", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with open(run_dir / directories.RUN_LOCK, "a") as lock:  # what a running command holds
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = run_cli(f"hydra.run.dir={run_dir}", "stage=plan", cwd=tmp_path)  # the same command, even
    assert r.returncode == 2 and quiet(r), r.stderr[-2000:]
    assert f"another command is running in {run_dir}" in r.stderr and "hydra.run.dir=<dir>" in r.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # .hydra/ included


def test_a_run_directory_holds_one_command_and_the_same_command_again_replaces_its_outcome(tmp_path):
    args = [f"hydra.run.dir={tmp_path}/run", "stage=plan"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    plan = (tmp_path / "run" / "plan.json").read_text()
    r = run_cli(*args, "model=qwen3_30b_a3b", "hardware=h100_sxm", cwd=tmp_path)
    assert r.returncode == 2 and quiet(r), r.stderr[-2000:]
    assert "holds plan.json" in r.stderr and "of another command (stage=plan)" in r.stderr
    assert (tmp_path / "run" / "plan.json").read_text() == plan
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]


def test_time_named_directories_are_new_for_each_command_started_in_the_same_second(tmp_path):
    named = f"hydra.run.dir={tmp_path}/runs/" + "${now:%Y-%m-%d}"  # one per day: every command here shares the name
    made = []
    for _ in range(2):
        r = run_cli(named, "stage=plan", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        made.append(sorted(p.name for p in (tmp_path / "runs").iterdir()))
    day = made[0][0]
    assert made == [[day], [day, f"{day}_1"]]
    assert json.loads((tmp_path / "runs" / f"{day}_1" / "plan.json").read_text())["world_size"] == 1


def test_a_time_named_sweep_directory_is_new_for_each_sweep_and_its_points_land_there(tmp_path):
    named = f"hydra.sweep.dir={tmp_path}/sweeps/" + "${now:%Y-%m-%d}"
    for _ in range(2):
        r = run_cli(named, "stage=plan", "dispatcher=alltoall,allgather", "-m", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
    day = sorted(p.name for p in (tmp_path / "sweeps").iterdir())
    assert len(day) == 2 and day[1] == f"{day[0]}_1"
    for d in day:  # each sweep's points in its own directory, none in the other's
        assert sorted(p.name for p in (tmp_path / "sweeps" / d).iterdir() if p.name.isdigit()) == ["0", "1"]
        assert all((tmp_path / "sweeps" / d / n / "plan.json").is_file() for n in ("0", "1"))


def test_fresh_gives_each_caller_its_own_directory(tmp_path):
    got = [directories.fresh(tmp_path / "a" / "12-00-00", "hydra.run.dir") for _ in range(3)]
    assert [p.name for p in got] == ["12-00-00", "12-00-00_1", "12-00-00_2"] and all(p.is_dir() for p in got)


@pytest.mark.parametrize("key, extra", [("hydra.run.dir", []), ("hydra.sweep.dir", ["dispatcher=alltoall,allgather",
                                                                                    "-m"])])
def test_a_directory_that_is_a_file_is_refused_naming_it(tmp_path, key, extra):
    occupied = tmp_path / "occupied"
    occupied.write_text("someone's file\n")
    r = run_cli(f"{key}={occupied}", "stage=plan", *extra, cwd=tmp_path)
    assert r.returncode == 2 and quiet(r), r.stdout[-2000:] + r.stderr[-2000:]
    assert f"{occupied} is a file, not a directory" in r.stdout + r.stderr and f"{key}=<dir>" in r.stdout + r.stderr
    assert occupied.read_text() == "someone's file\n"


# ----------------------------------------------------------------------------- the planner-only install

def test_the_planner_only_install_plans_and_refuses_what_needs_torch_before_the_plan(tmp_path, planner_only):
    planned = run_cli(f"hydra.run.dir={tmp_path}/plan", "stage=plan", cwd=tmp_path, env=planner_only)
    assert planned.returncode == 0, planned.stderr[-2000:]
    for stage in ("run", "fit"):
        r = run_cli(f"hydra.run.dir={tmp_path}/{stage}", f"stage={stage}", "logger=none", cwd=tmp_path,
                    env=planner_only)
        assert r.returncode == 2 and quiet(r), r.stdout[-2000:] + r.stderr[-2000:]
        assert "[H09]" in r.stderr and "moe_hydra[train]" in r.stderr and "stage=plan" in r.stderr
        assert not (tmp_path / stage / "plan.json").exists() and "plan written" not in r.stdout + r.stderr


def test_a_torch_that_fails_to_import_is_refused_in_one_line(tmp_path):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text('raise ImportError("No module named torch")\n')
    r = run_cli(f"hydra.run.dir={tmp_path}/run", "logger=none", cwd=tmp_path, env={"PYTHONPATH": str(fake)})
    assert r.returncode == 2 and quiet(r), r.stdout[-3000:] + r.stderr[-3000:]
    assert "torch cannot be imported here" in r.stderr and "moe_hydra[train]" in r.stderr


def test_data_prepare_without_megatron_says_what_to_install(tmp_path, planner_only):
    (tmp_path / "a.txt").write_text("some text\n")
    r = subprocess.run([sys.executable, "-m", "moe_hydra.data", "prepare", "--out", str(tmp_path / "d"),
                        str(tmp_path / "a.txt")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **planner_only})
    assert r.returncode == 2 and quiet(r) and "moe_hydra[train]" in r.stderr, r.stderr
    assert not list(tmp_path.glob("d*"))


# ----------------------------------------------------------------------------- data prepare's prefix and files

def prepare(tmp_path: Path, out: str) -> subprocess.CompletedProcess:
    text = tmp_path / "in.txt"
    text.write_text("hello world\n\nsecond paragraph\n")
    return subprocess.run([sys.executable, "-m", "moe_hydra.data", "prepare", "--out", out, str(text)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("out", ["", " ", "{tmp}/dir/", "{tmp}", ".", "{tmp}/.."])
def test_data_prepare_refuses_an_out_that_is_not_a_prefix(tmp_path, out):
    before = sorted(p.name for p in tmp_path.iterdir())
    r = prepare(tmp_path, out.format(tmp=tmp_path))
    assert r.returncode == 2 and quiet(r), r.stderr
    assert "--out" in r.stderr and ("prefix" in r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({*before, "in.txt"})


def test_an_interrupted_prepare_leaves_the_old_dataset_whole(tmp_path, monkeypatch):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from moe_hydra.job import data

    (tmp_path / "old.txt").write_text("the old text\n")
    (tmp_path / "new.txt").write_text("a new, longer text\n" * 50)
    prefix = tmp_path / "ds" / "corpus"
    data.prepare([str(tmp_path / "old.txt")], str(prefix))
    old = {p.name: p.read_bytes() for p in prefix.parent.iterdir()}

    def ctrl_c(self, *args, **kwargs):  # halfway: the new .bin is open and has not been finalized
        raise KeyboardInterrupt

    monkeypatch.setattr(IndexedDatasetBuilder, "add_document", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        data.prepare([str(tmp_path / "new.txt")], str(prefix))
    assert {p.name: p.read_bytes() for p in prefix.parent.iterdir()} == old  # no partial file, the old one whole
    monkeypatch.undo()
    data.prepare([str(tmp_path / "new.txt")], str(prefix))
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["corpus.bin", "corpus.idx", "corpus.tokenizer.json"]
    assert (prefix.parent / "corpus.bin").stat().st_size > len(old["corpus.bin"])


# ----------------------------------------------------------------------------- Ctrl-C

def _catches(pid: int, sig: int) -> bool | None:
    """Whether process ``pid`` has its own handler for ``sig`` (Linux's /proc/<pid>/status SigCgt); None where that
    cannot be read (another system, or the process gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), None)
    return None if caught is None else bool(int(caught, 16) >> (sig - 1) & 1)


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_in_any_command_ends_it_quietly(tmp_path, name, signame):
    """SIGINT or SIGTERM while the command imports and starts (its modules, Hydra, the parsing): 130 / 143 with one
    line, or the command's own ending when it finished first; never a traceback, never a silent death by signal."""
    argv = {"run": ["stage=plan", f"hydra.run.dir={tmp_path}/run"], "sweep": ["status", str(tmp_path)],
            "export": ["megatron-lm", str(tmp_path)], "ingest": ["megatron-lm", "--", "--num-layers", "2"],
            "data": ["prepare", "--out", str(tmp_path / "d"), str(tmp_path / "missing.txt")]}.get(name, [str(tmp_path)])
    proc = subprocess.Popen([sys.executable, "-m", "moe_hydra" if name == "run" else f"moe_hydra.{name}", *argv],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
    # Before Python has started and imported moe_hydra no program can answer a signal (CI's load once stretched
    # that past 0.4 s: a death by SIGINT with nothing said); the package's handlers catch SIGTERM from its import.
    deadline = time.monotonic() + 30
    while proc.poll() is None and _catches(proc.pid, signal.SIGTERM) is False and time.monotonic() < deadline:
        time.sleep(0.01)
    sig = signal.Signals[signame]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in out + err, (name, err[-3000:])
    assert proc.returncode in (0, 1, 2, 128 + sig.value), (name, proc.returncode, err[-2000:])
    if proc.returncode == 128 + sig.value:
        said = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
        assert err.strip().splitlines()[-1].endswith(said), err[-500:]


@pytest.mark.parametrize("raised, code, said", [
    ("Terminated", 143, "moe_hydra.data: terminated (SIGTERM)"),
    ("KeyboardInterrupt", 130, "moe_hydra.data: interrupted"), (None, 1, "RecursionError: behind no signal")])
def test_an_error_a_signal_left_behind_ends_as_the_signal(tmp_path, raised, code, said):
    """A signal that lands inside an import can leave a half-initialized module whose next use fails on its own (CI:
    a SIGTERM in torch's import of numpy.linalg, then a RecursionError): the error raised while handling the
    signal is the signal's ending, one line and 130 / 143; the same error behind no signal is a failure with its
    traceback."""
    body = (f"    try:\n        raise {raised}\n    except {raised}:\n        raise RecursionError('after it')\n"
            if raised else "    raise RecursionError('behind no signal')\n")
    script = tmp_path / "cmd.py"
    script.write_text("from moe_hydra.commands import finish\nfrom moe_hydra.core.errors import Terminated\n\n\n"
                      f"def run():\n{body}\n\nfinish('data', run)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == code and r.stderr.strip().splitlines()[-1] == said, r.stderr[-2000:]
    assert ("Traceback" in r.stderr) == (raised is None)


@pytest.mark.parametrize("signame, code, said", [
    ("SIGTERM", 143, "moe_hydra.data: terminated (SIGTERM)"), ("SIGINT", 130, "moe_hydra.data: interrupted")])
def test_an_error_after_a_lost_signal_ends_as_the_signal(tmp_path, signame, code, said):
    """A signal whose exception the error after it no longer holds (CI: a SIGTERM in torch's import of numpy.linalg,
    then a RecursionError with the SIGTERM nowhere in its context) still ends the command as the signal: the
    command's handlers record it."""
    script = tmp_path / "cmd.py"
    script.write_text("import os, signal, time\nfrom moe_hydra.commands import finish\n\n\ndef run():\n"
                      f"    try:\n        os.kill(os.getpid(), signal.{signame}); time.sleep(5)\n"
                      "    except BaseException:\n        pass\n    raise RecursionError('the signal is lost')\n\n\n"
                      "finish('data', run)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == code and r.stderr.strip().splitlines()[-1] == said, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("argv, orig, command", [
    (["-m"], ["python", "-m", "moe_hydra", "stage=plan"], "run"),
    (["-m"], ["python", "-u", "-m", "moe_hydra.tune", "x"], "tune"),
    (["-m"], ["python", "-m", "moe_hydra.job.warm_server"], None),  # a job's process: Python's own handling
    (["-m"], ["python", "-m", "pytest"], None),
    (["/venv/bin/moe-hydra", "compare", "d"], ["python", "/venv/bin/moe-hydra", "compare", "d"], "compare"),
    (["/venv/bin/moe-hydra", "stage=plan"], ["python", "/venv/bin/moe-hydra", "stage=plan"], "run"),
    (["/x/pytest"], ["python", "/x/pytest"], None)])
def test_a_command_stops_quietly_from_its_first_import(monkeypatch, argv, orig, command):
    """A command's signal handling starts with the package's import (a SIGINT in ``import signal`` under CI's load
    once gave a traceback): for ``python -m moe_hydra[.<command>]`` and ``moe-hydra``, never for another module,
    a library import or a test."""
    import moe_hydra

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig)
    assert moe_hydra._starting_command() == command


# ----------------------------------------------------------------------------- like with like

def test_repeat_auto_over_arms_of_different_work_is_refused_before_a_round(tmp_path):
    """The README's own example once decided "equivalent" between 512 and 640 tokens a step."""
    r = run_cli(f"hydra.sweep.dir={tmp_path}/ab", "logger=none", "train.micro_batch_size=4,5", "repeat=auto",
                "compare.max_repeats=2", cwd=tmp_path)
    assert r.returncode == 2 and quiet(r), r.stdout[-2000:] + r.stderr[-2000:]
    assert "train different work a step" in r.stderr and "train.global_batch_size=20" in r.stderr
    assert sorted(p.name for p in (tmp_path / "ab").iterdir()) == [".sweep.lock", "multirun.yaml"]  # no point, no round


# ----------------------------------------------------------------------------- files written for another command

# Writes that are not atomic, each with why that is right: files only their own process reads, or logs.
NOT_ATOMIC = {
    "moe_hydra/job/fit.py": "spec.json and the rank logs: a private work directory its own ranks read",
    "moe_hydra/job/warm.py": "the warm server's log, appended as it runs",
    "moe_hydra/job/warm_server.py": "its pid and refusal files, in its private socket directory",
    "moe_hydra/job/data.py": "the tokenizer description, written into the temporary files renamed at the end",
    "moe_hydra/launch/local.py": "a point's spec, written before the process that reads it starts",
}


def test_every_file_written_for_another_command_is_written_atomically():
    """No write_text / write_bytes / open(..., "w") outside core.io (temporary file and rename) but the ones listed
    with their reason: a file another command reads (sweep.json, results.json, plan.json, the layout search's
    meshes and run_top.sh, exports, compare.md, noise.json, the step model's fit) is never half-written."""
    import ast

    root = Path(__file__).resolve().parents[1]
    found: dict[str, list[int]] = {}
    for path in sorted((root / "moe_hydra").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ("moe_hydra/core/io.py",) or rel.startswith("moe_hydra/testing/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            mode = next((a.value for a in node.args[1:2] if isinstance(a, ast.Constant)), None) if name == "open" \
                else None
            ours = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "io"  # io.write_text
            if (name in ("write_text", "write_bytes") and not ours) or (name == "open" and isinstance(mode, str)
                                                                          and "w" in mode):
                found.setdefault(rel, []).append(node.lineno)
    assert set(found) <= set(NOT_ATOMIC), {k: v for k, v in found.items() if k not in NOT_ATOMIC}


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from moe_hydra.core import io

    target = tmp_path / "sweep.json"
    io.write_json({"points": [1]}, target)
    real = os.replace

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        io.write_json({"points": [1, 2]}, target)
    monkeypatch.setattr(os, "replace", real)
    assert json.loads(target.read_text()) == {"points": [1]} and [p.name for p in tmp_path.iterdir()] == ["sweep.json"]


# ----------------------------------------------------------------------------- the commands that follow a sweep

def test_sweep_wait_on_a_local_multirun_reports_its_points(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli("stage=plan", "dispatcher=alltoall,allgather", f"hydra.sweep.dir={sweep}", "-m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    for verb in ("status", "wait"):  # wait said "is this a Slurm sweep directory?" (exit 2) where status worked
        w = subprocess.run([sys.executable, "-m", "moe_hydra.sweep", verb, str(sweep)], capture_output=True,
                           text=True, timeout=120)
        assert w.returncode == 0 and quiet(w), w.stderr[-2000:]
        assert w.stdout.count("PLANNED") >= 2, w.stdout


def test_a_failing_scancel_is_one_line_naming_its_message(tmp_path, monkeypatch, capsys):
    from moe_hydra.commands import run_command
    from moe_hydra.launch import follow, slurm_jobs
    from moe_hydra.launch.ledger import Point

    scancel = tmp_path / "scancel"
    scancel.write_text("#!/bin/sh\necho 'scancel: error: Kill job error on job id 4242: Access/permission denied' >&2\n"
                       "exit 1\n")
    scancel.chmod(0o755)
    monkeypatch.setattr(follow, "status", lambda d: [Point(num=0, overrides=[], dir=str(tmp_path), state="RUNNING",
                                                           slurm_job_id="4242")])
    monkeypatch.setattr(slurm_jobs, "job_class", lambda: type("Job", (), {"_cancel_command": str(scancel)}))
    assert run_command("sweep", ["cancel", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "Access/permission denied" in err and "exited 1" in err


def test_ingest_names_every_refused_flag_at_once(capsys):
    from moe_hydra.commands import run_command

    code = run_command("ingest", ["megatron-lm", "--", "pretrain_gpt.py", "--num-layers", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    missing = ("--hidden-size", "--num-attention-heads", "--micro-batch-size", "--global-batch-size", "--seq-length",
               "--train-iters")
    assert all(f"no {flag}" in err for flag in missing), err  # one call says them all (it took four round trips)


@pytest.mark.parametrize("body, code, said", [
    ("raise SystemExit(2)", 2, None),  # argparse's malformed command line
    ("os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)", 143, "terminated (SIGTERM)"),
    ("signal.signal(signal.SIGTERM, previous); os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)", 143,
     "terminated (SIGTERM)"),
])
def test_a_command_ends_with_its_code_even_when_a_signal_comes_as_it_ends(body, code, said):
    """What a command's process ends with (commands.finish): argparse's exit keeps its code, and a SIGTERM that comes
    once the command has restored the handler it found (the ``previous`` of run_command) is still 143 with one line,
    never a death by signal while the interpreter shuts down (a CI run saw -15 from regress's usage error)."""
    script = ("import os, signal, sys, time\nfrom moe_hydra.commands import finish\n"
              "previous = None\n"
              "def run():\n    global previous\n    previous = signal.getsignal(signal.SIGTERM)\n"
              f"    {body}\n"
              "finish('x', run)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and (said is None or r.stderr.strip().endswith(said)), r.stderr
