"""repeat=auto: the group-sequential test (alpha spending, false verdicts and power by simulation), the driver that
launches its rounds (sequential.json), and one real sequential A/B on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from moe_hydra.core import contract, stats, steady
from moe_hydra.core.schema import AUTO_MAX_STEPS
from moe_hydra.launch import outcome, sequential
from tests.test_compare import fake_run

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the boundaries


def test_spending_bounds_are_the_published_obrien_fleming_type_ones():
    """Lan-DeMets O'Brien-Fleming-type, 5 equally spaced looks, two-sided 5 % (gsDesign sfLDOF / ldbounds)."""
    published = [4.8769, 3.3570, 2.6803, 2.2898, 2.0310]
    fractions = [0.2, 0.4, 0.6, 0.8, 1.0]
    assert stats.spending_bounds(fractions) == pytest.approx(published, abs=2e-3)
    assert stats.spending_bounds(fractions, alpha=0.025, sides=1) == pytest.approx(published, abs=2e-3)
    assert stats.spending_bounds([1.0]) == pytest.approx([1.95996], abs=1e-4)  # one look: the fixed test
    # a look's bound does not depend on the looks after it; unequal spacing is allowed
    assert stats.spending_bounds([0.3, 0.5, 1.0])[:2] == pytest.approx(stats.spending_bounds([0.3, 0.5]))
    assert stats.spent(1.0) == 0.05 and stats.spent(0.5) < 0.01


# --------------------------------------------------------------------------- simulation

SIGMA_B, SIGMA_W, STEPS = 0.02, 0.05, 20  # run-to-run 2 %, step-to-step 5 %, 20 steady steps a run
MARGIN = 2 * SIGMA_B


@pytest.mark.parametrize("prior_runs", [0, 8], ids=["own runs", "measured noise pooled"])
def test_a_a_sequences_with_a_look_every_round_keep_false_verdicts_at_5_percent(prior_runs):
    """2,000 simulated A/A campaigns, up to 8 rounds, a look after each: faster or slower at most 5 % of them."""
    design = stats.Design(max_repeats=8, margin=MARGIN)
    sim = stats.simulate(0.0, design, SIGMA_B, SIGMA_W, STEPS, sims=2000, seed=11, prior_runs=prior_runs)
    false = sim["verdicts"][stats.FASTER] + sim["verdicts"][stats.SLOWER]
    assert false <= 0.05, sim
    assert sim["verdicts"][stats.EQUIVALENT] >= 0.8, sim  # and most of them end "equivalent within 2 sigma_b"


def test_an_effect_of_twice_the_run_noise_is_found_within_max_repeats():
    design = stats.Design(max_repeats=8, margin=MARGIN)
    sim = stats.simulate(2 * SIGMA_B, design, SIGMA_B, SIGMA_W, STEPS, sims=1000, seed=12, prior_runs=8)
    assert sim["verdicts"][stats.SLOWER] >= 0.80, sim
    assert sim["verdicts"][stats.FASTER] == 0
    faster = stats.simulate(-2 * SIGMA_B, design, SIGMA_B, SIGMA_W, STEPS, sims=500, seed=13)
    assert faster["verdicts"][stats.FASTER] >= 0.80, faster


def test_equivalence_is_rarely_claimed_for_an_effect_at_the_margin():
    """The other error: an effect as large as the margin called equivalent (TOST with spending: at most 5 %)."""
    design = stats.Design(max_repeats=8, margin=MARGIN)
    sim = stats.simulate(MARGIN, design, SIGMA_B, SIGMA_W, STEPS, sims=1000, seed=14)
    assert sim["verdicts"][stats.EQUIVALENT] <= 0.06, sim  # 5 % and the simulation's own error


def test_a_futility_stop_saves_runs_on_null_candidates_and_never_adds_a_false_faster():
    """compare.futility (tune's retune): the same simulated campaigns with and without the stop. On a candidate no
    faster than the incumbent it ends arms early; it is non-binding, so "faster" is never reached more often, at no
    effect nor at a real gain of twice the futility gain (the power tune needs)."""
    noisy = dict(sigma_b=0.10, sigma_w=0.10, steps=8, sims=1000, prior_runs=6)  # this CPU's noise, tune's window
    for effect, seed in ((0.0, 21), (-0.10, 22)):
        plain = stats.simulate(effect, stats.Design(max_repeats=4, margin=0.05), seed=seed, **noisy)
        stop = stats.simulate(effect, stats.Design(max_repeats=4, margin=0.05, futility=0.05), seed=seed, **noisy)
        assert stop["verdicts"][stats.FASTER] <= plain["verdicts"][stats.FASTER], (plain, stop)
        assert plain["futile"] == 0
        if effect == 0.0:
            assert stop["futile"] > 0.3 and stop["runs_per_arm_mean"] < plain["runs_per_arm_mean"] - 0.5, stop
            assert stop["verdicts"][stats.FASTER] <= 0.05
        else:
            assert stop["verdicts"][stats.FASTER] >= plain["verdicts"][stats.FASTER] - 0.02, (plain, stop)


def test_a_look_that_rules_out_the_gain_stops_without_a_verdict():
    a = [stats.RunStat(100.0 + x, 4.0, 8) for x in (0.0, 1.0, -1.0, 0.5)]
    b = [stats.RunStat(112.0 + x, 4.0, 8) for x in (0.0, -1.0, 1.0, 0.5)]  # 12 % slower: no 5 % gain is possible
    design = stats.Design(max_repeats=8, futility=0.05)
    looks = stats.sequential_looks(a, b, design)
    last = looks[-1]
    assert last.futile and last.verdict == stats.UNDECIDED and last.look < 8 and stats.decided(looks, design)
    assert last.gain_bound < 0.05
    # without the stop the same runs go on (to "slower")
    assert not stats.sequential_looks(a, b, stats.Design(max_repeats=8))[-1].futile


def test_the_first_look_waits_for_a_variance():
    runs = [stats.RunStat(100.0, 0.1, 20), stats.RunStat(101.0, 0.1, 20)]
    assert stats.sequential_looks(runs[:1], runs[1:], stats.Design()) == []  # one run each, no noise: no look
    looks = stats.sequential_looks(runs[:1], runs[1:], stats.Design(noise=0.02, noise_df=7))
    assert len(looks) == 1 and looks[0].verdict == stats.UNDECIDED and looks[0].df == 7
    a = [stats.RunStat(100.0 + i % 2, 0.1, 20) for i in range(8)]
    b = [stats.RunStat(150.0 + i % 2, 0.1, 20) for i in range(8)]
    looks = stats.sequential_looks(a, b, stats.Design())
    assert looks[-1].verdict == stats.SLOWER and looks[-1].look < 8  # stops at the first look that decides
    assert looks[-1].ci_low > 0.4 and looks[-1].bound > 1.96  # a repeated CI, wider than a fixed one


# --------------------------------------------------------------------------- the driver


def test_normalize_turns_repeat_auto_into_the_flag_and_a_sweep():
    assert sequential.normalize(["dispatcher=a,b", "repeat=auto"]) == \
        ["-m", "dispatcher=a,b", "compare.sequential=true"]
    assert sequential.normalize(["-m", "x=1,2", "+repeat=auto"]) == ["-m", "x=1,2", "compare.sequential=true"]
    assert sequential.normalize(["repeat=0,1"]) == ["repeat=0,1"]


class FakeSweeper:
    """What drive() reads of the points sweeper: config, hydra_context, _launch(batch, first). Each launched point
    'runs' at once: a results.json of steps drawn for its arm (``means``: arm value -> mean step ms)."""

    def __init__(self, tmp: Path, means: dict[str, float], sd_run: float, seed: int = 0, detach: bool = False,
                 works: dict | None = None, unsettled: bool = False, **compare):
        self.sweep_dir = tmp / "sweep"
        self.config = OmegaConf.create({"stage": "run", "hydra": {"sweep": {"dir": str(self.sweep_dir)}},
                                        "contract": {"window": [4, 23]}, "hardware": {"run_to_run_noise": 0.2},
                                        "compare": {"max_repeats": 8, "alpha": 0.05, "sequential": True, **compare}})
        self.ended: list = []
        self.hydra_context = SimpleNamespace(callbacks=SimpleNamespace(on_job_end=lambda **kw: self.ended.append(kw)))
        self.means, self.sd_run, self.detach = means, sd_run, detach
        self.rng = np.random.default_rng(seed)
        self.batches: list[tuple[int, list[list[str]]]] = []
        self.works = works or {}  # arm -> the work of its step (what the points sweeper resolves); none: unknown
        self.unsettled = unsettled  # a point without train.train_iters never settles (its steps fall throughout)

    def work(self, point):
        return next((self.works[o] for o in point if o in self.works), None)

    def _launch(self, batch, first):
        self.batches.append((first, [list(p) for p in batch]))
        rets = []
        for i, point in enumerate(batch):
            num = first + i
            d = self.sweep_dir / str(num)
            if self.detach:
                rets.append(outcome.job_return(point, outcome.SUBMITTED, None, str(d)))
                continue
            arm = next(o for o in point if o in self.means)
            mean = self.means[arm] * (1 + self.rng.normal(0, self.sd_run))
            times = mean * (1 + self.rng.normal(0, 0.03, 23))
            if self.unsettled and not any(o.startswith("train.train_iters=") for o in point):
                times = times * (1 + np.linspace(1, 0.3, 23))  # twice as slow at first, still falling at the end
            declared = next((o.split("=", 1)[1] for o in point if o.startswith("contract.window=")), "auto")
            window = [4, 23]
            if declared == "auto":  # as the job does: the segment it stops on, else its last steps
                judged = steady.judge(list(times), steady_steps=10)
                window = list(judged.segment) if steady.settled(judged) else [14, 23]
            fake_run(self.sweep_dir, str(num), list(times), window=window, window_declared=declared)
            rets.append(outcome.job_return(point, "COMPLETED", None, str(d)))
        return rets


def _overrides(*args: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(args))


def test_drive_runs_rounds_until_a_verdict_and_writes_sequential_json(tmp_path):
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 120.0}, sd_run=0.02)
    returns = sequential.drive(s, _overrides("dispatcher=alltoall,allgather", "logger=none"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    assert rec["status"] == "decided" and rec["verdict"] == stats.SLOWER, rec
    rounds = len(rec["rounds"])
    assert 2 <= rounds < 8 and len(returns) == rounds
    assert rec["runs_used"] == {"dispatcher=alltoall": rounds, "dispatcher=allgather": rounds}
    # job numbers continue round after round; the arms' order alternates; every point carries its repeat index
    assert [first for first, _ in s.batches] == [2 * r for r in range(rounds)]
    assert s.batches[0][1][0][0] == "dispatcher=alltoall" and s.batches[1][1][0][0] == "dispatcher=allgather"
    assert all(p[-1] == f"repeat={r}" for r, (_, batch) in enumerate(s.batches) for p in batch)
    assert rec["design"]["margin"] == stats.EQUIVALENCE and "declared" in rec["design"]["margin_source"]
    last = rec["rounds"][-1]["looks"]["dispatcher=allgather"]
    assert last["verdict"] == stats.SLOWER and last["ci_low"] > 0 and last["bound"] > 0


def test_a_run_that_never_settles_is_run_again_longer_not_judged(tmp_path):
    """A contract.window=auto run (the default) that found no steady segment is run again with twice the steps, and
    the verdict rests on the longer runs alone."""
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 120.0}, sd_run=0.02,
                    unsettled=True)
    sequential.drive(s, _overrides("dispatcher=alltoall,allgather"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    assert rec["status"] == "decided" and rec["verdict"] == stats.SLOWER, rec
    first, again = s.batches[0][1], s.batches[1][1]
    assert not any("train.train_iters" in o for p in first for o in p)
    assert all(p[-1] == f"train.train_iters={2 * AUTO_MAX_STEPS}" and "repeat=0" in p for p in again)
    points = rec["rounds"][0]["points"]
    assert [p.get("longer") is not None for p in points] == [False, False, True, True]
    assert all(p["steady"]["window_steady"] is False and p["mean_ms"] is None for p in points[:2])
    assert all("steady" not in p and p["mean_ms"] > 90 for p in points[2:])
    assert rec["runs_used"] == {a: len(rec["rounds"]) for a in rec["arms"]}  # a round's unsettled run is not one


def test_a_declared_window_that_is_not_steady_stops_the_ab(tmp_path):
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 120.0}, sd_run=0.02,
                    unsettled=True)
    sequential.drive(s, _overrides("dispatcher=alltoall,allgather", "contract.window=[4,23]"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    assert rec["status"] == "refused: a window is not steady" and len(s.batches) == 1, rec
    assert rec["rounds"][0]["points"][0]["steady"]["window_steady"] is False


def test_drive_with_a_measured_noise_looks_after_round_one_and_declares_equivalence(tmp_path):
    noise = tmp_path / "noise.json"
    noise.write_text(json.dumps({"source": "measured", "run_to_run_noise": 0.01, "df": 9, "runs": 10,
                                 "step_noise": 0.03, "interval": [0.006, 0.02]}))
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 100.0}, sd_run=0.01, seed=0,
                    noise_file=str(noise))
    sequential.drive(s, _overrides("dispatcher=alltoall,allgather"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    assert rec["design"]["noise"] == 0.01 and rec["design"]["noise_floor"]["source"] == "measured"
    assert rec["design"]["margin"] == stats.EQUIVALENCE  # declared, whatever the noise
    assert "dispatcher=allgather" in rec["rounds"][0]["looks"]  # a look after the first round already
    assert rec["verdict"] == stats.EQUIVALENT, rec
    # the interval beside the verdict is the equivalence test's, inside the margin; narrower than the repeated 95 %
    [pair] = rec["pairs"]
    lo, hi = pair["verdict_ci"]
    assert pair["verdict_ci"] == pair["equivalence_ci"] and -0.05 < lo < hi < 0.05
    assert pair["ci"][0] < lo and hi < pair["ci"][1] and pair["runs_needed"] is None


def test_a_design_that_varies_the_work_is_judged_on_tokens_per_s(tmp_path):
    """train.global_batch_size 8 vs 16 (on purpose): 1.5 times the step time for twice the tokens is faster in
    tokens/s/GPU; the test runs on time per token, and sequential.json says which figure it judged."""
    gbs = {"train.global_batch_size=8": contract.Work(1024, 1, 1), "train.global_batch_size=16": contract.Work(2048, 1, 1)}
    s = FakeSweeper(tmp_path, {"train.global_batch_size=8": 100.0, "train.global_batch_size=16": 150.0}, sd_run=0.02,
                    works=gbs)
    sequential.drive(s, _overrides("train.global_batch_size=8,16"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    [pair] = rec["pairs"]
    assert rec["metric"] == pair["metric"] == contract.THROUGHPUT and rec["verdict"] == stats.FASTER, rec
    assert pair["rel_tokens_per_s_per_gpu"] == pytest.approx(100 / 1024 / (150 / 2048) - 1, abs=0.05)
    assert pair["ci"][0] < pair["rel_tokens_per_s_per_gpu"] < pair["ci"][1] and pair["rel_step_time"] is None
    assert rec["tokens_per_step_per_gpu"] == [1024, 2048]


def test_arms_whose_batch_follows_the_variable_are_refused_before_a_round(tmp_path, capsys):
    works = {"train.micro_batch_size=4": contract.Work(512, 1, 4), "train.micro_batch_size=5": contract.Work(640, 1, 5)}
    s = FakeSweeper(tmp_path, {}, sd_run=0.0, works=works)
    [[ret]] = sequential.drive(s, _overrides("train.micro_batch_size=4,5"))
    err = capsys.readouterr().err
    assert outcome.state_of(ret) == "INVALID" and not s.batches, err
    assert "train different work a step" in err and "train.global_batch_size=20" in err and "Nothing was launched" in err


def test_drive_with_futility_stops_a_slower_candidate_and_says_so(tmp_path, capsys):
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 110.0}, sd_run=0.02,
                    futility=0.05)
    returns = sequential.drive(s, _overrides("dispatcher=alltoall,allgather"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    [pair] = rec["pairs"]
    assert rec["status"] == "stopped for futility (compare.futility)" and pair["futile"], rec
    assert rec["verdict"] == stats.UNDECIDED and pair["gain_bound"] < 0.05 and len(returns) < 8
    assert rec["design"]["futility"] == 0.05
    assert "a gain of 5.00% ruled out" in capsys.readouterr().out


def test_drive_stops_at_the_cap_undecided(tmp_path):
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 101.0}, sd_run=0.05,
                    max_repeats=3)
    returns = sequential.drive(s, _overrides("dispatcher=alltoall,allgather"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    assert len(returns) == 3 and rec["status"].startswith("undecided at the cap") and rec["verdict"] == "undecided"
    [pair] = rec["pairs"]  # says how many runs per arm would decide, when the difference is inside the margin
    assert pair["verdict_ci"] == pair["ci"] and (pair["runs_needed"] is None or pair["runs_needed"] > 3)
    assert pair["runs_needed"] == rec["rounds"][-1]["looks"]["dispatcher=allgather"]["runs_needed"]


@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "not a noise file"])
def test_a_named_noise_file_that_cannot_be_read_refuses_the_sweep(tmp_path, capsys, kind):
    """compare.noise_file named explicitly and bad: refused before round 1 (it used to warn and run 16 jobs)."""
    path = {"missing": tmp_path / "nonexistent.json", "directory": tmp_path, "binary": tmp_path / "noise.bin",
            "not a noise file": tmp_path / "other.json"}[kind]
    if kind == "binary":
        path.write_bytes(bytes(range(256)))
    if kind == "not a noise file":
        path.write_text(json.dumps({"source": "declared", "run_to_run_noise": 0.02}))
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 100.0}, sd_run=0.01,
                    noise_file=str(path))
    [[ret]] = sequential.drive(s, _overrides("dispatcher=alltoall,allgather"))
    err = capsys.readouterr().err
    assert outcome.state_of(ret) == "INVALID" and not s.batches, err
    assert "compare.noise_file" in err and str(path) in err and "Nothing was launched" in err


def test_drive_detached_queues_one_round_and_returns(tmp_path):
    s = FakeSweeper(tmp_path, {"dispatcher=alltoall": 100.0, "dispatcher=allgather": 120.0}, sd_run=0.02,
                    detach=True)
    returns = sequential.drive(s, _overrides("dispatcher=alltoall,allgather"))
    rec = json.loads((s.sweep_dir / sequential.SEQUENTIAL_FILE).read_text())
    assert len(returns) == 1 and rec["status"] == "queued" and len(s.batches) == 1


@pytest.mark.parametrize("args, said", [(("dispatcher=alltoall",), "sweep the variable under test"),
                                        (("dispatcher=alltoall,allgather", "repeat=0,1"), "sets the repeat index"),
                                        (("dispatcher=alltoall,allgather", "compare.max_repeats=0"),
                                         "compare.max_repeats must be within [1, 1000]")])
def test_drive_refuses_what_it_cannot_run(tmp_path, capsys, args, said):
    s = FakeSweeper(tmp_path, {}, sd_run=0.0)
    if "compare.max_repeats=0" in args:  # composed into the sweep's config, as Hydra does
        s.config.compare.max_repeats = 0
    [[ret]] = sequential.drive(s, _overrides(*args))
    assert outcome.state_of(ret) == "INVALID" and said in capsys.readouterr().err
    assert not s.batches and len(s.ended) == 1  # the refusal reaches Hydra's callbacks (the exit code)


# --------------------------------------------------------------------------- a real sequential A/B

def run_auto(tmp_path: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m moe_hydra ARGS``, outputs under ``tmp_path``."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "moe_hydra", f"hydra.sweep.dir={tmp_path}/multi", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
@pytest.mark.serial
def test_real_runs_repeat_auto_detects_a_deeper_model(tmp_path):
    """tiny_moe with 1 vs 8 layers (the same tokens a step, so step time is the figure; about 5 times the step time
    on a CPU): repeat=auto stops at slower within compare.max_repeats runs per arm, each round's runs in the sweep
    directory. The noise file is what a site file would point at (10 % run-to-run, generous for a shared CPU), so the
    test looks from the first round."""
    (tmp_path / "noise.json").write_text(json.dumps({"source": "measured", "run_to_run_noise": 0.10, "df": 10,
                                                     "runs": 11, "step_noise": 0.10}))
    r = run_auto(tmp_path, "logger=none", "contract.steady_steps=5", "model.num_layers=1,8", "repeat=auto", "compare.max_repeats=4",
                 f"compare.noise_file={tmp_path / 'noise.json'}")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((tmp_path / "multi" / sequential.SEQUENTIAL_FILE).read_text())
    assert rec["verdict"] == stats.SLOWER and rec["metric"] == contract.STEP_TIME, json.dumps(rec["rounds"])
    assert rec["design"]["noise_floor"]["source"] == "measured"
    used = rec["runs_used"]
    assert set(used.values()) <= {1, 2, 3, 4} and len(set(used.values())) == 1, used
    assert sorted(int(p.name) for p in (tmp_path / "multi").iterdir() if p.name.isdigit()) == \
        list(range(2 * len(rec["rounds"])))
    assert "repeat=auto: decided" in r.stdout
    # every run measured a window it found steady (repeat=auto's default, contract.window=auto)
    for p in (tmp_path / "multi").iterdir():
        if p.name.isdigit():
            res = json.loads((p / "results.json").read_text())
            assert res["window_declared"] == "auto" and res["steady"]["window_steady"] is True, res["steady"]
