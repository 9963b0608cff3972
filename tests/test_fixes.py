"""Every suggested fix plans: over every rule's failing cases (tests/test_rules.py ``CASES``), each violation's fix
is an override a user can paste, and the config with it added no longer breaks that rule and breaks nothing else.
A refused value's fix is its preset's value; a layout larger than this machine also names the GPU presets and
stage=plan."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from moe_hydra.core import bounds
from moe_hydra.core.resolved import resolve
from moe_hydra.core.violations import LayoutError, first_fix
from moe_hydra.planning import rules
from moe_hydra.planning.rules.base import gpu_presets
from tests.conftest import compose_config
from tests.test_rules import CASES, violations

# where violations are made: the rules, the resolved plan's bounds (S02)
SOURCES = [*Path(rules.__file__).parent.glob("*.py"), Path(bounds.__file__)]
# the headline command on the default (CPU) hardware; composed here as mesh=ep8 (compose() refuses +mesh=ep8, which
# the command line takes: the CLI test below types it)
LAPTOP = ("mesh=ep8", "dispatcher=deepep")
# the failing cases of test_rules, and the headline on a laptop; one id per case
FIX_CASES = [(rule_id, list(overrides)) for rule_id, overrides, _ in CASES] + [("L02", list(LAPTOP))]


def _key(v) -> tuple[str, str]:
    return v.rule, v.message


@pytest.mark.parametrize("rule_id,overrides", FIX_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(FIX_CASES)])
def test_every_fix_plans(rule_id, overrides):
    before = violations(overrides)
    assert rule_id in {v.rule for v in before}
    for v in before:
        fix = first_fix(v.fix)
        assert fix, f"[{v.rule}] fix is not an override a user can paste: {v.fix!r}"
        after = violations([*overrides, *fix])  # composes and resolves: an override that does not plan raises
        assert _key(v) not in {_key(a) for a in after}, f"[{v.rule}] {v.message}: still there after {fix}"
        new = Counter(a.rule for a in after) - Counter(b.rule for b in before)
        assert not new, f"[{v.rule}] fix {fix} breaks {[a.render() for a in after if a.rule in new]}"


def test_every_rule_has_a_failing_case():
    """A new rule without a case in tests/test_rules.py fails here too: its fix would go untested."""
    declared = {rule for f in SOURCES for rule in re.findall(r'V\("([A-Z]\d\d)"', f.read_text())}
    assert declared - {c[0] for c in FIX_CASES} == set()


def test_the_fixes_of_a_report_plan_together():
    """Pasting every fix of a refusal at once plans: a refused window's fix brings train_iters (its interpolation)
    back with it."""
    overrides = ["stage=plan", "contract.window=[0,0]"]
    found = violations(overrides)
    assert {v.fix for v in found} == {"contract.window=auto", "train.train_iters=200"}
    assert violations([*overrides, *(o for v in found for o in first_fix(v.fix))]) == []


@pytest.mark.parametrize("override,fix", [
    ("hardware.memory_gib=0", "hardware.memory_gib=80"),  # h100_sxm's, not the bound 0.001
    ("model.num_attention_heads=0", "model.num_attention_heads=4"),  # tiny_moe's
    ("hardware.run_to_run_noise=2", "hardware.run_to_run_noise=0.02"),  # above the domain: still the preset's
    ("train.micro_batch_size=0", "train.micro_batch_size=4"),  # a model preset's training setting
    ("contract.window=[0,3]", "contract.window=auto"),  # the schema's default
    ("model.moe_router_num_groups=0", "model.moe_router_num_groups=null"),  # unset in the presets
    ("model.window_size=[128,0,1]", "model.window_size=null"),
    ("kernels.cuda_graph_scope=${model.hidden_size}", "kernels.cuda_graph_scope=[]"),
    ("hardware.nodes=1048576", "hardware.nodes=1"),  # the world bound, product of two legal sizes
])
def test_a_refused_value_is_fixed_with_its_presets_value(override, fix):
    try:
        resolve(compose_config("stage=plan", "hardware=h100_sxm", override))
    except LayoutError as e:
        assert [v.fix for v in e.violations] == [fix]
    else:
        pytest.fail(f"{override} was not refused")


def test_a_refused_value_whose_preset_is_illegal_gets_the_bound(monkeypatch):
    monkeypatch.setattr(bounds.presets, "chosen", lambda cfg, path, own=False: 0)
    with pytest.raises(LayoutError) as e:
        resolve(compose_config("stage=plan", "model.num_layers=0"))
    assert [v.fix for v in e.value.violations] == ["model.num_layers=1"]


@pytest.mark.parametrize("stage", [[], ["stage=plan"]])
def test_a_layout_larger_than_this_machine_names_the_gpu_presets_and_stage_plan(stage):
    """On a laptop the headline's own fixes (EP 1, alltoall) only lead back to the default; the refusal also says
    how to plan it as asked: a GPU preset of a node of 8, with stage=plan where this machine has no GPUs."""
    (v,) = [v for v in violations([*LAPTOP, *stage]) if v.rule == "L02"]
    assert "(local_cpu runs 1 process on this machine)" in v.message
    assert first_fix(v.fix) == ["parallel.expert_model_parallel_size=1", "dispatcher=alltoall"]
    eight = [name for name, gpus in gpu_presets().items() if gpus % 8 == 0]
    assert {"h100_sxm", "h200_sxm"} <= set(eight) and f"hardware=<one of {', '.join(eight)}> stage=plan" in v.fix
    for name in eight:
        assert violations([*LAPTOP, *stage, f"hardware={name}", "stage=plan"]) == []


def test_a_layout_larger_than_a_gpu_cluster_names_more_nodes_only():
    (v,) = [v for v in violations(["hardware=h100_sxm", "expert_mesh=ep16"]) if v.rule == "L02"]
    assert "this machine" not in v.message and "stage=plan" not in v.fix and "hardware.nodes=2" in v.fix


def test_flex_on_one_process_names_the_gpu_presets():
    (v,) = [v for v in violations(["dispatcher=deepep"]) if v.rule == "L40"]
    assert first_fix(v.fix) == ["dispatcher=alltoall"] and "<one of none>" not in v.fix
    assert v.fix.endswith("parallel.expert_model_parallel_size=8 stage=plan")


@pytest.mark.slow
@pytest.mark.parametrize("stage", [[], ["stage=plan"]])
def test_the_headline_on_a_laptop_is_refused_with_the_gpu_presets(cli, stage):
    """With or without stage=plan (the default stage runs here, and also finds DeepEP missing: H04)."""
    r = cli("+mesh=ep8", "dispatcher=deepep", *stage)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "hardware=<one of a100_sxm, b200, b300, h100_sxm, h200_sxm> stage=plan" in r.stderr, r.stderr
    if not stage and "[H04]" in r.stderr:
        assert "fix: dispatcher=alltoall, or stage=plan" in r.stderr


def test_first_fix_reads_the_overrides_a_fix_starts_with():
    assert first_fix("parallel.expert_model_parallel_size=<one of 2, 4>, or dispatcher=alltoall") == [
        "parallel.expert_model_parallel_size=2"]
    assert first_fix("recompute.recompute_method=uniform recompute.recompute_num_layers=1") == [
        "recompute.recompute_method=uniform", "recompute.recompute_num_layers=1"]
    assert first_fix('data.split="969,30,1"') == ['data.split="969,30,1"']
    assert first_fix("dispatcher=alltoall (or overlap.moe_shared_expert_overlap=false)") == ["dispatcher=alltoall"]
    assert first_fix("a smaller hardware.nodes") == [] and first_fix("model.moe_router_topk=<= 8") == []
