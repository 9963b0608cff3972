"""Hardening, end to end in a subprocess (all stage=plan): one sweep per directory, one set of exit codes
(0 done, 1 a job failed, 2 bad input), invalid sweep points skipped, ``sweep status`` of a local multirun, output
files that follow the umask."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.core import io
from moe_hydra.launch.points import LOCK_FILE
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def _files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and modification time."""
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _status(sweep_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_hydra.sweep", "status", str(sweep_dir)],
                          capture_output=True, text=True, timeout=120, check=False)


# ----------------------------------------------------------------------------- one sweep per directory

def test_a_second_sweep_into_a_used_directory_is_refused_and_the_first_resumes(cli, tmp_path):
    first = ["stage=plan", "dispatcher=alltoall,allgather", "-m"]
    assert cli(*first).returncode == 0
    before = _files(tmp_path / "multi")
    r = cli("stage=plan", "model.moe_router_topk=1,2", "-m")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "holds another sweep (stage=plan dispatcher=alltoall,allgather)" in r.stderr
    assert "hydra.sweep.dir=<dir>" in r.stderr
    assert _files(tmp_path / "multi") == before  # not one byte of the first sweep changed
    r = cli(*first)  # the same sweep again: resumed
    assert r.returncode == 0, r.stderr
    plans = [json.loads(p.read_text()) for p in sorted((tmp_path / "multi").glob("*/plan.json"))]
    assert [p["swept"] for p in plans] == [["dispatcher"], ["dispatcher"]]


def test_a_sweep_started_while_another_holds_the_directory_is_refused(cli, tmp_path):
    sweep_dir = tmp_path / "multi"
    sweep_dir.mkdir()
    with open(sweep_dir / LOCK_FILE, "a") as lock:  # a sweep that runs there now
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = cli("stage=plan", "dispatcher=alltoall,allgather", "-m")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert f"another sweep is running in {sweep_dir}" in r.stderr and "hydra.sweep.dir=<dir>" in r.stderr
    assert [p.name for p in sweep_dir.iterdir()] == [LOCK_FILE]  # no multirun.yaml, no point


def test_a_point_run_again_leaves_no_stale_outcome(cli, tmp_path):
    args = ["stage=plan", "dispatcher=alltoall,allgather", "-m"]
    assert cli(*args).returncode == 0
    # what an earlier run of point 0 could have left: a refusal
    io.write_json({"stage": "plan", "status": "invalid", "violations": [
        {"rule": "L11", "message": "stale", "fields": {}, "fix": ""}]}, tmp_path / "multi" / "0" / "violations.json")
    assert cli(*args).returncode == 0
    assert not (tmp_path / "multi" / "0" / "violations.json").exists()
    st = _status(tmp_path / "multi")
    assert st.returncode == 0 and "stale" not in st.stdout and st.stdout.count("PLANNED") == 2


# ----------------------------------------------------------------------------- exit codes

def test_an_override_hydra_cannot_read_exits_2_naming_it(cli, tmp_path):
    r = cli("stage=plan", "train.micro_batch_size=[1")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "cannot read the override 'train.micro_batch_size=[1'" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sweep", [(), ("-m",)])
def test_a_value_of_the_wrong_type_exits_2_without_traceback(cli, tmp_path, sweep):
    r = cli("stage=plan", "train.micro_batch_size=abc", *sweep)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "train.micro_batch_size=abc" in r.stderr and "could not be converted to Integer" in r.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "multi").exists()


@pytest.mark.parametrize("overrides,code", [
    # the refused value is read when the schema's objects are built: refused, naming its key
    (("~model",), 2), (("contract.window=[]",), 2), (("parallel.pipeline_model_parallel_layout=${env:HOME}",), 2),
    # overridden again: the typed text of the first is never resolved (the app reads the overrides as text)
    (("model.add_qkv_bias=${env:HOME}", "model.add_qkv_bias=true"), 0),
])
def test_values_omegaconf_cannot_build_are_refused_naming_the_key(cli, overrides, code):
    r = cli("stage=plan", *overrides)
    assert r.returncode == code and "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    if code:
        key = overrides[0].lstrip("~").split("=")[0]
        assert f"{key}" in r.stderr and "nothing was launched" in r.stderr.lower()


def test_help_lists_the_exit_codes(cli):
    r = cli("--help")
    assert r.returncode == 0
    assert "== Exit codes ==" in r.stdout and "1  a job started and failed" in r.stdout and "2  bad input" in r.stdout


# ----------------------------------------------------------------------------- invalid points skipped

def test_a_point_hydra_cannot_compose_is_skipped_and_the_rest_run(cli, tmp_path):
    r = cli("stage=plan", "train.micro_batch_size=abc,1,0", "-m")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "#0 stage=plan train.micro_batch_size=abc: Hydra cannot compose this point" in r.stderr
    assert "2 of 3 points did not complete" in r.stderr
    assert "#0 stage=plan train.micro_batch_size=abc (refused)" in r.stderr
    assert "#2 stage=plan train.micro_batch_size=0 (refused)" in r.stderr
    sweep_dir = tmp_path / "multi"
    assert not (sweep_dir / "0").exists()  # never launched: its number stays its own
    assert json.loads((sweep_dir / "1" / "plan.json").read_text())["batch"]["micro_batch_size"] == 1
    assert json.loads((sweep_dir / "2" / "violations.json").read_text())["violations"][0]["rule"] == "S02"


def test_refused_sizes_in_a_sweep_end_with_the_summary(cli, tmp_path):
    r = cli("stage=plan", "parallel.expert_model_parallel_size=1,0,2,3", "-m")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "3 of 4 points did not complete" in r.stderr and "[S02] parallel.expert_model_parallel_size" in r.stderr
    assert (tmp_path / "multi" / "0" / "plan.json").exists()
    assert {p.parent.name for p in (tmp_path / "multi").glob("*/violations.json")} == {"1", "2", "3"}


@pytest.mark.parametrize("search", [(), ("hydra/sweeper=layout", "-m")])
def test_sizes_refused_stop_before_the_layout_rules(cli, search):
    r = cli("stage=plan", "hardware.nodes=0", *search)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "[S02] hardware.nodes" in r.stderr and "[L0" not in r.stderr  # no world-size rule on a world of 0


# ----------------------------------------------------------------------------- where a sweep goes

def test_an_experiment_that_sweeps_honours_the_run_directory(tmp_path):
    r = run_cli("experiment=dispatcher_ab", "stage=plan", f"hydra.run.dir={tmp_path}/mine", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plans = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "mine").glob("*/plan.json")}
    assert sorted(plans) == ["0", "1"] and {p["parallel"]["expert_model_parallel_size"] for p in plans.values()} == {2}
    assert not (tmp_path / "outputs").exists()


def test_sweep_status_reads_a_local_multirun(cli, tmp_path):
    r = cli("stage=plan", "parallel.expert_model_parallel_size=1,3", "-m")
    assert r.returncode == 2
    assert not (tmp_path / "multi" / "sweep.json").exists()
    st = _status(tmp_path / "multi")
    assert st.returncode == 1, st.stderr
    assert "PLANNED" in st.stdout and "INVALID" in st.stdout and "[L11] 8 experts do not split" in st.stdout
    assert "1 of 2 points complete" in st.stdout


# ----------------------------------------------------------------------------- file modes

def test_output_files_follow_the_umask(cli, tmp_path):
    old = os.umask(0o022)  # the commands inherit it
    try:
        assert cli("stage=plan").returncode == 0
        assert run_cli("stage=plan", "hardware.nodes=0", f"hydra.run.dir={tmp_path}/refused", cwd=tmp_path).returncode == 2
    finally:
        os.umask(old)
    written = [tmp_path / "run" / name for name in ("plan.json", "env.json", ".hydra/config.yaml")]
    for path in [*written, tmp_path / "refused" / "violations.json"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path  # as Hydra's own .hydra/config.yaml
    assert not list(tmp_path.rglob("*.tmp"))


def test_write_json_under_a_stricter_umask(tmp_path):
    old = os.umask(0o027)
    try:
        io.write_json({"a": 1}, tmp_path / "x.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o640
    assert io.read_json(tmp_path / "x.json") == {"a": 1}
