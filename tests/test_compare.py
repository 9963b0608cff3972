"""Compare: verdicts with confidence, refusals, acceptance, regression diagnosis, robustness."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from moe_hydra.analysis import compare
from moe_hydra.core import contract
from moe_hydra.core.stats import FASTER, SAME, SLOWER, welch

BASE_CONTRACT = {"dispatcher": {"name": "alltoall"}, "train": {"seq_length": 128}, "parallel": {"ep": 1}}


def fake_run(root: Path, name: str, times: list[float], *, dispatcher="alltoall", seq=128, swept=("dispatcher",),
             label="training-equivalent", window=None, steps=None, **extra) -> Path:
    c = json.loads(json.dumps(BASE_CONTRACT))
    c["dispatcher"]["name"], c["train"]["seq_length"] = dispatcher, seq
    window = window or [4, len(times)]
    d = root / name
    d.mkdir(parents=True)
    res = {"status": "ok", "stage": "run", "contract": c, **contract.hashes(c, list(swept)), "swept": list(swept),
           "step_times_ms": times, "window": window, "steps": steps or len(times), "step_time_ms": sum(times) / len(times),
           "tokens_per_s_per_gpu": 1000.0, "tflops_per_gpu": 0.01, "label": label, "label_reasons": [],
           "loss": {"first": 7.0, "last": 6.0, "all_finite": True, "nan_or_skipped": 0},
           "evidence": {"dispatcher_class": f"{dispatcher}Dispatcher"}, "peak_memory_gib": {"rss": 0.5}, **extra}
    (d / "results.json").write_text(json.dumps(res))
    return d


def noisy(mean: float, n: int, rng: random.Random, sd: float = 3.0) -> list[float]:
    return [rng.gauss(mean, sd) for _ in range(n)]


def test_welch_detects_a_known_effect_and_not_a_null_one():
    rng = random.Random(0)
    assert welch(noisy(100, 20, rng), noisy(120, 20, rng), "steps").verdict == SLOWER
    assert welch(noisy(100, 20, rng), noisy(80, 20, rng), "steps").verdict == FASTER
    # A/A: of 200 pairs from one distribution, about 5 % may be called different (the 95 % interval)
    false = sum(welch(noisy(100, 20, rng), noisy(100, 20, rng), "steps").verdict != SAME for _ in range(200))
    assert false <= 20
    e = welch(noisy(100, 20, rng), noisy(110, 20, rng), "steps")
    assert e.ci_low < e.rel_step_time < e.ci_high and 0 < e.mde < 0.1
    assert e.rel_tokens_per_s == pytest.approx(e.mean_a_ms / e.mean_b_ms - 1)


def test_sweep_arms_get_a_verdict_and_outputs(tmp_path):
    rng = random.Random(1)
    fake_run(tmp_path, "0", noisy(100, 23, rng), dispatcher="alltoall")
    fake_run(tmp_path, "1", noisy(130, 23, rng), dispatcher="allgather")
    assert compare.main([str(tmp_path)]) == 0
    md = (tmp_path / "compare.md").read_text()
    assert "dispatcher=allgather" in md and "slower" in md and (tmp_path / "compare.png").stat().st_size > 1000


def test_warmup_steps_never_enter(tmp_path):
    rng = random.Random(2)
    a = fake_run(tmp_path, "a", [900.0] * 3 + noisy(100, 20, rng), dispatcher="alltoall")
    b = fake_run(tmp_path, "b", [100.0] * 3 + noisy(100, 20, rng), dispatcher="allgather")
    (comp,) = compare.compare(compare.load([a, b], print), ["dispatcher"])
    (effect,) = comp.effects.values()
    assert effect.verdict == SAME and effect.n_a == effect.n_b == 20


def test_repeated_arms_use_the_run_as_unit(tmp_path):
    rng = random.Random(3)
    for i in range(3):
        fake_run(tmp_path, f"a{i}", noisy(100 + i, 23, rng), dispatcher="alltoall", swept=("dispatcher", "repeat"))
        fake_run(tmp_path, f"b{i}", noisy(150 + i, 23, rng), dispatcher="allgather", swept=("dispatcher", "repeat"))
    (comp,) = compare.compare(compare.load([tmp_path], print))
    (effect,) = comp.effects.values()
    assert effect.unit == "runs" and effect.n_a == 3 and effect.verdict == SLOWER and not comp.notes


def test_runs_from_different_contracts_are_refused_with_the_diff(tmp_path, capsys):
    rng = random.Random(4)
    a = fake_run(tmp_path, "a", noisy(100, 23, rng), dispatcher="alltoall", swept=())
    b = fake_run(tmp_path, "b", noisy(100, 23, rng), dispatcher="allgather", seq=256, swept=())
    assert compare.main([str(a), str(b), "--variable", "dispatcher"]) == compare.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "refused" in err and "train.seq_length: 128 vs 256" in err


def test_acceptance_gate(tmp_path, capsys):
    rng = random.Random(5)
    short = fake_run(tmp_path, "short", noisy(100, 20, rng), label="benchmark-only", window=[15, 20])
    assert compare.main(["--accept", str(short)]) == compare.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "benchmark-only" in err and "acceptance needs >= 10" in err and "acceptance needs >= 50" in err
    good = fake_run(tmp_path, "good", noisy(100, 50, rng), window=[41, 50])
    assert compare.main(["--accept", str(good), "--variable", "dispatcher"]) == 0
    assert "accepted" in capsys.readouterr().out
    no_evidence = fake_run(tmp_path, "noev", noisy(100, 50, rng), window=[41, 50], evidence={"x": 1})
    assert compare.main(["--accept", str(no_evidence), "--variable", "dispatcher"]) == compare.EXIT_REFUSED
    assert "evidence.dispatcher_class missing" in capsys.readouterr().err


def test_bad_inputs_are_skipped_with_a_warning_never_mixed_in(tmp_path):
    rng = random.Random(6)
    fake_run(tmp_path, "0", noisy(100, 23, rng), dispatcher="alltoall")
    fake_run(tmp_path, "1", noisy(100, 23, rng), dispatcher="allgather")
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "results.json").write_text('{"status": "ok", "step_ti')  # truncated
    failed = fake_run(tmp_path, "3", noisy(50, 23, rng), dispatcher="allgather")
    data = json.loads((failed / "results.json").read_text())
    (failed / "results.json").write_text(json.dumps({**data, "status": "failed"}))
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "plan.json").write_text("{}")
    warnings = []
    runs = compare.load([tmp_path], warnings.append)
    assert len(runs) == 2
    text = "\n".join(warnings)
    assert "2/results.json: unreadable or truncated" in text and "3/results.json: status 'failed'" in text
    assert "4: a plan without results" in text


def test_diff_orders_the_first_differing_knob_first_and_names_the_walls(tmp_path):
    rng = random.Random(7)
    a = fake_run(tmp_path, "a", noisy(100, 23, rng), dispatcher="alltoall", swept=(), host_time_ms=None)
    b = fake_run(tmp_path, "b", noisy(150, 23, rng), dispatcher="allgather", seq=256, swept=(),
                 peak_memory_gib={"rss": 0.9})
    report = compare.diagnose(*compare.load([a, b], print))
    assert [k for k, _, _ in report["config"]][:2] == ["dispatcher.name", "train.seq_length"]
    assert report["walls"]["memory"].startswith("moved") and report["walls"]["communication"].startswith("unknown")
    assert report["walls"]["compute"].startswith("unknown")  # no device time on a CPU
    assert compare.main(["--diff", str(a), str(b)]) == 0


@pytest.mark.slow
def test_real_runs_a_known_effect_is_detected(cli, tmp_path):
    r = cli("logger=none", "model.num_layers=2,8", "contract.window=[4,13]", "-m", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (comp,) = compare.compare(compare.load([tmp_path / "multi"], print))
    (effect,) = comp.effects.values()
    assert comp.variables == ["model.num_layers"] and effect.verdict == SLOWER, effect


def test_one_run_arms_count_only_beyond_the_run_to_run_noise(tmp_path):
    rng = random.Random(8)

    def runs(delta):
        root = tmp_path / f"d{delta}-{rng.random()}"
        for name, disp, mean in (("0", "alltoall", 100), ("1", "allgather", 100 + delta)):
            d = fake_run(root, name, noisy(mean, 23, rng, sd=1.0), dispatcher=disp)
            res = json.loads((d / "results.json").read_text())
            res["contract"]["hardware"] = {"run_to_run_noise": 0.2}
            (d / "results.json").write_text(json.dumps(res))
        return compare.load([root], print)

    (small,) = compare.compare(runs(10))  # +10 %: clear within a run, inside the 20 % run-to-run noise
    (e,) = small.effects.values()
    assert e.verdict == SAME and e.floor == 0.2 and e.ci_low > 0 and "20%" in small.notes[0]
    (large,) = compare.compare(runs(50))
    assert next(iter(large.effects.values())).verdict == SLOWER
    (forced,) = compare.compare(runs(10), noise_floor=0.0)
    assert next(iter(forced.effects.values())).verdict == SLOWER


@pytest.mark.slow
def test_real_runs_a_a_repeats_are_not_called_different(cli, tmp_path):
    r = cli("logger=none", "repeat=0,1,2", "contract.window=[4,13]", "-m", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (comp,) = compare.compare(compare.load([tmp_path / "multi"], print), ["repeat"])
    assert len(comp.effects) == 2
    assert all(e.verdict == SAME for e in comp.effects.values()), comp.effects
