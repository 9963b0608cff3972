"""Compare: verdicts with confidence, refusals, acceptance, regression diagnosis, robustness."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

from moe_hydra.analysis import compare, diagnosis, figures
from moe_hydra.analysis.runs import load as load_runs
from moe_hydra.commands import run_command
from moe_hydra.core import contract, stats
from moe_hydra.core.errors import EXIT_FAILED, EXIT_REFUSED, Refused
from moe_hydra.core.stats import EQUIVALENT, FASTER, SAME, SLOWER, UNDECIDED, welch

BASE_CONTRACT = {"dispatcher": {"name": "alltoall"}, "train": {"seq_length": 128}, "parallel": {"ep": 1}}


def fake_run(root: Path, name: str, times: list[float], *, dispatcher="alltoall", seq=128, swept=("dispatcher",),
             label="training-equivalent", window=None, steps=None, legacy=False, **extra) -> Path:
    """A run directory with a results.json as the job writes it (``legacy``: as written before results_version and
    run_id existed); ``extra`` keys replace the written ones."""
    c = json.loads(json.dumps(BASE_CONTRACT))
    c["dispatcher"]["name"], c["train"]["seq_length"] = dispatcher, seq
    window = window or [4, len(times)]
    d = root / name
    d.mkdir(parents=True)
    stamp = {} if legacy else {"results_version": 1, "run_id": uuid.uuid4().hex}
    res = {**stamp, "status": "ok", "stage": "run", "contract": c, **contract.hashes(c, list(swept)),
           "swept": list(swept), "step_times_ms": times, "window": window, "steps": steps or len(times),
           "step_time_ms": sum(times) / len(times),
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
    assert run_command("compare", [str(tmp_path)]) == 0
    md = (tmp_path / "compare.md").read_text()
    assert "dispatcher=allgather" in md and "slower" in md and (tmp_path / "compare.png").stat().st_size > 1000
    # the figure draws what compare.json says: each arm's run means, the difference, its interval, the noise floor
    (drawn,) = figures.drawn(tmp_path / "compare.png")["compare"]
    (pair,) = json.loads((tmp_path / "compare.json").read_text())["pairs"]
    assert drawn["ci"] == pair["ci"] and drawn["relative_difference"] == pair["relative_difference"] > 0.2
    assert drawn["verdict"] == "slower" and drawn["noise_floor"] == pair["noise_floor"]["value"]
    assert drawn["arms"] == pair["arms"] and [len(v) for v in drawn["run_means_ms"].values()] == [1, 1]


def test_warmup_steps_never_enter(tmp_path):
    rng = random.Random(2)
    a = fake_run(tmp_path, "a", [900.0] * 3 + noisy(100, 20, rng), dispatcher="alltoall")
    b = fake_run(tmp_path, "b", [100.0] * 3 + noisy(100, 20, rng), dispatcher="allgather")
    (comp,) = compare.compare(load_runs([a, b], print).runs, ["dispatcher"])
    (effect,) = comp.effects.values()
    assert effect.verdict == SAME and effect.n_a == effect.n_b == 20


def test_repeated_arms_use_the_run_as_unit(tmp_path):
    rng = random.Random(3)
    for i in range(3):
        fake_run(tmp_path, f"a{i}", noisy(100 + i, 23, rng), dispatcher="alltoall", swept=("dispatcher", "repeat"))
        fake_run(tmp_path, f"b{i}", noisy(150 + i, 23, rng), dispatcher="allgather", swept=("dispatcher", "repeat"))
    (comp,) = compare.compare(load_runs([tmp_path], print).runs)
    (effect,) = comp.effects.values()
    assert effect.unit == "runs" and effect.n_a == 3 and effect.verdict == SLOWER and not comp.notes


def test_runs_from_different_contracts_are_refused_with_the_diff(tmp_path, capsys):
    rng = random.Random(4)
    a = fake_run(tmp_path, "a", noisy(100, 23, rng), dispatcher="alltoall", swept=())
    b = fake_run(tmp_path, "b", noisy(100, 23, rng), dispatcher="allgather", seq=256, swept=())
    assert run_command("compare", [str(a), str(b), "--variable", "dispatcher"]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "refused" in err and "train.seq_length: 128 vs 256" in err


def test_acceptance_gate(tmp_path, capsys):
    rng = random.Random(5)
    short = fake_run(tmp_path, "short", noisy(100, 20, rng), label="benchmark-only", window=[15, 20])
    assert run_command("accept", [str(short)]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "benchmark-only" in err and "acceptance needs >= 10" in err and "acceptance needs >= 50" in err
    good = fake_run(tmp_path, "good", noisy(100, 50, rng), window=[41, 50])
    assert run_command("accept", [str(good), "--variable", "dispatcher"]) == 0
    assert "accepted" in capsys.readouterr().out
    no_evidence = fake_run(tmp_path, "noev", noisy(100, 50, rng), window=[41, 50], evidence={"x": 1})
    assert run_command("accept", [str(no_evidence), "--variable", "dispatcher"]) == EXIT_REFUSED
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
    loaded = load_runs([tmp_path], warnings.append)
    assert len(loaded.runs) == 2 and len(loaded.rejected) == 2
    text = "\n".join(warnings)
    assert "2/results.json: truncated or not JSON" in text and "3/results.json: status 'failed'" in text
    assert "4: a plan without results" in text


def test_diff_orders_the_first_differing_knob_first_and_names_the_walls(tmp_path):
    rng = random.Random(7)
    a = fake_run(tmp_path, "a", noisy(100, 23, rng), dispatcher="alltoall", swept=(), host_time_ms=None)
    b = fake_run(tmp_path, "b", noisy(150, 23, rng), dispatcher="allgather", seq=256, swept=(),
                 peak_memory_gib={"rss": 0.9})
    report = diagnosis.diagnose(*load_runs([a, b], print, need_steady=False).runs, print)
    assert [k for k, _, _ in report["config"]][:2] == ["dispatcher.name", "train.seq_length"]
    assert report["walls"]["memory"].startswith("moved") and report["walls"]["communication"].startswith("unknown")
    assert report["walls"]["compute"].startswith("unknown")  # no device time on a CPU
    assert run_command("diff", [str(a), str(b)]) == 0


def test_diff_states_what_changes_the_reading_and_reads_each_figure_against_the_noise(tmp_path, capsys):
    """A profile=window run of 15 steps against a plain one of 10: the config is the same, but the diff says the
    steps, the window and the profiling differ, reads the loss at step 10 in both (not 15 against 10) and puts the
    step time's change beside the noise it is read against (declared 20 %: -21.6 % alone meant nothing)."""
    rng = random.Random(11)
    loss = [7.0 - 0.1 * i for i in range(15)]
    a = fake_run(tmp_path, "plain", noisy(100, 10, rng), swept=(), loss={"first": 7.0, "last": loss[9],
                 "per_step": loss[:10], "all_finite": True, "nan_or_skipped": 0}, profile_steps=None, profile=None)
    b = fake_run(tmp_path, "traced", noisy(80, 15, rng), swept=(), window=[4, 15],
                 loss={"first": 7.0, "last": loss[14], "per_step": loss, "all_finite": True, "nan_or_skipped": 0},
                 profile_steps=[11, 13], profile={"steps": [11, 13]})
    for d in (a, b):  # the declared noise of a shared CPU
        res = json.loads((d / "results.json").read_text())
        res["contract"]["hardware"] = {"run_to_run_noise": 0.2}
        (d / "results.json").write_text(json.dumps(res))
    report = diagnosis.diagnose(*load_runs([a, b], print, need_steady=False).runs, print)
    assert report["config"] == []
    reading = {what: (va, vb) for what, va, vb, _ in report["reading"]}
    assert reading["steps"] == (10, 15) and list(map(list, reading["window measured"])) == [[4, 10], [4, 15]]
    assert "profiled steps" in reading and report["metric"] == contract.STEP_TIME
    assert ("loss at step 10" in report["metrics"] and "loss.last" not in report["metrics"]
            and report["metrics"]["loss at step 10"][2] == 0)
    va, vb, rel, noise = report["metrics"]["step_time_ms"]
    assert rel < -0.1 and "against the run-to-run noise 20.0% (declared)" in noise
    assert report["step_time"]["verdict"] == UNDECIDED and report["noise_floor"]["value"] == 0.2
    assert run_command("diff", [str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "reading (3 differences" in out and "profile=window" in out and "run-to-run noise 20.0%" in out


def test_diff_of_runs_that_train_different_work_judges_time_per_token(tmp_path):
    rng = random.Random(12)
    a = fake_run(tmp_path, "a", noisy(100, 20, rng), swept=())
    b = fake_run(tmp_path, "b", noisy(150, 20, rng), seq=256, swept=())  # twice the tokens, 1.5x the time
    for d in (a, b):  # what Work.of reads: the batch, the GPUs
        res = json.loads((d / "results.json").read_text())
        res["contract"]["train"].update(global_batch_size=8, micro_batch_size=4)
        res["contract"]["hardware"] = {"nodes": 1, "devices_per_node": 1, "run_to_run_noise": 0.02}
        (d / "results.json").write_text(json.dumps(res))
    report = diagnosis.diagnose(*load_runs([a, b], print, need_steady=False).runs, print)
    assert report["metric"] == contract.THROUGHPUT and report["unlike"] is None  # seq_length is a work key
    assert report["step_time"]["verdict"] == FASTER  # per token: 0.75 of the time
    assert any(what == "tokens a step per GPU" for what, *_ in report["reading"])


@pytest.mark.slow
@pytest.mark.serial
def test_real_runs_a_known_effect_is_detected(cli, tmp_path):
    r = cli("logger=none", "model.num_layers=2,8", "contract.window=auto", "-m", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (comp,) = compare.compare(load_runs([tmp_path / "multi"], print).runs)
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
        return load_runs([root], print).runs

    (small,) = compare.compare(runs(10))  # +10 %: clear within a run, inside the 20 % run-to-run noise
    (e,) = small.effects.values()
    assert e.verdict == SAME and e.floor == 0.2 and e.ci_low > 0 and "20%" in small.notes[0]
    (large,) = compare.compare(runs(50))
    assert next(iter(large.effects.values())).verdict == SLOWER
    (forced,) = compare.compare(runs(10), noise_floor=0.0)
    assert next(iter(forced.effects.values())).verdict == SLOWER


@pytest.mark.slow
@pytest.mark.serial
def test_real_runs_a_a_repeats_are_not_called_different(cli, tmp_path):
    """Three runs of one config: not different beyond the declared floor, nor against the noise measured on them
    (python -m moe_hydra.noise; compare --noise: source measured in compare.json)."""
    r = cli("logger=none", "repeat=0,1,2", "contract.window=auto", "-m", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (comp,) = compare.compare(load_runs([tmp_path / "multi"], print).runs, ["repeat"])
    assert len(comp.effects) == 2
    assert all(e.verdict == SAME for e in comp.effects.values()), comp.effects

    assert run_command("noise", [str(tmp_path / "multi")]) == 0
    assert run_command("compare", [str(tmp_path / "multi"), "--variable", "repeat", "--noise",
                         str(tmp_path / "multi" / "noise.json"), "--out", str(tmp_path / "cmp")]) == 0
    pairs = json.loads((tmp_path / "cmp" / "compare.json").read_text())["pairs"]
    assert len(pairs) == 2 and all(p["verdict"] not in (FASTER, SLOWER) for p in pairs), pairs
    assert {p["noise_floor"]["source"] for p in pairs} == {"measured"}


# --------------------------------------------------------------------------- hardening (issue 15)

VERDICT_WORD = re.compile(r"\b(faster|slower)\b")


def one_run_per_arm(root: Path, seed: int = 9, **extra) -> Path:
    """A sweep directory D: one alltoall and one allgather run, 30 % apart (alone, a clear 'slower')."""
    rng = random.Random(seed)
    fake_run(root, "0", noisy(100, 23, rng), dispatcher="alltoall", **extra)
    fake_run(root, "1", noisy(130, 23, rng), dispatcher="allgather", **extra)
    return root


def rewrite(d: Path, **changes) -> None:
    """Change keys of the results.json in ``d`` (a value of ``...`` deletes the key)."""
    res = json.loads((d / "results.json").read_text())
    res.update(changes)
    (d / "results.json").write_text(json.dumps({k: v for k, v in res.items() if v is not ...}))


def test_alone_the_fixture_gives_a_verdict(tmp_path, capsys):
    """The control for the duplicate tests below: the same directory given once is called slower."""
    d = one_run_per_arm(tmp_path / "D")
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == 0
    assert "slower" in capsys.readouterr().out


@pytest.mark.parametrize("legacy", [False, True], ids=["run_id", "version-0"])
@pytest.mark.parametrize("given", ["D D", "D D/0 D/1", "D copy", "D/0 D/1 copy/0 copy/1"])
def test_a_run_given_twice_is_counted_once_and_never_a_verdict(tmp_path, capsys, given, legacy):
    """Old code: the same runs counted as repeats gave a zero-variance 'faster'/'slower' (MDE 0.00 %)."""
    d = one_run_per_arm(tmp_path / "D", legacy=legacy)
    shutil.copytree(d, tmp_path / "copy")
    args = [str(tmp_path / a) for a in given.split()]
    assert run_command("compare", [*args, "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    same = "same file" if "copy" not in given else "same run_id" if not legacy else "same step times"
    assert f"counted once: {same} as" in captured.err, captured.err
    assert not VERDICT_WORD.search(captured.out), captured.out
    md = (tmp_path / "out" / "compare.md").read_text()
    assert compare.DUPLICATED in md and not VERDICT_WORD.search(md.split("## Skipped")[0])


def test_repeated_arms_given_twice_count_each_run_once(tmp_path):
    rng, swept = random.Random(10), ("dispatcher", "repeat")
    for i in range(3):
        fake_run(tmp_path / "D", f"a{i}", noisy(100 + i, 23, rng), dispatcher="alltoall", swept=swept)
        fake_run(tmp_path / "D", f"b{i}", noisy(150 + i, 23, rng), dispatcher="allgather", swept=swept)
    loaded = load_runs([tmp_path / "D", tmp_path / "D"], print)
    (comp,) = compare.compare(loaded.runs)
    (effect,) = comp.effects.values()
    assert len(loaded.runs) == 6 and effect.n_a == effect.n_b == 3 and effect.verdict == compare.DUPLICATED


NOT_RESULTS = {  # written as results.json text -> a field the warning must name
    "[]": "not a JSON object", "42": "not a JSON object", "null": "not a JSON object", '"ok"': "not a JSON object",
    '{"status": "ok", "step_ti': "truncated or not JSON", "\xff\xfe": "not UTF-8",
}
BAD_FIELDS = {  # changes to a valid results.json (23 steps) -> the field the warning must name
    "window [5,9] beyond the steps": ({"window": [5, 99]}, "window [5, 99] is outside the 23 steps run"),
    "window [3,2]": ({"window": [3, 2]}, "window [3, 2] is not [first, last] with 1 <= first <= last"),
    "window [0,3]": ({"window": [0, 3]}, "window [0, 3] is not"),
    "window null": ({"window": None}, "window is null"),
    "window missing": ({"window": ...}, "window is missing"),
    "steps missing": ({"steps": ...}, "steps is missing"),
    "steps wrong": ({"steps": 7}, "steps 7 is not the 23 entries of step_times_ms"),
    "loss missing": ({"loss": ...}, "loss is missing"),
    "loss nan": ({"loss": {"first": float("nan"), "last": 6.0, "all_finite": True, "nan_or_skipped": 0}},
                 "loss.first is nan"),
    "version 7": ({"results_version": 7}, "results_version 7 is not 1"),
    "empty run_id": ({"run_id": ""}, "run_id is \"\""),
    "status": ({"status": "done"}, "status is \"done\" (want one of ok, failed, interrupted, terminated)"),
    "contract a list": ({"contract": []}, "contract is []"),
    "noise negative": ({"contract": {**BASE_CONTRACT, "hardware": {"run_to_run_noise": -0.5}}},
                       "contract.hardware.run_to_run_noise is -0.5"),
}


@pytest.mark.parametrize("text", list(NOT_RESULTS), ids=list(NOT_RESULTS.values()))
def test_any_json_value_is_skipped_with_a_warning(tmp_path, capsys, text):
    """Old code: AttributeError on [], 42, null."""
    d = one_run_per_arm(tmp_path / "D")
    (d / "1" / "results.json").write_bytes(text.encode("latin-1"))
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == EXIT_REFUSED  # one run left
    err = capsys.readouterr().err
    assert f"skipped {d / '1' / 'results.json'}: " in err and NOT_RESULTS[text] in err, err


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_a_results_file_against_the_schema_is_skipped_naming_the_field(tmp_path, capsys, case):
    """Old code: ValueError/TypeError on the windows, KeyError on missing keys, the rest compared as they were."""
    changes, named = BAD_FIELDS[case]
    d = one_run_per_arm(tmp_path / "D")
    rewrite(d / "1", **changes)
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err, err


@pytest.mark.parametrize("bad, named", [
    (0.0, "step_times_ms[0] is 0.0"), (-5.0, "step_times_ms[5] is -5.0"), (float("nan"), "step_times_ms[5] is nan"),
    (float("inf"), "step_times_ms[5] is inf"), (1e300, "step_times_ms[5] is 1e+300"),
], ids=["all zero", "negative", "nan", "inf", "huge"])
def test_non_finite_zero_or_negative_step_times_never_enter(tmp_path, capsys, bad, named):
    """Old code: NaN/inf gave 'no significant difference' (+nan %); an all-zero baseline a ZeroDivisionError."""
    d = one_run_per_arm(tmp_path / "D")
    times = json.loads((d / "0" / "results.json").read_text())["step_times_ms"]
    rewrite(d / "0", step_times_ms=[bad] * len(times) if bad == 0.0 else times[:5] + [bad] + times[6:])
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert named in err and "1 distinct complete run(s)" in err, err


def test_a_stopped_run_is_listed_never_compared(tmp_path, capsys):
    rng = random.Random(11)
    d = one_run_per_arm(tmp_path / "D")
    fake_run(d, "2", noisy(60, 5, rng), dispatcher="allgather", window=[4, 400], status="terminated", signal="SIGTERM")
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "2/results.json: status terminated (SIGTERM) after 5 steps; window [4, 400], steps 4..5 measured" in err
    loaded = load_runs([d], print)
    assert [r.path.name for r in loaded.stopped] == ["2"] and len(loaded.runs) == 2
    assert "not compared" in (tmp_path / "out" / "compare.md").read_text()
    assert run_command("accept", [str(d / "2")]) == EXIT_REFUSED
    assert "status terminated" in capsys.readouterr().err


def test_a_window_of_one_step_is_no_comparison_not_a_crash(tmp_path, capsys):
    """Old code: stats.welch raised ValueError (fewer than 2 samples)."""
    d = one_run_per_arm(tmp_path / "D")
    rewrite(d / "1", window=[5, 5])
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == 0
    assert "no comparison, 20 and 1 steady samples" in capsys.readouterr().out


def good_accept_run(root: Path, name: str = "good", **changes) -> Path:
    d = fake_run(root, name, noisy(100, 50, random.Random(12)), window=[41, 50])
    rewrite(d, **changes)
    return d


@pytest.mark.parametrize("changes, named", [
    ({"step_times_ms": [float("nan")] * 50}, "step_times_ms[0] is nan"),
    ({"step_times_ms": [-100.0] + [100.0] * 49}, "step_times_ms[0] is -100.0"),
    ({"window": [41, 500]}, "window [41, 500] is outside the 50 steps run"),
    ({"loss": {"first": 7.0, "last": float("nan"), "per_step": [7.0] * 49 + [float("nan")], "all_finite": True,
               "nan_or_skipped": 0}}, "loss.last is nan (want a finite number) (loss.all_finite says true)"),
    ({"loss": ...}, "loss is missing"),
    ({"steps": ...}, "steps is missing"),
    ({"tokens_per_s_per_gpu": None, "step_time_ms": ...}, None),  # not refused: the report prints what is there
], ids=["nan steps", "negative step", "window [41,500]", "nan loss flagged finite", "no loss", "no steps",
        "no figures"])
def test_accept_refuses_what_the_schema_refuses(tmp_path, capsys, changes, named):
    """Old code: accepted NaN/negative step times, a window past the steps and NaN losses flagged finite; KeyError on
    a missing loss or steps."""
    d = good_accept_run(tmp_path, **changes)
    code = run_command("accept", [str(d), "--variable", "dispatcher"])
    captured = capsys.readouterr()
    if named is None:
        assert code == 0 and "tokens/s/GPU" in captured.out
    else:
        assert code == EXIT_REFUSED and "not accepted" in captured.err and named in captured.err, captured.err


@pytest.mark.parametrize("changes, named", [({"loss": ...}, "loss is missing"), ({"steps": ...}, "steps is missing")])
def test_diff_refuses_a_run_without_the_keys_it_reads(tmp_path, capsys, changes, named):
    """Old code: KeyError."""
    d = one_run_per_arm(tmp_path / "D")
    rewrite(d / "1", **changes)
    assert run_command("diff", [str(d / "0"), str(d / "1")]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "diff takes two run directories" in err and named in err


@pytest.mark.parametrize("env", ["{not json", "[]", "\xff"])
def test_diff_survives_a_corrupt_env_json(tmp_path, capsys, env):
    """Old code: JSONDecodeError (or AttributeError on a list)."""
    d = one_run_per_arm(tmp_path / "D")
    (d / "0" / "env.json").write_text(json.dumps({"versions": {"torch": "2.13.0"}}))
    (d / "1" / "env.json").write_bytes(env.encode("latin-1"))
    assert run_command("diff", [str(d / "0"), str(d / "1")]) == 0
    captured = capsys.readouterr()
    assert f"{d / '1' / 'env.json'}: " in captured.err and "left out of the diff" in captured.err
    assert "walls" in captured.out


def test_diff_of_a_run_with_itself_is_refused(tmp_path, capsys):
    d = one_run_per_arm(tmp_path / "D")
    assert run_command("diff", [str(d / "0"), str(d / "0")]) == EXIT_REFUSED
    assert "counted once: same file" in capsys.readouterr().err


def test_out_holds_the_files_and_is_printed(tmp_path, capsys):
    d = one_run_per_arm(tmp_path / "D")
    out = tmp_path / "new" / "out"
    assert run_command("compare", [str(d), "--out", str(out)]) == 0
    assert (out / "compare.md").is_file() and (out / "compare.png").stat().st_size > 1000
    assert not (d / "compare.md").exists() and f"written: {out / 'compare.md'}" in capsys.readouterr().out


def test_a_read_only_or_missing_first_directory_writes_to_the_current_one(tmp_path, monkeypatch, capsys):
    """Old code: wrote into the first directory (PermissionError on a read-only archive, FileNotFoundError when
    it is missing), after printing the verdict."""
    d = one_run_per_arm(tmp_path / "D")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    access = os.access  # root writes anywhere: say what a read-only mount says for D
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == d else access(p, mode, **kw))
    d.chmod(0o555)
    try:
        assert run_command("compare", [str(d)]) == 0
    finally:
        d.chmod(0o755)
    assert (cwd / "compare.md").is_file() and not (d / "compare.md").exists()
    assert run_command("compare", [str(tmp_path / "gone" / "away"), str(d)]) == 0  # missing, and its parent too
    assert "skipped" in capsys.readouterr().err


def test_an_unwritable_out_is_an_error_not_a_traceback(tmp_path, capsys):
    d = one_run_per_arm(tmp_path / "D")
    (tmp_path / "file").write_text("")
    assert run_command("compare", [str(d), "--out", str(tmp_path / "file" / "sub")]) == EXIT_FAILED
    captured = capsys.readouterr()
    assert "slower" in captured.out and "cannot write compare.md, compare.png" in captured.err


@pytest.mark.parametrize("floor", ["nan", "-0.1", "1.5", "inf"])
def test_a_bad_noise_floor_is_refused(tmp_path, floor):
    with pytest.raises(SystemExit) as e:
        run_command("compare", [str(tmp_path), "--noise-floor", floor])
    assert e.value.code == EXIT_REFUSED


def test_arm_names_are_text_not_markup_or_mathtext(tmp_path):
    """Old code: rich read '[/]' as a closing tag (MarkupError); matplotlib a '$' as a formula."""
    rng = random.Random(13)
    fake_run(tmp_path, "0", noisy(100, 23, rng), dispatcher="[/]$\\frac")
    fake_run(tmp_path, "1", noisy(100, 23, rng), dispatcher="[bold]$x^$")
    assert run_command("compare", [str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "[/]$\\frac" in (tmp_path / "out" / "compare.md").read_text()


# --------------------------------------------------------------------------- noise floors and equivalence (issue 19)


def test_welch_is_scipys_welch():
    from scipy import stats as st

    rng = random.Random(14)
    a, b = noisy(100, 20, rng), noisy(103, 12, rng, sd=6.0)
    e, ref = welch(a, b, "steps"), st.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert e.df == pytest.approx(ref.df) and e.p_value == pytest.approx(ref.pvalue)
    assert (e.ci_low, e.ci_high) == pytest.approx((ci.low / e.mean_a_ms, ci.high / e.mean_a_ms))


def repeated(root: Path, deltas: dict[str, float], runs: int, seed: int, run_sd: float = 1.0) -> Path:
    """Arms of ``runs`` repeats each: dispatcher -> relative difference of its true mean (run-to-run sd ``run_sd``
    ms, steps 3 ms around it)."""
    rng, swept = random.Random(seed), ("dispatcher", "repeat")
    for disp, delta in deltas.items():
        for i in range(runs):
            fake_run(root, f"{disp}{i}", noisy(100 * (1 + delta) + rng.gauss(0, run_sd), 23, rng), dispatcher=disp,
                     swept=swept)
    return root


def test_repeated_a_a_arms_are_equivalent_within_the_declared_margin(tmp_path, capsys):
    d = repeated(tmp_path / "D", {"alltoall": 0.0, "allgather": 0.0}, runs=6, seed=15)
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == 0
    rec = json.loads((tmp_path / "out" / "compare.json").read_text())
    (pair,) = rec["pairs"]
    assert pair["verdict"] == EQUIVALENT and pair["unit"] == "runs" and pair["runs"] == {"dispatcher=alltoall": 6,
                                                                                         "dispatcher=allgather": 6}
    eq = pair["equivalence"]
    assert eq["p_value"] < 0.05 and -eq["margin"] < eq["ci90"][0] < eq["ci90"][1] < eq["margin"]
    # the margin is the declared 5 %, whatever the noise (it was twice the runs' noise: 1.7 % here)
    assert eq["margin"] == stats.EQUIVALENCE == 0.05 and pair["noise_floor"]["run_mean_noise"] * 2 < 0.05
    # the interval printed beside the verdict is the one the test read: the 90 % one, not the 95 % column
    shown = f"equivalent within ±5.00% (90% CI [{eq['ci90'][0]:+.2%}, {eq['ci90'][1]:+.2%}])"
    assert shown in (tmp_path / "out" / "compare.md").read_text()
    assert "equivalent within" in capsys.readouterr().out
    # a margin tighter than these runs can show: undecided, with the runs per arm that would show it
    assert run_command("compare", [str(d), "--equivalence", "0.8%", "--out", str(tmp_path / "tight")]) == 0
    tight = json.loads((tmp_path / "tight" / "compare.json").read_text())["pairs"][0]
    assert tight["verdict"] == UNDECIDED and tight["equivalence"]["runs_needed"] > 6
    assert f"about {tight['equivalence']['runs_needed']} runs per arm would show equivalence within ±0.80%" in \
        (tmp_path / "tight" / "compare.md").read_text()
    # a margin inside the measured difference: no number of runs shows it, and it says so
    assert run_command("compare", [str(d), "--equivalence", "0.01%", "--out", str(tmp_path / "inside")]) == 0
    inside = json.loads((tmp_path / "inside" / "compare.json").read_text())["pairs"][0]
    assert inside["verdict"] == UNDECIDED and inside["equivalence"]["runs_needed"] is None
    assert "the difference is at the ±0.01% margin" in (tmp_path / "inside" / "compare.md").read_text()


def test_runs_needed_gives_equivalence_about_as_often_as_it_plans_for():
    """stats.runs_needed, checked by simulation: A/A runs with 4 % run noise at 3 per arm are undecided within
    ±3 %; at the runs it names, the TOST shows equivalence in about 80 % of new campaigns (normal approximation)."""
    rng = np.random.default_rng(3)
    sigma, margin = 4.0, 0.03
    first = stats.welch(list(100 + sigma * rng.standard_normal(3)), list(100 + sigma * rng.standard_normal(3)),
                        "runs", margin=margin)
    assert first.verdict == UNDECIDED and first.runs_needed and first.runs_needed > 3
    # from a measured difference of 0 and a known se, as the estimate assumes
    k = stats.runs_needed(3, sigma * math.sqrt(2 / 3), margin * 100)
    wins = sum(stats.welch(list(100 + sigma * rng.standard_normal(k)), list(100 + sigma * rng.standard_normal(k)),
                           "runs", margin=margin).verdict == EQUIVALENT for _ in range(400))
    assert 0.7 < wins / 400 < 0.95, (k, wins)
    assert stats.runs_needed(3, 1.0, 0.0) is None and stats.runs_needed(3, 1.0, -1.0) is None


def test_a_difference_wins_over_equivalence_and_a_declared_floor_never_claims_it(tmp_path):
    d = repeated(tmp_path / "D", {"alltoall": 0.0, "allgather": 0.3}, runs=4, seed=16)
    (comp,) = compare.compare(load_runs([d], print).runs, baseline="dispatcher=alltoall", equivalence=0.9)  # slower
    assert comp.effects["dispatcher=allgather"].verdict == SLOWER
    one = one_run_per_arm(tmp_path / "one")
    (comp,) = compare.compare(load_runs([one], print).runs, noise_floor=0.5, equivalence=0.9)
    e = comp.effects["dispatcher=allgather"]
    assert e.verdict == UNDECIDED and e.margin is None and comp.noise["dispatcher=allgather"].source == "--noise-floor"


def test_compare_json_holds_every_pair_with_its_noise_floor(tmp_path):
    d = one_run_per_arm(tmp_path / "D")
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == 0
    rec = json.loads((tmp_path / "out" / "compare.json").read_text())
    (pair,) = rec["pairs"]
    assert rec["compare_version"] == 1 and pair["variable"] == "dispatcher"
    assert pair["arms"] == ["dispatcher=alltoall", "dispatcher=allgather"] and pair["verdict"] == SLOWER
    assert pair["noise_floor"] == {"value": 0.0, "source": "declared"}  # the fixture declares none
    assert pair["relative_difference"] > 0.2 and pair["ci"][0] > 0 and pair["mde"] > 0 and pair["equivalence"] is None
    assert rec["notes"] and rec["sequential"] is None


@pytest.mark.parametrize("margin", ["0", "1", "-2%", "nan", "abc"])
def test_a_bad_equivalence_margin_is_refused(tmp_path, margin):
    with pytest.raises(SystemExit) as e:
        run_command("compare", [str(tmp_path), "--equivalence", margin])
    assert e.value.code == EXIT_REFUSED


def test_a_sequential_sweep_is_noted_with_its_own_verdict(tmp_path, capsys):
    d = one_run_per_arm(tmp_path / "D")
    (d / "sequential.json").write_text(json.dumps({"status": "decided", "pairs": [
        {"baseline": "dispatcher=alltoall", "candidate": "dispatcher=allgather", "verdict": "slower"}],
        "runs_used": {"dispatcher=alltoall": 3, "dispatcher=allgather": 3}}))
    assert run_command("compare", [str(d), "--out", str(tmp_path / "out")]) == 0
    assert "repeat=auto" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["sequential"][0]["status"] == "decided"


def work_run(root: Path, name: str, times: list[float], gbs: int, swept: tuple[str, ...], mbs: int = 1) -> Path:
    """A fake run whose contract says the work of its step: ``gbs`` sequences of 128 tokens on one GPU."""
    c = {**json.loads(json.dumps(BASE_CONTRACT)), "hardware": {"nodes": 1, "devices_per_node": 1},
         "parallel": {"ep": 1, "data_parallel_size": 1}}
    c["train"] = {"seq_length": 128, "global_batch_size": gbs, "micro_batch_size": mbs}
    return fake_run(root, name, times, swept=swept, contract=c, **contract.hashes(c, list(swept)),
                    tracking={"job_type": f"{swept[0]}={gbs if 'global' in swept[0] else mbs}"})


def test_a_design_that_varies_the_work_a_step_is_judged_on_tokens_per_s(tmp_path):
    """train.global_batch_size swept on purpose: twice the tokens in 1.5 times the step time is faster in tokens/s/GPU,
    though slower a step; the test runs on time per token and says so."""
    rng = random.Random(3)
    work_run(tmp_path, "0", noisy(100, 23, rng), 8, ("train.global_batch_size",))
    work_run(tmp_path, "1", noisy(150, 23, rng), 16, ("train.global_batch_size",))
    loaded = load_runs([tmp_path], lambda m: None).runs
    [comp] = compare.compare(loaded, noise_floor=0.05)
    e = comp.effects["train.global_batch_size=16"]
    assert comp.metric == contract.THROUGHPUT and e.verdict == FASTER, (comp.metric, e)
    assert e.rel_step_time == pytest.approx(150 / 16 / (100 / 8) - 1, abs=0.02)  # time per token
    assert e.rel_tokens_per_s == pytest.approx(100 / 8 / (150 / 16) - 1, abs=0.03)
    assert any("judged on tokens/s/GPU" in n for n in comp.notes)


def test_arms_whose_batch_follows_the_variable_are_refused_with_the_fix(tmp_path):
    """A micro batch swept while the global batch follows it (4 vs 5 sequences a step): never judged on step time."""
    rng = random.Random(4)
    work_run(tmp_path, "0", noisy(100, 23, rng), 4, ("train.micro_batch_size",), mbs=4)
    work_run(tmp_path, "1", noisy(110, 23, rng), 5, ("train.micro_batch_size",), mbs=5)
    loaded = load_runs([tmp_path], lambda m: None).runs
    with pytest.raises(Refused) as e:
        compare.compare(loaded)
    assert "train different work a step" in str(e.value) and "train.global_batch_size=20" in str(e.value)


def test_measure_is_step_time_for_like_work_and_refuses_unlike_work_unless_it_is_the_variable():
    same, more = contract.Work(512, 1, 4), contract.Work(640, 1, 5)
    assert contract.measure([same, same], ["train.micro_batch_size"]) == contract.STEP_TIME
    assert contract.measure([same, more], ["train.global_batch_size"]) == contract.THROUGHPUT
    assert contract.measure([same, contract.Work(1024, 2, 4)], ["hardware.nodes"]) == contract.THROUGHPUT
    assert contract.measure([same, None], ["dispatcher"]) == contract.STEP_TIME  # a contract that does not say
    with pytest.raises(Refused, match=r"train.global_batch_size=20 "):
        contract.measure([same, more], ["train.micro_batch_size"])
