"""Steady windows: the judgment of a series (moe_hydra.core.steady), contract.window=auto in the job and the
contract, moe-hydra steady, and the refusal of windows that are not steady as evidence."""

from __future__ import annotations

import json
import math
import re
import random
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.analysis.compare import NOT_STEADY
from moe_hydra.analysis.runs import load
from moe_hydra.commands import run_command
from moe_hydra.core import contract, steady
from moe_hydra.core.errors import EXIT_NOT_STEADY, EXIT_OK, EXIT_REFUSED
from moe_hydra.core.resolved import resolve
from moe_hydra.launch.compose import compose_typed
from tests.test_compare import fake_run


def noisy(levels: list[float], noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [x * math.exp(rng.gauss(0, noise)) for x in levels]


# --------------------------------------------------------------------------- the judgment of a series


def test_a_flat_series_is_flat_and_its_window_steady():
    j = steady.judge(noisy([100.0] * 60, 0.02, 1), warmup_steps=3, window=[41, 60])
    assert j.kind == steady.FLAT and j.segment == (4, 60) and j.changepoints == () and j.window_steady
    assert j.mean_ms == pytest.approx(100, rel=0.02) and 0.01 < j.noise < 0.03 and j.judged == (4, 60)


def test_a_warmup_is_found_where_it_ends_and_a_window_inside_it_is_not_steady():
    times = noisy([150.0] * 30 + [100.0] * 40, 0.03, 2)  # steps 1-30 slower: the steady state starts at 31
    j = steady.judge(times, window=[4, 10])
    assert j.kind == steady.WARMUP and abs(j.segment[0] - 31) <= 1 and j.segment[1] == 70
    assert j.window_steady is False and j.suggested_window == j.segment
    assert "NOT steady" in j.describe() and f"contract.window=[{j.segment[0]},70]" in steady.fix(j)
    assert steady.judge(times, window=[41, 70]).window_steady is True


def test_a_slowdown_is_found_and_the_window_before_it_is_not_steady():
    times = noisy([100.0] * 60 + [110.0] * 40, 0.02, 3)  # 10 % slower from step 61
    j = steady.judge(times, window=[41, 50])
    assert j.kind == steady.SLOWDOWN and abs(j.changepoints[-1] - 61) <= 3 and not j.window_steady


def test_a_lone_stall_is_an_outlier_not_a_change_of_level():
    times = noisy([100.0] * 40, 0.02, 4)
    for at in (0, 20, 39):  # anywhere, the last step too
        stalled = list(times)
        stalled[at] *= 3
        j = steady.judge(stalled, window=[31, 40])
        assert j.kind == steady.FLAT and j.outliers == (at + 1,) and j.window_steady, (at, j)
    two = list(times)
    two[10] *= 3
    two[11] *= 3
    assert steady.judge(two).outliers == (11, 12)  # two in a row still are
    level = list(times)
    for i in range(20, 40):
        level[i] *= 3
    j = steady.judge(level)
    assert j.outliers == () and j.changepoints == (21,) and j.kind == steady.SLOWDOWN  # twenty are a level


def test_a_burst_of_a_few_slow_steps_is_outliers_not_levels():
    """This CPU now and then runs 3-5 steps 20-40 % slow and comes back (another process's work): outliers, the series
    one level; a short level on the way down (a warm-up's step) is a level, and so is one at the end (not over)."""
    times = noisy([100.0] * 30 + [140.0] * 4 + [100.0] * 30, 0.02, 13)
    j = steady.judge(times, window=[41, 60])
    assert j.kind == steady.FLAT and j.segment == (1, 64) and set(range(31, 35)) <= set(j.outliers)
    assert j.window_steady and abs(j.drift) < 0.02
    stairs = steady.judge(noisy([150.0] * 20 + [125.0] * 4 + [100.0] * 30, 0.02, 13))
    assert stairs.kind == steady.WARMUP and stairs.segment[0] == 25 and 21 not in stairs.outliers
    late = steady.judge(noisy([100.0] * 40 + [140.0] * 4, 0.02, 13), window=[31, 40])
    assert late.kind == steady.NO_STEADY_STATE and not late.window_steady


def test_a_series_too_short_has_no_steady_state():
    j = steady.judge(noisy([100.0] * 10, 0.02, 5), warmup_steps=3, window=[4, 10])
    assert j.kind == steady.NO_STEADY_STATE and j.segment is None and j.window_steady is False
    assert "contract.window=auto" in steady.fix(j) and j.suggested_window is None
    assert steady.judge(noisy([100.0] * 10, 0.02, 5), steady_steps=5).kind == steady.FLAT


def test_levels_within_the_tolerance_are_one():
    """A 0.5 % step at 0.1 % noise is a real change but not one worth a warning; a 3 % one is."""
    assert steady.judge(noisy([100.0] * 30 + [100.5] * 30, 0.001, 6)).kind == steady.FLAT
    assert steady.judge(noisy([100.0] * 30 + [103.0] * 30, 0.001, 6)).kind == steady.SLOWDOWN


def test_the_compiled_pelt_is_ruptures_own_kernel_cpd():
    import numpy as np
    import ruptures

    rng = np.random.default_rng(7)
    for n in (12, 50, 200):
        y = rng.normal(0, 1, n)
        y[n // 3:] += 2
        pen = 4 * math.log(n)
        want = ruptures.KernelCPD(kernel="linear", min_size=3).fit(y.reshape(-1, 1)).predict(pen=pen)
        assert steady.pelt(y, pen) == [int(e) for e in want], n
        l2 = ruptures.Pelt(model="l2", min_size=3, jump=1).fit(y.reshape(-1, 1))
        assert steady.pelt(y, pen) == l2.predict(pen=pen)


def test_judging_loads_no_scipy_and_starts_no_thread():
    """The extension alone (ruptures' package import costs half a second and a thread of scipy's OpenBLAS, which a
    warm server's forked ranks could not have)."""
    code = ("import os, sys, numpy; n = len(os.listdir('/proc/self/task')); from moe_hydra.core import steady; "
            "steady.judge([100.0 + i % 3 for i in range(40)]); "
            "print(len(os.listdir('/proc/self/task')) - n, 'scipy' in sys.modules, 'ruptures' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "False", "False"], out


def test_auto_stops_on_half_of_enough_steps():
    flat = steady.judge(noisy([100.0] * 19, 0.02, 8), steady_steps=10)
    assert flat.segment is not None and not steady.settled(flat)  # 19 steps judged: fewer than 2 x 10
    series = noisy([100.0] * 40, 0.02, 8)  # flat: it stops within a few steps of 20 (a chance trend: the next ones)
    stop = next(n for n in range(1, 41) if steady.settled(steady.judge(series[:n], steady_steps=10)))
    assert 20 <= stop <= 25
    late = steady.judge(noisy([150.0] * 15 + [100.0] * 12, 0.02, 9), steady_steps=10)
    assert late.segment[1] - late.segment[0] + 1 >= 10 and not steady.settled(late)  # under half of 27
    assert steady.validation(50, 10) == ["contract.window=auto", "contract.warmup_steps=30"]


def test_auto_waits_out_a_trend_inside_the_noise():
    """A fall from 160 to 110 ms over 20 steps at 12 % noise (this CPU's profiled sweep's first run): PELT places no
    changepoint in it, the trend does not let auto stop; the same noise flat, it stops at once."""
    ramp = steady.judge(noisy([160.0 - 2.5 * i for i in range(20)], 0.12, 14), steady_steps=10)
    assert ramp.segment == (1, 20) and ramp.drift < -0.15 and ramp.drift_z > steady.DRIFT_Z
    assert not steady.settled(ramp)
    flat = steady.judge(noisy([110.0] * 20, 0.12, 14), steady_steps=10)
    assert flat.segment == (1, 20) and steady.settled(flat) and abs(flat.drift) < 0.15
    assert steady.judge(noisy([100.0] * 30, 0.02, 12)).as_dict()["drift_z"] is not None


def test_an_earlier_versions_results_are_judged_and_profiled_steps_after_the_window_left_out():
    times = noisy([100.0] * 30, 0.02, 10) + [300.0] * 5  # five profiled steps after the window, three times slower
    old = {"step_times_ms": times, "warmup_steps": 3, "window": [4, 30], "profile_steps": [31, 35]}
    j = steady.of_results(old)
    assert j.judged == (4, 30) and j.kind == steady.FLAT and j.window_steady
    assert not steady.of_results({**old, "profile_steps": None}).window_steady  # its last level: the 5 profiled
    assert steady.of_results({**old, "steady": {"steady_steps": 40}}).kind == steady.NO_STEADY_STATE


# --------------------------------------------------------------------------- the plan and the contract


def test_auto_is_in_the_contract_and_its_window_and_cap_are_not():
    auto = [compose_typed(["contract.window=auto", f"train.train_iters={n}"]) for n in (200, 400)]
    hashes = {contract.digest(contract.build(c, resolve(c), {"versions": {}, "env": {}})) for c in auto}
    assert len(hashes) == 1
    c = auto[0]
    timing = contract.build(c, resolve(c), {"versions": {}, "env": {}})["timing"]
    assert timing == {"warmup_steps": 3, "window": "auto", "steady_steps": 10}
    declared = compose_typed(["contract.window=[4,13]"])
    assert contract.digest(contract.build(declared, resolve(declared), {"versions": {}, "env": {}})) not in hashes
    assert c.train.train_iters == 200 and resolve(c).window == (4, 23)  # what a plan predicts: auto's first window
    profiled = compose_typed(["contract.window=auto", "profile=window"])
    assert resolve(profiled).train_iters == 205 and resolve(profiled).profile_steps is None


# --------------------------------------------------------------------------- verdicts only on steady windows


def _runs(root: Path, warmup: bool) -> Path:
    """Two arms of a dispatcher A/B, 30 % apart; ``warmup``: their declared window lies in a warm-up."""
    for i, (disp, mean) in enumerate((("alltoall", 100.0), ("allgather", 130.0))):
        head = [mean * 1.5] * 20 if warmup else []
        fake_run(root, str(i), noisy(head + [mean] * 30, 0.02, 20 + i), dispatcher=disp, window=[4, 20] if warmup
                 else [21, 30], warmup_steps=3)
    return root


def test_compare_gives_no_verdict_on_a_window_that_is_not_steady_and_says_the_fix(tmp_path, capsys):
    assert run_command("compare", [str(_runs(tmp_path / "ok", False)), "--out", str(tmp_path / "o1")]) == 0
    assert "slower" in capsys.readouterr().out
    d = _runs(tmp_path / "warm", True)  # 30 % apart, but measured inside their warm-ups
    assert run_command("compare", [str(d), "--out", str(tmp_path / "o2")]) == 0
    out = capsys.readouterr().out
    assert "not steady" in out and "window [4, 20] NOT steady" in out and "contract.window=[21,50]" in out
    assert not re.search(r"\b(faster|slower)\b", out.replace("slower than", ""))
    (pair,) = json.loads((tmp_path / "o2" / "compare.json").read_text())["pairs"]
    assert pair["verdict"] == NOT_STEADY and pair["relative_difference"] > 0.2  # the figures shown, no verdict
    assert [x["run"] for x in pair["not_steady"]] == [str(d / "0"), str(d / "1")]
    loaded = load([d], lambda m: None)  # what accept, regress and the loops read
    assert not loaded.runs and len(loaded.not_steady) == 2
    assert len(load([d], lambda m: None, need_steady=False).runs) == 2


def test_accept_refuses_a_window_that_is_not_steady(tmp_path, capsys):
    d = tmp_path / "acc"
    fake_run(d, "0", noisy([150.0] * 45 + [100.0] * 15, 0.02, 30), window=[41, 60], warmup_steps=3, swept=())
    assert run_command("accept", [str(d)]) == EXIT_REFUSED
    assert "NOT steady" in capsys.readouterr().err


def test_the_steady_command_says_each_runs_judgment_and_exits_by_it(tmp_path, capsys):
    ok, warm = _runs(tmp_path / "ok", False), _runs(tmp_path / "warm", True)
    assert run_command("steady", [str(ok)]) == EXIT_OK
    assert run_command("steady", [str(ok), str(warm)]) == EXIT_NOT_STEADY
    out = capsys.readouterr().out
    assert "2 of 4 windows not steady" in out and "warmup" in out and "flat" in out
    assert run_command("steady", [str(warm / "0"), "--json"]) == EXIT_NOT_STEADY
    (judged,) = json.loads(capsys.readouterr().out)
    assert judged["class"] == steady.WARMUP and judged["window_steady"] is False and judged["suggested_window"]
    assert run_command("steady", [str(tmp_path / "nothing")]) == EXIT_REFUSED
    assert run_command("steady", [str(ok), "--steady-steps", "40"]) == EXIT_NOT_STEADY  # 30 flat steps are not 40


# --------------------------------------------------------------------------- contract.window=auto in the job


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_auto_measures_the_steady_segment_every_rank_agreeing(tmp_path, devices):
    """The job steps until its step times are steady (two ranks: rank 0 decides, both stop at the same step — or the
    run would hang on a collective), measures that segment and says so everywhere."""
    out = tmp_path / "run"
    extra = ["hardware.devices_per_node=2", "expert_mesh=ep2"] if devices == 2 else []
    r = subprocess.run([sys.executable, "-m", "moe_hydra", "logger=none", "contract.window=auto",
                        "contract.steady_steps=5", f"hydra.run.dir={out}", *extra], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    s = res["steady"]
    assert res["window_declared"] == "auto" and res["contract"]["timing"]["window"] == "auto"
    assert s["window_steady"] is True and s["segment"] == res["window_measured"] == res["window"]
    assert res["steps"] == s["segment"][1] < 200 and s["segment"][1] - s["segment"][0] + 1 >= 5
    assert res["step_time_ms"] == pytest.approx(sum(res["step_times_ms"][s["segment"][0] - 1:]) /
                                                (s["segment"][1] - s["segment"][0] + 1))
    assert 0 < s["seconds"] < 0.05 * sum(res["step_times_ms"]) / 1e3  # judging: a few ms
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("moe_hydra: steady: ") and "steady (contract.window=auto)" in last
    assert "contract.window=auto: steady from step" in r.stderr


@pytest.mark.slow
def test_auto_without_a_steady_segment_stops_at_the_cap_and_says_so(tmp_path):
    """The shortest cap auto allows (20 steps judged after the warmup), too short for this CPU, whose steps fall for
    20-60 steps after a start: measured as its last steps, judged not steady."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "moe_hydra", "logger=none", "contract.window=auto",
                        "train.train_iters=23", f"hydra.run.dir={out}"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    if res["steady"]["window_steady"]:  # flat from step 4 on this machine this time
        pytest.skip("this run's steps were steady from its first judged step")
    assert res["steps"] == 23 and res["window"] == [14, 23] and "no steady segment of 10 steps in 23 steps" in r.stderr
    assert run_command("steady", [str(out)]) == EXIT_NOT_STEADY
