"""The layout search: exhaustive over the legal space, consistent with stage=plan, honest about fit,
and a real screening on this machine."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex

import pytest

from moe_hydra import plan, rules, search
from moe_hydra.arch import Arch
from moe_hydra.layout import Layout
from moe_hydra.versions import mcore_facts
from tests.conftest import compose_config, run_cli

H100 = "hardware=h100_sxm"


def _legal_by_brute_force(cfg) -> set[tuple]:
    """Every (TP, CP, PP, VPP, EP, ETP) from 1 to the world size, each through all the rules."""
    a, mcore = Arch.from_model(cfg.model), mcore_facts()
    world = cfg.hardware.nodes * cfg.hardware.devices_per_node
    sizes = range(1, world + 1)
    legal = set()
    for tp, cp, pp, ep, etp in itertools.product(sizes, repeat=5):
        for vpp in [None, *range(2, a.num_layers + 2)] if pp > 1 else [None]:
            split = search.pipeline_split(a, pp, vpp) or "even"
            c = search.Candidate(tp, cp, pp, vpp, ep, etp, cfg.train.micro_batch_size, split)
            if not rules.check(dataclasses.replace(cfg, parallel=c.parallel(cfg.parallel)), mcore, a):
                legal.add((tp, cp, pp, vpp, ep, etp))
    return legal


@pytest.mark.parametrize("overrides", [
    ("hardware.devices_per_node=4",),
    ("hardware.devices_per_node=8", "model.num_layers=4", "model.mtp_num_layers=1"),
])
def test_enumeration_equals_a_brute_force_filter_through_the_rules(overrides):
    cfg = compose_config("stage=plan", *overrides)
    s = search.Search(cfg)
    found = {(r.candidate.tp, r.candidate.cp, r.candidate.pp, r.candidate.vpp, r.candidate.ep, r.candidate.etp)
             for r in s.run() if r.legal and not r.pruned}
    assert found == _legal_by_brute_force(s.cfg)
    assert len(found) > 10


def test_pruned_and_unfit_candidates_really_do_not_fit():
    cfg = compose_config("stage=plan", "model=qwen3_30b_a3b", H100)
    s = search.Search(cfg)
    results = s.run()
    pruned = [r for r in results if r.pruned]
    unfit = [r for r in results if r.legal and not r.pruned and r.fits is False]
    assert pruned and unfit
    for r in pruned[:20] + unfit[:20]:
        full = dataclasses.replace(s.cfg, parallel=r.candidate.parallel(s.cfg.parallel),
                                   recompute=s.recompute["full"])
        try:
            a = plan.assess(full)
        except rules.LayoutError:
            continue  # pruned before the rules: illegal as well
        assert a.peak.total / 2**30 > cfg.hardware.memory_gib, r.candidate


def test_search_estimates_equal_the_plans(tmp_path):
    cfg = compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32")
    s = search.Search(cfg)
    report = s.report(s.run(), 0.0)
    for row in [c for c in report["candidates"] if c["rank"]][:5]:
        p = plan.make_plan(compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32",
                                          *row["overrides"]), [], {"versions": {}, "env": {}})
        assert p["layout"] == row["layout"]
        assert p["memory"]["total"] == pytest.approx(row["memory_gib"], abs=1e-3)
        assert p["fits"] is True


def test_ranking_puts_cp_and_etp_last_for_short_sequences():
    cfg = compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=2")
    ranked = sorted((r for r in search.Search(cfg).run() if r.rank), key=lambda r: r.rank)
    first_cp = next(i for i, r in enumerate(ranked) if r.candidate.cp > 1)
    assert all(r.candidate.cp > 1 for r in ranked[first_cp:])
    plain = [r for r in ranked if r.candidate.cp == 1]
    first_etp = next(i for i, r in enumerate(plain) if r.candidate.etp > 1)
    assert all(r.candidate.etp > 1 for r in plain[first_etp:])
    steps = [r.terms["step"] for r in plain[:first_etp]]
    assert steps == sorted(steps)


def test_step_model_terms_follow_the_topology():
    cfg = compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=2")
    s = search.Search(cfg)
    inside = s.evaluate(search.Candidate(1, 1, 1, None, 8, 1, 1, "even"))
    across = s.evaluate(search.Candidate(1, 1, 1, None, 16, 1, 1, "even"))
    # EP16 on 8-GPU nodes: half of each rank's peers are behind the 50 GB/s NIC instead of 450 GB/s NVLink
    assert across.terms["ep"] > 4 * inside.terms["ep"]
    pp = s.evaluate(search.Candidate(1, 1, 2, None, 8, 1, 1, "even"))
    assert pp.terms["bubble"] > 0 == inside.terms["bubble"]


def test_flex_dispatch_and_ep_overlap_shrink_the_cross_node_all_to_all():
    def search_for(*overrides):
        return search.Search(compose_config("stage=plan", "model=deepseek_v3", H100, "hardware.nodes=128", *overrides))

    def ep_term(*overrides):
        s = search_for(*overrides)
        return s.evaluate(search.Candidate(2, 1, 8, 4, 64, 1, 1, search.pipeline_split(s.arch, 8, 4))).terms

    ep64 = Layout(1024, 2, 1, 8, 4, 64, 1, True)
    # EP64 spans 8 nodes: top-8 routing sends 8 x 63/64 x (1 - 8/64) copies of a token off-node with the alltoall
    # dispatcher; DeepEP one per other node reached: 4 routing groups, one per node, 3.5 of them elsewhere
    assert search_for()._remote_copies(ep64) == pytest.approx(8 * 63 / 64 * 7 / 8)
    assert search_for("dispatcher=deepep")._remote_copies(ep64) == pytest.approx(4 * 7 / 8)
    alltoall, deepep = ep_term(), ep_term("dispatcher=deepep")
    assert deepep["ep"] < alltoall["ep"]
    overlapped = ep_term("dispatcher=deepep", "overlap.overlap_moe_expert_parallel_comm=true")
    assert overlapped["ep"] == pytest.approx(max(0.0, deepep["ep"] - deepep["compute"]))


@pytest.mark.parametrize("model,nodes,mesh", [
    ("deepseek_v3", 128, "dsv3_h100_1024"),
    ("qwen3_235b_a22b", 32, "qwen3_235b_a22b_h100_256"),
    ("qwen3_30b_a3b", 2, "qwen3_30b_a3b_h100_16"),
])
def test_published_layouts_are_legal_fit_and_ranked(model, nodes, mesh):
    ref = compose_config("stage=plan", f"model={model}", H100, f"hardware.nodes={nodes}", f"mesh={mesh}")
    p = ref.parallel
    key = (p.tensor_model_parallel_size, p.context_parallel_size, p.pipeline_model_parallel_size,
           plan.assess(ref).layout.vpp, p.expert_model_parallel_size, p.expert_tensor_parallel_size)
    results = search.Search(compose_config("stage=plan", f"model={model}", H100, f"hardware.nodes={nodes}")).run()
    match = [r for r in results
             if (r.candidate.tp, r.candidate.cp, r.candidate.pp, r.candidate.vpp, r.candidate.ep, r.candidate.etp) == key]
    assert match and match[0].legal and match[0].fits and match[0].rank, match


@pytest.mark.slow
def test_layout_sweeper_writes_layouts_and_a_ready_to_run_sweep(cli, tmp_path):
    r = cli("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=2", "hydra/sweeper=layout", "-m")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "multi" / "layouts.json").read_text())
    ranked = sorted((c for c in report["candidates"] if c["rank"]), key=lambda c: c["rank"])
    assert ranked[0]["rank"] == 1 and ranked[0]["terms_s"]["step"] == ranked[0]["step_time_s"]
    assert report["counts"]["candidates"] == len(report["candidates"])
    assert "layout search: qwen3_30b_a3b on 16 x h100_sxm" in r.stdout
    # the ready-to-run sweep composes, plans each layout as the search estimated it, one contract for all
    script = (tmp_path / "multi" / "run_top.sh").read_text().splitlines()[-1]
    out = tmp_path / "again"
    r2 = run_cli(*shlex.split(script)[3:], f"hydra.sweep.dir={out}", cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    plans = {int(p.parent.name): json.loads(p.read_text()) for p in out.glob("*/plan.json")}
    assert len(plans) == len(ranked[:15])
    for i, p in plans.items():
        assert p["memory"]["total"] == pytest.approx(ranked[i]["memory_gib"], abs=1e-3)
    assert len({p["contract_hash"] for p in plans.values()}) == 1


@pytest.mark.slow
def test_screening_measures_the_top_layouts_on_this_machine(cli, tmp_path):
    r = cli("hardware.devices_per_node=2", "hydra/sweeper=layout", "hydra.sweeper.top_k=3", "logger=none",
            "-m", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "multi" / "layouts.json").read_text())
    arms = report["screening"]["arms"]
    assert len(arms) == 3 and sorted(a["measured_rank"] for a in arms) == [1, 2, 3]
    for a in arms:
        assert len(a["samples_ms"]) == 8 and a["ci_ms"][0] < a["step_ms"] < a["ci_ms"][1]
    best = next(a for a in arms if a["measured_rank"] == 1)
    assert best["tie_with_best"] and "contract.window=[4,53]" in report["screening"]["validate"]["command"]
    assert "screening: measured steady step time" in r.stdout and "validate" in r.stdout
    hashes = {json.loads((tmp_path / "multi" / str(i) / "results.json").read_text())["contract_hash"] for i in range(3)}
    assert len(hashes) == 1  # the arms differ only in what the search varied
