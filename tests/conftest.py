"""Shared fixtures: compose the real ``conf/`` as users' commands do (:func:`moe_hydra.launch.compose.compose`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.launch.compose import compose_typed

# The tests' CLI runs (both xdist workers) share one warm server (moe_hydra.job.warm); it exits a minute after the
# session's last run instead of ten.
os.environ.setdefault("MOE_HYDRA_WARM_IDLE_S", "60")

ROOT = Path(__file__).resolve().parent.parent


def compose_config(*overrides: str):
    """The composed root config as objects (what the rules and the planner read)."""
    return compose_typed(overrides)


@pytest.fixture
def compose_cfg():
    return compose_config


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python -m moe_hydra ARGS`` in a subprocess, outputs under ``cwd``."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "moe_hydra", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
        timeout=timeout,
    )


def calm(run_dir: Path, window: list[int]) -> None:
    """Make a real run's step times calm in its ``results.json``: each the median of ``window`` (1-based, inclusive)
    +-1 %, and ``step_time_ms`` their mean over it. For tests of something other than the machine (data, acceptance,
    the regression gate) that read a window the suite's load (CI: two workers on two cores) can leave unsteady;
    tests/test_steady.py judges real runs."""
    path = run_dir / "results.json"
    res = json.loads(path.read_text())
    first, last = window
    median = statistics.median(res["step_times_ms"][first - 1:last])
    res["step_times_ms"] = [median * (1 + 0.01 * (i % 3 - 1)) for i in range(len(res["step_times_ms"]))]
    res["step_time_ms"] = statistics.fmean(res["step_times_ms"][first - 1:last])
    path.write_text(json.dumps(res))


@pytest.fixture
def cli(tmp_path):
    """Run the CLI with its run and sweep directories inside ``tmp_path``."""

    def _run(*args: str, **kw) -> subprocess.CompletedProcess:
        return run_cli(f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/multi", *args, cwd=tmp_path, **kw)

    return _run


# The files that take longest in `make test`'s parallel part, longest first (ordered by their tests' times in CI's
# --durations on two cores, with warm starts); the Slurm files run beside this part, in a process of their own.
LONGEST_FILES = ("test_search.py", "test_calibration.py", "test_job.py", "test_handoff.py", "test_overrides_fuzz.py",
                 "test_warm.py", "test_data.py", "test_fit.py", "test_nsys.py", "test_rules.py")


def pytest_collection_modifyitems(config, items):
    """Longest files first, then the other files with slow tests, then the rest: `make test`'s parallel part hands
    out a file at a time to whichever worker is free, in this order (--no-loadscope-reorder; xdist's own order is by
    test count), so it ends on short files instead of one worker running a long one alone."""
    slow = {item.path.name for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.path.name
        return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES) + (name not in slow)

    items.sort(key=rank)


def pytest_runtest_logreport(report):
    """``MOE_HYDRA_TEST_DURATIONS=FILE``: each test phase's seconds appended as "<file> <seconds>" (by the process
    that reports, not by xdist's workers), for .ci/run's slowest files."""
    path = os.environ.get("MOE_HYDRA_TEST_DURATIONS")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as f:
            f.write(f"{report.nodeid.split('::')[0]} {report.duration:.3f}\n")
