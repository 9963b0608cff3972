"""Golden values: a run kept as a baseline file, later runs judged against it (compare --against)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from moe_hydra.analysis import baseline
from moe_hydra.analysis.runs import Run
from moe_hydra.core import steady
from moe_hydra.core.errors import EXIT_REGRESSED
from tests.conftest import calm, run_cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run (contract.window=auto, 20 steady steps, so that the verdicts below rest on a window of samples), its
    step times then made calm: each the window's median +-1 %. These tests are on the regression gate, which refuses a
    window that is not steady, and the suite's load (CI: two workers on two cores) can leave a real run with no
    steady segment at all (tests/test_steady.py judges real runs)."""
    root = tmp_path_factory.mktemp("baseline")
    r = run_cli(f"hydra.run.dir={root}/run", "logger=none", "contract.window=auto", "contract.steady_steps=20",
                cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    res = results(root / "run")
    assert res["steady"]["class"] in steady.CLASSES and res["window_declared"] == steady.AUTO
    calm(root / "run", res["window_measured"])
    return root / "run"


def results(d: Path) -> dict:
    return json.loads((d / "results.json").read_text())


def golden(run_dir: Path, tmp_path: Path) -> Path:
    """The run as a baseline file (in production --accept --save-baseline writes it; the mock run is not accepted)."""
    path = tmp_path / "golden.json"
    baseline.save(baseline.make(run_dir, results(run_dir), Run(run_dir, results(run_dir)).window_steps), path)
    return path


def variant(run_dir: Path, tmp_path: Path, name: str, **change) -> Path:
    """A copy of the run as another run (its own run_id) with some figures changed."""
    d = tmp_path / name
    shutil.copytree(run_dir, d)
    res = {**results(run_dir), "run_id": uuid.uuid4().hex}
    for key, fn in change.items():
        res[key] = fn(res[key])
    (d / "results.json").write_text(json.dumps(res))
    return d


def against(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_hydra.compare", "--against", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_the_baseline_keeps_the_windows_samples_and_their_interval(run_dir, tmp_path):
    doc = baseline.load(golden(run_dir, tmp_path))
    res = results(run_dir)
    first, last = res["window"]
    assert doc["window_step_times_ms"] == res["step_times_ms"][first - 1:last]
    lo, hi = doc["step_time_ms"]["ci95"]
    assert lo < doc["step_time_ms"]["mean"] < hi and doc["contract_hash"] == res["contract_hash"]


def test_the_run_itself_holds(run_dir, tmp_path):
    r = against(golden(run_dir, tmp_path), run_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no regression" in r.stdout


def test_a_slower_run_regresses_with_exit_3(run_dir, tmp_path):
    """Twice as slow is well beyond the CPU preset's 35 % run-to-run floor; what the test can resolve depends on the
    baseline's own spread: under the suite's load one stalled step makes a 27-step window's coefficient of variation
    about 1 (CI: 103 ms, 95 % CI [62, 145]), and then even a doubling is undecided ([+11 %, +189 %]), correctly so.
    The baseline is the calm run (the fixture), the slower run that run with every step doubled."""
    slow = variant(run_dir, tmp_path, "slow", step_times_ms=lambda ts: [t * 2 for t in ts])
    r = against(golden(run_dir, tmp_path), slow)
    assert r.returncode == EXIT_REGRESSED, r.stdout + r.stderr
    assert "regressed" in r.stdout and "step time +100" in r.stdout.replace("\n", " ")


def test_a_changed_loss_regresses(run_dir, tmp_path):
    off = variant(run_dir, tmp_path, "off", loss=lambda loss: {**loss, "per_step": [x * 1.1 for x in loss["per_step"]]})
    r = against(golden(run_dir, tmp_path), off)
    assert r.returncode == EXIT_REGRESSED and "window loss" in r.stdout.replace("\n", " ")


def test_another_contract_is_refused_unless_it_is_the_variable(run_dir, tmp_path):
    other = variant(run_dir, tmp_path, "other",
                    contract=lambda c: {**c, "software": {**c["software"], "megatron-core": "9.9.9"}})
    path = golden(run_dir, tmp_path)
    r = against(path, other)
    assert r.returncode == 2 and "software.megatron-core" in r.stdout + r.stderr
    r = against(path, other, "--variable", "software")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_bad_baseline_file_is_refused(run_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"baseline_version": 7}))
    r = against(bad, run_dir)
    assert r.returncode == 2 and "not a baseline file" in r.stderr and "Traceback" not in r.stderr


def test_save_baseline_needs_accept(run_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "moe_hydra.compare", str(run_dir), "--save-baseline",
                        str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--accept" in r.stderr and not (tmp_path / "x.json").exists()
