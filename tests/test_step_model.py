"""The layout search's step-time model against published measured step times (its calibration data)."""

from __future__ import annotations

import pytest

from moe_hydra.planning import search
from moe_hydra.planning.step_model import PUBLISHED
from tests.conftest import compose_config


def _modelled(p):
    """The published run as the search evaluates it: same rules, memory estimate and terms."""
    s = search.Search(compose_config("stage=plan", *p.overrides))
    tp, cp, pp, vpp, ep, etp, mbs = p.layout
    r = s.evaluate(search.Candidate(tp, cp, pp, vpp, ep, etp, mbs, search.pipeline_split(s.arch, pp, vpp) or "even"))
    assert r.legal and r.fits, (p.name, r.violations, r.memory_gib)  # they ran, so they must fit here
    return r.terms["step"]


def test_the_model_orders_the_published_runs_as_measured_and_within_15_percent():
    modelled = [_modelled(p) for p in PUBLISHED]
    for p, step in zip(PUBLISHED, modelled):
        assert step == pytest.approx(p.step_s, rel=0.15), p.name
    # the order that matters for ranking: cross-node EP with DeepEP and EP overlap first, TP4 EP8 last
    measured = sorted(range(len(PUBLISHED)), key=lambda i: PUBLISHED[i].step_s)
    assert sorted(range(len(PUBLISHED)), key=lambda i: modelled[i]) == measured


def test_the_plan_states_its_step_time_prediction_on_gpus_and_none_on_the_cpu():
    from moe_hydra.core.resolved import resolve
    from moe_hydra.planning import plan

    env = {"versions": {}, "env": {}}
    overlapped = next(p for p in PUBLISHED if "overlap" in p.name)
    tp, cp, pp, vpp, ep, etp, mbs = overlapped.layout
    layout = (f"parallel.tensor_model_parallel_size={tp}", "parallel.sequence_parallel=true",
              f"parallel.pipeline_model_parallel_size={pp}", f"parallel.virtual_pipeline_model_parallel_size={vpp}",
              f"parallel.expert_model_parallel_size={ep}", f"parallel.expert_tensor_parallel_size={etp}",
              "parallel.account_for_embedding_in_pipeline_split=true", "parallel.account_for_loss_in_pipeline_split=true")
    p = plan.make_plan(resolve(compose_config("stage=plan", *overlapped.overrides, *layout)), [], env)
    st = p["step_time"]
    assert st["seconds"] == pytest.approx(overlapped.step_s, rel=0.20) and "Qwen3-235B" in st["calibration"]
    assert st["seconds"] == pytest.approx(sum(st["terms"].values()))  # the terms add up to the step
    world, tokens = p["world_size"], p["batch"]["tokens_per_step"]
    assert st["tokens_per_s_per_gpu"] == pytest.approx(tokens / (st["seconds"] * world))
    assert st["mfu"] == pytest.approx(st["tflops_per_gpu"] / 989)  # H100 SXM dense BF16 peak
    assert plan.make_plan(resolve(compose_config("stage=plan")), [], env)["step_time"] is None  # no CPU rates
