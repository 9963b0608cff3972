"""moe-hydra bisect: the difference split into units, its refusals before anything runs, run directories read back,
and (slow, serial) the search on tiny_moe: four differing units of which one, full recompute, is the regression;
a difference that is only noise is not reproduced. ddmin's bookkeeping against known effects: tests/test_ddmin.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moe_hydra.analysis import figures
from moe_hydra.commands import run_command
from moe_hydra.launch import bisect

GOOD = ["train.global_batch_size=8", "train.micro_batch_size=1"]
NEUTRAL = ["optimizer.lr=0.0003", "optimizer.weight_decay=0.1", "train.log_interval=2", "optimizer.clip_grad=0.5",
           "train.layout_invariant_init=false"]


def test_a_group_travels_with_its_own_keys_and_a_key_only_good_sets_goes_back_to_the_default():
    units = bisect.units_between(["recompute=selective", "recompute.recompute_modules=[core_attn]", "seed=3"],
                                 ["train.micro_batch_size=2"])
    by_key = {u.key: u for u in units}
    assert set(by_key) == {"recompute", "seed", "train.micro_batch_size"}
    assert by_key["recompute"].overrides == ["recompute=none"]  # the bad side's default option, its keys with it
    assert by_key["recompute"].good == ["recompute=selective", "recompute.recompute_modules=[core_attn]"]
    assert by_key["seed"].overrides == ["seed=1234"] and by_key["seed"].good == ["seed=3"]
    units = bisect.units_between(GOOD, [*GOOD, "recompute=selective", "recompute.recompute_modules=[core_attn]",
                                        *NEUTRAL])
    assert [u.key for u in units] == ["recompute", *(o.split("=")[0] for o in NEUTRAL)]
    assert units[0].overrides == ["recompute=selective", "recompute.recompute_modules=[core_attn]"]


def test_a_subset_of_units_applied_to_good_is_good_with_those_changes(tmp_path):
    b = bisect.Bisect(GOOD, [*GOOD, "recompute=full", *NEUTRAL], ["hardware.devices_per_node=2", "logger=none"],
                      tmp_path / "bi")
    b.lock.close()
    assert b.arm([0]) == [*GOOD, "hardware.devices_per_node=2", "recompute=full"]
    assert b.arm([2, 3]) == [*GOOD, "hardware.devices_per_node=2", "optimizer.weight_decay=0.1",
                             "train.log_interval=2"]
    assert b.how == ["logger=none"] and [u.key for u in b.units][0] == "recompute"


def test_keys_a_rule_ties_together_are_one_unit(tmp_path):
    """Full recompute set key by key: L50 refuses the granularity without its method and layers, and the method
    without full granularity, so the three keys are one unit (recorded with the rule); the neutral key stays apart."""
    b = bisect.Bisect(QUICK, [*QUICK, "recompute.recompute_method=uniform", "optimizer.lr=0.0003",
                              "recompute.recompute_granularity=full", "recompute.recompute_num_layers=1"],
                      ["hardware.devices_per_node=2", "logger=none"], tmp_path / "bi")
    b.lock.close()
    assert [(sorted(u.overrides), u.tied_by) for u in b.units] == [
        (["recompute.recompute_granularity=full", "recompute.recompute_method=uniform",
          "recompute.recompute_num_layers=1"], ["L50"]), (["optimizer.lr=0.0003"], [])]
    assert not b.plan(b.arm([0]))["violations"]


@pytest.mark.parametrize("args, said", [
    (["--good", " ".join(GOOD), "--bad", " ".join(GOOD)], "the same configuration"),
    (["--good", " ".join(GOOD)], "both --good and --bad"),
    (["--good", "train.micro_batch_size=4", "--bad", "train.micro_batch_size=abc"], "the bad side"),
    (["--good", "train.micro_batch_size=4", "--bad", "recompute=fastest"], "recompute"),
    (["--good", "train.micro_batch_size=4", "--bad", "recompute=full", "bisect.max_trials=0"], "bisect.max_trials"),
    (["only_one_dir"], "two run directories"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys, args, said):
    out = tmp_path / "bi"
    assert run_command("bisect", [*args, "hardware.devices_per_node=2", "logger=none", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert not out.exists() or not any(p.name != bisect.LOCK for p in out.iterdir())


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert run_command("bisect", [str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_run_directories_give_their_overrides_and_what_no_config_switches(tmp_path):
    for name, mbs, torch in (("good", 4, "2.13.0"), ("bad", 2, "2.14.0")):
        d = tmp_path / name / ".hydra"
        d.mkdir(parents=True)
        (d / "overrides.yaml").write_text(f"- train.micro_batch_size={mbs}\n- logger=none\n")
        (tmp_path / name / "env.json").write_text(json.dumps({"versions": {"torch": torch, "python": "3.11"}}))
    good, good_env = bisect.run_dir_overrides(tmp_path / "good")
    bad, bad_env = bisect.run_dir_overrides(tmp_path / "bad")
    assert good == ["train.micro_batch_size=4", "logger=none"]
    assert bisect.unswitchable(good_env, bad_env) == [{"what": "versions.torch", "good": "2.13.0", "bad": "2.14.0"}]
    b = bisect.Bisect(good, bad, ["hardware.devices_per_node=2"], tmp_path / "bi", (good_env, bad_env))
    b.lock.close()
    assert [u.overrides for u in b.units] == [["train.micro_batch_size=2"]]
    assert json.loads(json.dumps(b.journal))["difference"]["unswitchable"][0]["what"] == "versions.torch"


QUICK = ["train.global_batch_size=8", "train.micro_batch_size=4"]  # one micro-batch a rank: the quickest steps


def _bisect(tmp_path, bad: list[str], *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bi"
    r = subprocess.run([sys.executable, "-m", "moe_hydra.bisect", "--good", " ".join(QUICK), "--bad", " ".join(bad),
                        "--out", str(out), "hardware.devices_per_node=2", "logger=none", *extra],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads((out / "bisect.json").read_text())


@pytest.mark.slow
@pytest.mark.serial  # its verdicts judge measured step times
def test_bisect_names_the_deeper_model_among_six_units(tmp_path):
    """Twice the layers (about twice the step: the same tokens, so a like-for-like A/B) among five neutral
    optimizer, init and logging keys: reproduced, then ddmin's first half holds it, then that half's first half, then
    its first unit, and it is named alone with its share of the regression and the compute wall. A culprit this large decides in a round or two on
    these noisy cores (full recompute at micro-batch 4, about +12 % here, needs most of bisect.max_repeats)."""
    r, j = _bisect(tmp_path, [*QUICK, "model.num_layers=4", *NEUTRAL], "bisect.max_repeats=8", "contract.steady_steps=5")
    assert j["bisect_version"] == 1 and j["reproduce"]["verdict"] == "slower", j["reproduce"]
    assert j["status"] == "found" and [u["overrides"] for u in j["culprit"]] == [["model.num_layers=4"]], j["trials"]
    assert not j["interaction"] and 0 < j["share"]["rel_step_time"] and j["share"]["of_regression"] > 0.5
    # the culprit is the first unit: ddmin's halves that hold it, three A/Bs, each "slower"
    assert [(t["units"], t["outcome"]) for t in j["trials"]] == [
        (["model.num_layers", "optimizer.lr", "optimizer.weight_decay"], "fail"),
        (["model.num_layers", "optimizer.lr"], "fail"), (["model.num_layers"], "fail")], j["trials"]
    assert all(t["margin"] == j["trials"][0]["margin"] >= 0.05 for t in j["trials"])  # half the regression
    assert j["walls"]["moved"]["compute"] > 0, j["walls"]
    md = (tmp_path / "bi" / "bisect.md").read_text()
    assert "`model.num_layers=4` alone explains" in md and "## Trials" in md and "![trials](bisect.png)" in md
    # bisect.png draws the reproduction and each trial as bisect.json has them
    drawn = figures.drawn(tmp_path / "bi" / "bisect.png")["bisect"]
    assert [(d["outcome"], d["rel_step_time"], d["interval"]) for d in drawn] == [
        ("reproduce", j["reproduce"]["rel_step_time"], j["reproduce"]["interval"]),
        *((t["outcome"], t["rel_step_time"], t["interval"]) for t in j["trials"])]


@pytest.mark.slow
@pytest.mark.serial
def test_two_units_slow_only_together_are_named_as_the_pair(tmp_path):
    """A real interaction in Megatron-Core's DDP: a gradient bucket per parameter (overlap.bucket_size=1) only
    applies with overlap_grad_reduce (without it Megatron-Core makes one bucket), and the overlap alone keeps one
    bucket (the default size is larger than the model): each alone is neutral, both together launch a reduce per
    parameter (about +40 % here). The reproduction (both) fails, neither alone does: the pair is the 1-minimal set.
    Only the pair differs: a neutral third unit would add a trial of the pair without it whose A/B these noisy cores
    can leave undecided, keeping the third unit in the culprit (CI saw it; the six-unit test drops neutral units)."""
    pair = ["overlap.bucket_size=1", "overlap.overlap_grad_reduce=true"]
    r, j = _bisect(tmp_path, [*QUICK, *pair], "bisect.max_repeats=8", "contract.steady_steps=5",
                   "bisect.profile=false")
    assert j["reproduce"]["verdict"] == "slower" and j["status"] in ("found", "not_minimal"), j["reproduce"]
    assert j["interaction"] and sorted(o for u in j["culprit"] for o in u["overrides"]) == pair, j["trials"]
    alone = [t for t in j["trials"] if len(t["units"]) == 1]
    assert sorted(t["units"][0] for t in alone) == sorted(o.split("=")[0] for o in pair), j["trials"]
    # neither alone is slower: "pass" (equivalent within half the regression), or "unresolved" when these noisy
    # cores leave its A/B undecided at bisect.max_repeats (ddmin keeps the pair; it is then not shown minimal)
    assert all(t["outcome"] in ("pass", "unresolved") for t in alone), j["trials"]
    assert (j["status"] == "found") == all(t["outcome"] == "pass" for t in alone), j
    # undecided: the units whose leaving out stayed undecided (leaving one of the pair out leaves the other alone)
    keys = [o.split("=")[0] for o in pair]
    assert sorted(j["undecided"]) == sorted(k for t in alone if t["outcome"] == "unresolved"
                                            for k in keys if k != t["units"][0]), j
    assert "together" in (tmp_path / "bi" / "bisect.md").read_text()


@pytest.mark.slow
@pytest.mark.serial
def test_a_difference_that_is_only_noise_is_not_reproduced(tmp_path):
    """A logging interval changes nothing measurable: bad against good is not slower (at compare.alpha 1 %, a false
    "slower" comes once in 200 runs), and the bisect stops there."""
    r, j = _bisect(tmp_path, [*QUICK, "train.log_interval=2"], "bisect.max_repeats=2", "contract.steady_steps=5",
                   "compare.alpha=0.01")
    assert j["status"] == "not_reproduced" and j["reproduce"]["verdict"] != "slower" and not j["trials"], j
    assert "not reproduced" in r.stdout and (tmp_path / "bi" / "bisect.md").exists()
