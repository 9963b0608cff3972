"""The layout search: exhaustive over the legal space, consistent with stage=plan, honest about fit,
and a real screening on this machine."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import shlex
from pathlib import Path

import pytest

from moe_hydra.core.arch import Arch
from moe_hydra.core.resolved import resolve
from moe_hydra.core.versions import mcore_facts
from moe_hydra.launch.layout_sweeper import LayoutSweeperImpl
from moe_hydra.commands import run_command
from moe_hydra.planning import layouts_file, plan, rules, search, step_model
from tests.conftest import compose_config, run_cli

H100 = "hardware=h100_sxm"


def _legal_by_brute_force(cfg, within_world: bool = False) -> set[tuple]:
    """Every (TP, CP, PP, VPP, EP, ETP) from 1 to the world size, each through all the rules. ``within_world``:
    only those whose attention (TP x CP x PP) and expert (ETP x EP x PP) meshes fit in the world (8^5 tuples
    through the rules take minutes; a world of 4 checks the rest exhaustively)."""
    a, mcore = Arch.from_model(cfg.model), mcore_facts()
    world = cfg.hardware.nodes * cfg.hardware.devices_per_node
    sizes = range(1, world + 1)
    legal = set()
    for tp, cp, pp, ep, etp in itertools.product(sizes, repeat=5):
        if within_world and (tp * cp * pp > world or ep * etp * pp > world):
            continue
        for vpp in [None, *range(2, a.num_layers + 2)] if pp > 1 else [None]:
            split = search.pipeline_split(a, pp, vpp) or "even"
            c = search.Candidate(tp, cp, pp, vpp, ep, etp, cfg.train.micro_batch_size, split)
            if not rules.check(resolve(dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **c.fields()))),
                               mcore):
                legal.add((tp, cp, pp, vpp, ep, etp))
    return legal


@pytest.mark.parametrize("overrides, within_world", [
    (("hardware.devices_per_node=4",), False),
    (("hardware.devices_per_node=8", "model.num_layers=4", "model.mtp_num_layers=1"), True),
])
def test_enumeration_equals_a_brute_force_filter_through_the_rules(overrides, within_world):
    cfg = compose_config("stage=plan", *overrides)
    s = search.Search(cfg)
    found = {(r.candidate.tp, r.candidate.cp, r.candidate.pp, r.candidate.vpp, r.candidate.ep, r.candidate.etp)
             for r in s.run() if r.legal and not r.pruned}
    assert found == _legal_by_brute_force(s.cfg, within_world)
    assert len(found) > 10


def test_pruned_and_unfit_candidates_really_do_not_fit():
    cfg = compose_config("stage=plan", "model=qwen3_30b_a3b", H100)
    s = search.Search(cfg)
    results = s.run()
    pruned = [r for r in results if r.pruned]
    unfit = [r for r in results if r.legal and not r.pruned and r.fits is False]
    assert pruned and unfit
    for r in pruned[:20] + unfit[:20]:
        try:
            a = plan.assess(resolve(s.config(r.candidate, "full")))
        except rules.LayoutError:
            continue  # pruned before the rules: illegal as well
        assert a.peak.total / 2**30 > cfg.hardware.memory_gib, r.candidate


def _communication(cfg, *set_by_command: str):
    """The dispatchers and EP overlap settings the layout sweeper tries for ``cfg``."""
    return LayoutSweeperImpl().communication(cfg, set(set_by_command))


@pytest.mark.parametrize("communication", [False, True])
def test_search_estimates_equal_the_plans(communication, tmp_path, capsys):
    cfg = compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32")
    dispatchers, ep_overlap = _communication(cfg) if communication else (None, None)
    s = search.Search(cfg, dispatchers=dispatchers, ep_overlap=ep_overlap)
    report = s.report(s.run(), 0.0)
    # layouts.json: the leading rows in JSON, the rest in layouts.parquet; read back, every row as the report's
    layouts_file.write(report, tmp_path / "layouts.json")
    head = json.loads((tmp_path / "layouts.json").read_text())
    assert head["candidates"] == report["candidates"][:len(head["candidates"])]
    assert len(head["candidates"]) >= max(layouts_file.FULL, report["tied"]) and head["table"]["rows"] > 10_000
    assert (tmp_path / "layouts.json").stat().st_size + (tmp_path / "layouts.parquet").stat().st_size < 2**21
    assert layouts_file.read(tmp_path / "layouts.json") == json.loads(json.dumps(report))
    ranked = [c for c in report["candidates"] if c["rank"]]
    deep, unranked = ranked[len(head["candidates"]) + 7], next(c for c in report["candidates"] if not c["rank"])
    assert run_command("sweep", ["layout", str(tmp_path), str(deep["rank"])]) == 0
    assert json.loads(capsys.readouterr().out) == deep  # any rank in full, its terms too
    assert run_command("sweep", ["layout", str(tmp_path), str(report["candidates"].index(unranked) + 1), "--row"]) == 0
    assert json.loads(capsys.readouterr().out) == unranked
    assert run_command("sweep", ["layout", str(tmp_path), str(len(ranked) + 1)]) == 2
    assert f"has no rank {len(ranked) + 1} (ranks 1..{len(ranked)})" in capsys.readouterr().err
    top = [c for c in report["candidates"] if c["rank"]][:5]
    if communication:  # the top layouts of Qwen3-235B on 256 H100s send their all-to-all across nodes
        assert any("dispatcher=deepep" in c["overrides"] for c in top)
        assert any("overlap.overlap_moe_expert_parallel_comm=true" in c["overrides"] for c in top)
    for row in top:  # the row's overrides reproduce its layout, memory and fit in stage=plan
        p = plan.make_plan(resolve(compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32",
                                                  *row["overrides"])), [], {"versions": {}, "env": {}})
        assert p["layout"] == row["layout"]
        assert p["memory"]["total"] == pytest.approx(row["memory_gib"], abs=1e-3)
        assert p["fits"] is True


@pytest.mark.parametrize("overrides,communication", [
    (("hardware.devices_per_node=8", "model.num_layers=4", "model.mtp_num_layers=1"), False),
    (("model=qwen3_30b_a3b", H100, "hardware.nodes=2"), True),
    (("model=deepseek_v3", H100, "hardware.nodes=16"), True),
    # EP overlap from the start: L68 refuses the full-recompute rung, so a layout that fits at no other rung keeps
    # the last rung tried, with that rung's memory
    (("model=qwen3_30b_a3b", H100, "hardware.nodes=2", "train.micro_batch_size=8",
      "overlap.overlap_moe_expert_parallel_comm=true", "dispatcher=deepep"), False),
])
def test_search_and_plan_assess_agree_on_sampled_candidates(overrides, communication):
    """Each sampled candidate, evaluated by the search (its caches) and by stage=plan's assess of the same
    resolved plan (the candidate's config at the recompute level and communication setting the search chose):
    the same layout, violations, memory, fit and step-time terms."""
    cfg = compose_config("stage=plan", *overrides)
    dispatchers, ep_overlap = _communication(cfg) if communication else (None, None)
    s = search.Search(cfg, dispatchers=dispatchers, ep_overlap=ep_overlap)
    every = list(search.enumerate_layouts(s.base))
    sample = random.Random(1).sample(every, min(300, len(every)))
    kinds = {"legal": 0, "illegal": 0}
    for c, got in zip(sample, s.evaluate_all(sample)):
        r = s.resolved(c, got.recompute, got.comm) if got.legal and not got.pruned else s.resolved(c)
        assert got.layout == r.layout
        try:
            a = plan.assess(r)
        except rules.LayoutError as e:
            if not got.pruned:  # a pruned candidate's rules were not checked
                assert sorted(got.violations) == sorted(f"[{v.rule}] {v.message}" for v in e.violations)
                kinds["illegal"] += 1
            continue
        peak = a.peak.total / 2**30
        if got.pruned:  # weights + gradients alone do not fit: neither does the whole
            assert peak > cfg.hardware.memory_gib
            continue
        kinds["legal"] += 1
        assert got.legal and got.memory_gib == pytest.approx(peak, rel=1e-12)
        assert got.fits == (None if cfg.hardware.memory_gib is None else peak <= cfg.hardware.memory_gib)
        worst = max(a.ranks, key=lambda x: x.total)
        assert got.terms == s.model.terms(r, worst.dense, worst.expert, r.cfg.recompute, got.comm.flex,
                                          got.comm.ep_overlap)
    assert kinds["legal"] >= 10 and kinds["illegal"] >= 10, kinds


def test_the_recipes_uneven_split_where_layers_do_not_divide_the_stages():
    from moe_hydra.core.pipeline import assign

    a = resolve(compose_config("model=deepseek_v3", "model.mtp_num_layers=null")).arch  # 61 layers, no MTP
    split = search.pipeline_split(a, 4, 4)
    assert split == "Etttt|(tttt|)*14tL"  # NVIDIA's DeepSeek-V3 recipe on 256 GB200 (PP4 VPP4)
    ranks = assign(61, 0, pp=4, vpp=4, layout=split)
    assert sum(len(r.layers) for r in ranks) == 61 and ranks[0].embedding and ranks[-1].loss
    assert search.pipeline_split(a, 8, 8) is None  # 64 stages: the last would hold no layer
    assert search.pipeline_split(a, 1, None) == "even"


def test_communication_settings_tried_unless_the_command_sets_them():
    h100 = compose_config("stage=plan", "model=qwen3_30b_a3b", H100)
    assert _communication(h100) == (["alltoall", "deepep"], [False, True])
    assert _communication(h100, "dispatcher") == (["alltoall"], [False, True])
    assert _communication(h100, "dispatcher", "overlap.overlap_moe_expert_parallel_comm") == (["alltoall"], [False])
    assert _communication(compose_config("stage=plan", "model=qwen3_30b_a3b", "hardware=gb200_nvl72"))[0] == [
        "alltoall", "hybridep"]
    # on the CPU: no flex dispatcher, and EP overlap needs CUDA streams
    assert _communication(compose_config("stage=plan")) == (["alltoall"], [False])


def test_each_layout_keeps_its_fastest_communication_setting_that_fits():
    cfg = compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32")
    both = search.Search(cfg, dispatchers=["alltoall", "deepep"], ep_overlap=[False, True])
    c = search.Candidate(2, 1, 8, 4, 32, 1, 1, search.pipeline_split(both.arch, 8, 4))
    chosen = both.evaluate(c)
    each = {(d, o): search.Search(compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32",
                                                 f"dispatcher={d}", f"overlap.overlap_moe_expert_parallel_comm={o}"))
            .evaluate(c) for d in ("alltoall", "deepep") for o in ("false", "true")}
    fitting = [r for r in each.values() if r.legal and r.fits]
    assert chosen.terms["step"] == pytest.approx(min(r.terms["step"] for r in fitting))
    assert (chosen.comm.dispatcher, chosen.comm.ep_overlap) == ("deepep", True)
    assert chosen.memory_gib == pytest.approx(each[("deepep", "true")].memory_gib)
    # inside one node too the flex dispatcher sends fewer copies (once per rank, not per expert): it wins where it fits
    in_node = search.Candidate(2, 1, 8, 4, 8, 1, 1, c.split)
    alltoall = search.Search(compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32",
                                            "dispatcher=alltoall", "overlap.overlap_moe_expert_parallel_comm=false"))
    assert both.evaluate(in_node).comm.dispatcher == "deepep"
    assert both.evaluate(in_node).terms["step"] < alltoall.evaluate(in_node).terms["step"]


def test_each_setting_climbs_from_the_primarys_least_recompute_and_the_fastest_that_fits_is_kept():
    """The choice, replayed one candidate at a time with stage=plan's assess as the judge of legality and memory: the
    primary setting's least recompute that fits; then each other setting in turn, from that rung up, until it is no
    faster than the best so far, keeping the first rung it is legal and fits at."""
    cfg = compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=2", "train.micro_batch_size=8")
    s = search.Search(cfg, dispatchers=["alltoall", "deepep"], ep_overlap=[False, True])
    every = list(search.enumerate_layouts(s.base))
    got = s.evaluate_all(every)
    chosen = [i for i, r in enumerate(got) if r.legal and r.fits]
    levels, cap, primary = list(s.recompute), cfg.hardware.memory_gib, s.comms[0]

    def judged(c, level, comm):  # (step, peak GiB) at a rung and setting, None where a rule refuses it
        r = s.resolved(c, level, comm)
        try:
            a = plan.assess(r)
        except rules.LayoutError:
            return None
        worst = max(a.ranks, key=lambda x: x.total)
        return s.model.step(r, worst.dense, worst.expert, r.cfg.recompute, comm.flex, comm.ep_overlap), a.peak.total / 2**30

    moved = 0
    for i in random.Random(4).sample(chosen, 25):
        c = every[i]
        least = next(lvl for lvl in levels if (j := judged(c, lvl, primary)) and j[1] <= cap)
        best, best_step = (primary, least), judged(c, least, primary)[0]
        for comm in s.comms[1:]:
            if c.ep == 1 and (comm.flex or comm.ep_overlap):
                continue
            for lvl in levels[levels.index(least):]:
                j = judged(c, lvl, comm)
                if j and j[0] >= best_step:
                    break
                if j and j[1] <= cap:
                    best, best_step = (comm, lvl), j[0]
                    break
        assert (got[i].comm, got[i].recompute) == best, c
        moved += best[1] != least
    assert moved, "no sampled candidate changed its recompute with its setting: the sample checks too little"


def test_candidates_evaluated_together_equal_each_evaluated_alone():
    """evaluate_all groups rows by the columns a rule, a count or an estimate reads: the whole search's rows equal
    each candidate's own (a batch of one), every field."""
    cfg = compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=4")
    s = search.Search(cfg, dispatchers=["alltoall", "deepep"], ep_overlap=[False, True])
    every = list(search.enumerate_layouts(s.base))
    together = s.evaluate_all(every)
    alone = search.Search(cfg, dispatchers=["alltoall", "deepep"], ep_overlap=[False, True])
    for i in random.Random(2).sample(range(len(every)), 150):
        assert dataclasses.asdict(together[i]) == dataclasses.asdict(alone.evaluate(every[i])), every[i]
    assert sum(r.legal and r.fits for r in together) > 100


@pytest.mark.parametrize("overrides", [("model=deepseek_v3", H100, "hardware.nodes=16"),
                                       ("hardware.devices_per_node=8", "model.num_layers=4", "model.mtp_num_layers=1")])
def test_the_columns_of_a_path_decide_its_value(overrides):
    """A rule's answer is reused for every candidate with the same values where it read (_Columns.PATH_COLUMNS:
    the columns that decide each path's value, a derived value's too); CONSTANT paths are the same for every
    candidate."""
    from operator import attrgetter

    from moe_hydra.planning.rules.base import DERIVED, Ctx

    s = search.Search(compose_config("stage=plan", *overrides))
    every = list(search.enumerate_layouts(s.base))
    t = search._Columns(s, every)
    sample = random.Random(3).sample(range(len(every)), min(400, len(every)))
    plans = {i: s.resolved(every[i]) for i in sample}
    for path, names in [*t.PATH_COLUMNS.items(), *((p, ()) for p in t.CONSTANT)]:
        seen: dict[tuple, object] = {}
        for i in sample:
            cols = tuple(int(getattr(t, n)[i]) for n in names)
            got = DERIVED[path](Ctx(plans[i], s.mcore)) if path in DERIVED else attrgetter(path)(plans[i])
            assert seen.setdefault(cols, got) == got, (path, every[i])
        assert len(seen) < len(sample), path  # groups of more than one candidate were compared


def test_a_rule_reading_a_path_the_search_cannot_key_fails_loudly(monkeypatch):
    s = search.Search(compose_config("stage=plan", "hardware.devices_per_node=4"))
    monkeypatch.delitem(search._Columns.PATH_COLUMNS, "layout.tp")
    with pytest.raises(RuntimeError, match="a rule read layout.tp, which the layout search varies"):
        s.run()


def test_a_fix_naming_the_tp_sizes_reads_them_as_one_value():
    """L26's fix lists the TP sizes every TP rule takes, computed from CP, PP, EP, ETP and the world: the rule reads
    that list (derived.tp_choices), not those sizes, so layouts with the same list share its answer."""
    from moe_hydra.planning.rules import layout_rules
    from moe_hydra.planning.rules.base import check_reading

    s = search.Search(compose_config("stage=plan", "model=deepseek_v3", H100, "hardware.nodes=64"))
    a, b = (s.resolved(search.Candidate(256, 1, pp, None, 8, 1, 1, "even")) for pp in (1, 2))
    (va, read), (vb, _) = (check_reading(layout_rules.l26_l28_tp_shapes, r, s.mcore) for r in (a, b))
    assert "derived.tp_choices" in read and not read & {"layout.cp", "layout.pp", "layout.ep", "layout.world_size"}
    assert [v.rule for v in va] == ["L26"] and va[0].fix == vb[0].fix  # PP 1 and 2: the same sizes take


def test_a_rule_using_a_node_whole_reads_all_of_it_and_the_search_refuses_to_key_it():
    """A node compared, hashed or formatted whole is recorded under its own path (every field is read): a search
    cannot key that by its columns, and says so instead of reusing an answer for layouts that differ."""
    from moe_hydra.planning.rules.base import check_reading

    def whole(c):
        if c.layout == c.layout:
            yield from ()

    s = search.Search(compose_config("stage=plan", "hardware.devices_per_node=4"))
    assert "layout" in check_reading(whole, s.base, s.mcore)[1]
    s.candidate_rules = [*s.candidate_rules, whole]
    with pytest.raises(RuntimeError, match="a rule read layout, which the layout search varies"):
        s.run()


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
    # EP16 on 8-GPU nodes: half of each rank's peers are behind the NIC instead of NVLink (sustained rates)
    nvlink, nic = s.model.nvlink, s.model.scaleout
    assert nvlink == pytest.approx(900 / 2 * 1e9 * cfg.step_model.nvlink_efficiency)
    assert nic == pytest.approx(50e9 * cfg.step_model.scaleout_efficiency)
    ratio = (8 * 15 / 16 * (0.5 / nvlink + 0.5 / nic)) / (8 * 7 / 8 / nvlink)
    # at their own recompute levels: recomputing the MoE layer (full) repeats its forward dispatch and combine
    a2a = {r.recompute: s.model.recompute_factors(s.recompute[r.recompute])[3] for r in (inside, across)}
    assert a2a.get("full", 1.5) == 1.5 and a2a.get("none", 1.0) == 1.0
    assert across.terms["ep"] / a2a[across.recompute] == pytest.approx(ratio * inside.terms["ep"] / a2a[inside.recompute])
    pp = s.evaluate(search.Candidate(1, 1, 2, None, 8, 1, 1, "even"))
    assert pp.terms["bubble"] > 0 == inside.terms["bubble"]


def test_small_expert_gemms_and_the_host_cost_time():
    cfg = compose_config("stage=plan", "model=qwen3_235b_a22b", H100, "hardware.nodes=32")
    s = search.Search(cfg)
    model, k = s.model, cfg.step_model

    def terms(tp, ep, recompute="selective"):  # the same parameter counts, so only the layout differs
        return model.terms(s.resolved(search.Candidate(tp, 1, 8, 4, ep, 1, 1, "even")), 0, 0, recompute)

    ep8, ep32 = terms(2, 8), terms(2, 32)
    # EP8 gives each expert GEMM a quarter of EP32's rows (EP x 2048 rows x top-8 / 128 experts): the grouped
    # GEMMs run at r / (r + expert_rows_half) of the dense rate; the FLOPs are the same
    dense_f, attention_f, expert_f = model.recompute_factors("selective")[:3]
    (between_dense, between_moe), micro_batches = model.elementwise_s, model.gbs // 16  # DP16
    rest = (model.gbs * model.seq / 256 * (model.dense_flops * dense_f * model.gemm_s + model.logits_s
                                           + model.attention_s * attention_f + between_dense * dense_f
                                           + between_moe * expert_f)
            + k.gpu_ms_per_moe_layer * 1e-3 * model.moe_layers / 8 * micro_batches * expert_f)
    rate = {ep: (r := ep * 2048 * 8 / 128) / (r + k.expert_rows_half) for ep in (8, 32)}
    assert (ep8["compute"] - rest) * rate[8] == pytest.approx((ep32["compute"] - rest) * rate[32])
    # the GPU waits for the host when a micro-batch's layer takes less than the host's launches for it:
    # Qwen3-30B-A3B's small layers, with EP overlap hiding the all-to-all
    small_search = search.Search(compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=2"))
    small = small_search.model
    t = small.terms(small_search.resolved(search.Candidate(1, 1, 1, None, 16, 1, 1, "even")), 0, 0, "none",
                    ep_overlap=True)
    host = cfg.step_model.host_ms_per_moe_layer * 1e-3 * 48 * (small.gbs // 16)  # 48 MoE layers, GBS / DP16
    assert t["host"] == pytest.approx(host - (t["compute"] + t["ep"])) and t["host"] > 0
    assert ep32["host"] == 0 and ep32["step"] == pytest.approx(sum(v for n, v in ep32.items() if n != "step"))


@pytest.mark.parametrize("model,nodes,mesh,recipe", [
    # its recipe keeps the gradient buffer in bf16 (Bridge's benchmark mode); fp32 gradients leave it no room
    # for the flex dispatcher's buffers at selective recompute
    ("deepseek_v3", 128, "dsv3_h100_1024", ("optimizer.grad_reduce_in_fp32=false",)),
    ("qwen3_235b_a22b", 32, "qwen3_235b_a22b_h100_256", ()),
    ("qwen3_30b_a3b", 2, "qwen3_30b_a3b_h100_16", ()),
])
def test_published_layouts_are_legal_fit_and_rank_within_5_percent_of_the_best(model, nodes, mesh, recipe):
    """Each recipe's layout is predicted within 5 % of the search's best (far inside the tie ratio, so
    in the tied set screening measures); which of the near-equal layouts ranks first is the model's noise."""
    base = ("stage=plan", f"model={model}", H100, f"hardware.nodes={nodes}", *recipe)
    ref = compose_config(*base, f"mesh={mesh}")
    p = ref.parallel
    key = (p.tensor_model_parallel_size, p.context_parallel_size, p.pipeline_model_parallel_size,
           resolve(ref).layout.vpp, p.expert_model_parallel_size, p.expert_tensor_parallel_size)
    cfg = compose_config(*base)
    dispatchers, ep_overlap = _communication(cfg)
    s = search.Search(cfg, dispatchers=dispatchers, ep_overlap=ep_overlap)
    results = s.run()
    match = [r for r in results
             if (r.candidate.tp, r.candidate.cp, r.candidate.pp, r.candidate.vpp, r.candidate.ep, r.candidate.etp) == key]
    assert match and match[0].legal and match[0].fits and match[0].rank, match
    ranked = sorted((r for r in results if r.rank), key=lambda r: r.rank)
    assert match[0].terms["step"] <= 1.05 * ranked[0].terms["step"], (match[0].rank, match[0].comm, match[0].terms)
    assert match[0].rank <= len(search.tied_set(ranked, s.tie_width))


def test_the_ready_to_run_sweep_trains_the_layouts_a_planned_search_ranked(tmp_path):
    """run_top.sh is the search's command less its stage (a search run with stage=plan writes a sweep that trains)
    and adds its own arguments (run_top.sh stage=plan plans them again)."""
    import subprocess

    from moe_hydra.launch.layout_sweeper import write_sweep

    row = {"rank": 1, "layout": "TP1 EP2", "recompute": "none", "memory_gib": 1.0, "step_time_s": 0.1,
           "overrides": ["parallel.expert_model_parallel_size=2"]}
    base = ["stage=plan", "model=tiny_moe", "hardware.devices_per_node=2"]
    out = write_sweep(tmp_path, [row], base)
    assert "stage" not in out["command"] and "model=tiny_moe hardware.devices_per_node=2" in out["command"]
    bin_dir = tmp_path / "bin"  # a python that prints its arguments: what the script would run
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    r = subprocess.run(["bash", out["script"], "stage=plan", "hydra.sweep.dir=x y"], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, timeout=30)
    args = r.stdout.splitlines()
    assert r.returncode == 0 and args[:2] == ["-m", "moe_hydra"], r
    assert args[2:6] == ["-m", "model=tiny_moe", "hardware.devices_per_node=2",
                         f"hydra.searchpath=[file://{(tmp_path / 'search').resolve()}]"], args
    assert args[6:] == ["experiment=layout_01", "stage=plan", "hydra.sweep.dir=x y"], args


@pytest.mark.slow
def test_layout_sweeper_writes_layouts_and_a_ready_to_run_sweep(cli, tmp_path):
    r = cli("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.nodes=2", "hydra/sweeper=layout", "-m")
    assert r.returncode == 0, r.stderr
    report = layouts_file.read(tmp_path / "multi" / "layouts.json")
    ranked = sorted((c for c in report["candidates"] if c["rank"]), key=lambda c: c["rank"])
    assert ranked[0]["rank"] == 1 and ranked[0]["terms_s"]["step"] == ranked[0]["step_time_s"]
    assert report["counts"]["candidates"] == len(report["candidates"])
    assert "layout search: qwen3_30b_a3b on 16 x h100_sxm" in r.stdout
    # the ready-to-run sweep runs (the search's stage=plan left out; its own arguments added: here stage=plan), and
    # composes and plans each layout as the search estimated it, one contract for all
    script = shlex.split((tmp_path / "multi" / "run_top.sh").read_text().splitlines()[-1])
    assert script[:3] == ["python", "-m", "moe_hydra"] and script[-1] == "$@" and "stage=plan" not in script
    out = tmp_path / "again"
    r2 = run_cli(*script[3:-1], "stage=plan", f"hydra.sweep.dir={out}", cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    plans = {int(p.parent.name): json.loads(p.read_text()) for p in out.glob("*/plan.json")}
    assert len(plans) == len(ranked[:15])
    for i, p in plans.items():
        assert p["memory"]["total"] == pytest.approx(ranked[i]["memory_gib"], abs=1e-3)
    assert len({p["contract_hash"] for p in plans.values()}) == 1


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_screening_measures_the_top_layouts_on_this_machine(cli, tmp_path):
    r = cli("hardware.devices_per_node=2", "hydra/sweeper=layout", "hydra.sweeper.top_k=3", "logger=none",
            "hydra.sweeper.profile_top=1", "-m", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "multi" / "layouts.json").read_text())
    arms = report["screening"]["arms"]
    # the layouts tied with the best closer than the step model can order them, at most top_k of them
    tied = [c for c in report["candidates"] if c.get("tied")]
    assert len(tied) == report["tied"] >= 2 and len(arms) == min(report["tied"], 3)
    assert [a["layout"] for a in sorted(arms, key=lambda a: a["predicted_rank"])] == [c["layout"] for c in tied[:3]]
    assert sorted(a["measured_rank"] for a in arms) == list(range(1, len(arms) + 1))
    windows = {}
    for a in arms:  # each measured the window it found steady (the screening's contract.window=auto)
        res = json.loads((Path(a["dir"]) / "results.json").read_text())
        windows[a["layout"]] = first_, last_ = res["window_measured"]
        assert res["window_declared"] == "auto" and res["steady"]["window_steady"] is True, res["steady"]
        assert len(a["samples_ms"]) == last_ - first_ + 1 >= 10 and a["ci_ms"][0] < a["step_ms"] < a["ci_ms"][1]
    best = next(a for a in arms if a["measured_rank"] == 1)
    assert best["tie_with_best"] and "contract.window=auto contract.warmup_steps=30" in \
        report["screening"]["validate"]["command"]
    assert "screening: measured steady step time" in r.stdout and "validate" in r.stdout
    # profile_top=1: the first screened layout is profiled after its window, and the table says where its step goes
    first = min(arms, key=lambda a: a["predicted_rank"])
    after = windows[first["layout"]][1]
    assert first["profile"]["steps"] == [after + 1, after + 5] and first["profile"]["compute_ms"] > 0
    assert [a for a in arms if a.get("profile")] == [first] and "walls per profiled step" in r.stdout
    hashes = {json.loads((tmp_path / "multi" / str(i) / "results.json").read_text())["contract_hash"]
              for i in range(len(arms))}
    assert len(hashes) == 1  # the arms differ only in what the search varied


def test_the_screening_ranks_like_with_like_and_refuses_layouts_of_different_work():
    from moe_hydra.core.errors import Refused
    from moe_hydra.launch.layout_sweeper import rank_measured

    def arm(name, mean, work):
        return {"layout": name, "predicted_rank": 1, "samples_ms": [mean, mean + 1, mean - 1], "work": work}

    table = rank_measured([arm("TP1", 100, [1024, 8, 8]), arm("TP2", 90, [1024, 8, 4])], 0.0)
    assert table["metric"] == "step_time_ms" and table["arms"][0]["layout"] == "TP2"
    with pytest.raises(Refused, match="different work a step"):  # a search that changed the batch or the GPUs
        rank_measured([arm("TP1", 100, [1024, 8, 8]), arm("TP2", 90, [2048, 8, 8])], 0.0)


def test_a_calibration_ranks_the_layouts_it_measured_by_what_it_measured(tmp_path):
    """hardware.calibration on two processes, DP 2 and EP 2 measured (EP 2 faster): those two take the
    calibration's step times and rank first, EP 2 before DP 2; every other layout keeps the priors' terms, marked,
    after them; the ties are within the calibration's held-out error, of the calibrated layouts alone."""
    from moe_hydra.core import calibrated_step as cs
    from tests.data.fixtures import write_calibration

    base = ("hardware.devices_per_node=2",)
    dp2, ep2 = resolve(compose_config(*base)), resolve(compose_config(*base, "expert_mesh=ep2"))
    slow = {**dict.fromkeys(cs.TERMS, 0.0), "per_step": 0.05, "per_layer": 0.02}
    fast = {**slow, "per_layer": 0.01}
    path = tmp_path / "cal.json"
    write_calibration(path, dp2, coefficients=slow)
    record = json.loads(path.read_text())
    record["step"]["layouts"].append({**record["step"]["layouts"][0], "layout": cs.layout_of(ep2),
                                      "coefficients": fast})
    path.write_text(json.dumps(record))
    s = search.Search(compose_config(*base, f"hardware.calibration={path}"))
    results = s.run()
    ranked = sorted((r for r in results if r.rank), key=lambda r: r.rank)
    first, second = ranked[:2]
    assert (first.layout.ep, second.layout.ep, second.layout.dp) == (2, 1, 2) and first.calibrated and second.calibrated
    assert first.terms["step"] == pytest.approx(cs.predict(fast, cs.shape_of(ep2))[0])
    assert all(r.calibrated is False for r in ranked[2:]) and len(ranked) > 2
    report = s.report(results, 0.0)
    assert report["tie_width"] == pytest.approx(math.exp(0.1)) and report["calibration"]["calibrated"] == 2
    assert report["candidates"][0]["step_time_from"] == "calibration" and report["tied"] == 1
    # the tie set the step model alone gives, by its own times (kept where the calibration replaced them)
    assert first.prior_step is not None and second.prior_step is not None and ranked[2].prior_step is None
    priors = [r.terms["step"] if r.prior_step is None else r.prior_step for r in ranked]
    assert report["tie_width_uncalibrated"] == step_model.tie_width("moe")
    assert report["tied_uncalibrated"] == sum(p <= min(priors) * report["tie_width_uncalibrated"] for p in priors) >= 1
