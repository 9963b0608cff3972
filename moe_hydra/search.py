"""The layout search: enumerate every Parallel Folding layout of a world size -> legality -> fit -> rank.

**Enumerate.** TP, CP, PP, EP, ETP over the divisors of the world size (TP x CP x PP and
ETP x EP x PP must divide it, EP must divide the experts: rules L01/L02/L10 would refuse the rest),
VPP from none to as many chunks as there are layers, SP on whenever TP > 1 (Megatron needs it for
MoE with TP), and micro-batch sizes when asked. Each (PP, VPP) gets the pipeline split Megatron
recipes use: an even split; else the embedding and loss counted as one layer each
(``account_for_*_in_pipeline_split``); else, with MTP, a ``pipeline_model_parallel_layout`` in which
E, m and L each take a layer's slot (``Et|(tt|)*30mL`` for DeepSeek-V3 on PP8 x VPP4). Every
candidate then passes through the same rules and estimates as ``stage=plan``
(:func:`moe_hydra.plan.assess`). The global batch stays fixed across candidates (the contract).

**Fit.** The least recompute that fits (none -> selective -> full, the workflow's order) is kept
with the candidate; a candidate that fits with none of them is kept as ``fits: false``.

**Rank** by an analytic step time, a ranking aid (every term printed per layout), at the hardware's
peak rates (nominal 1 TFLOP/s, 10 GB/s and 0.01 TB/s where a preset declares none), per rank and
step (M = micro-batches per step, rows = s b / CP, / TP with sequence parallelism):

    compute   roofline, dense GEMMs and routed experts apart: FLOPs/token x tokens/step x recompute /
              (world x peak), or the weights streamed from HBM for each micro-batch (12 B per parameter:
              read forward, read for the data gradient, fp32 main-grad read + write), whichever is slower
              (recompute: full +1/3, a second forward; selective + the recomputed attention's forward)
    ep        4 x (MoE layers/rank) x M x rows x h x 2 B per token copy (dispatch + combine, forward +
              backward): top-k x (EP-1)/EP copies, those to peers inside the NVLink domain over NVLink (half
              the declared bidirectional bandwidth), those to other nodes over the scale-out NIC — with the
              flex dispatchers (DeepEP, HybridEP) one copy per other node reached (uniform routing, or the
              routing groups' node limit) instead of one per expert; with
              overlap_moe_expert_parallel_comm only what another micro-batch's compute cannot hide
    etp       4 x (MoE layers/rank) x M x rows x top-k x h x 2 B x (ETP-1): tokens gathered to and
              scattered from the expert-TP group
    tp        8 x (layers/rank) x M x (s b / CP) x h x 2 B x (TP-1)/TP (all-gather / reduce-scatter pairs)
    cp        3 x (layers/rank) x M x (CP-1) x (s b / CP) x 2 kv x 2 B / TP (the KV ring)
    dp        dense params x 6 B x (DP CP - 1)/(DP CP) + expert params x 6 B x (EDP-1)/EDP (fp32
              gradient reduce-scatter + bf16 parameter all-gather), over the scale-out network when the
              world leaves the domain; with overlap_grad_reduce only what the backward pass (2/3 of
              compute) cannot hide, and at least the last bucket (1 / (M x VPP) of it)
    bubble    (PP-1) / (VPP x M) x (compute + ep + etp + tp + cp)
    p2p       2 x VPP x M x rows x h x 2 B per stage boundary, scale-out when PP crosses nodes
    step      the sum

Candidates are ranked with the workflow's priorities (workflow.md §5.1) as they apply to every
layout — CP only once the sequence reaches 8K, ETP 1 before expert-tensor parallelism — and then by
step time; ties break on less model parallelism, EP x ETP inside the NVLink domain, fewer chunks,
the larger micro batch. The model leaves out kernel efficiency beyond the roofline, overlap other than
the gradient reduce and the EP all-to-all (as configured), routing imbalance and network contention:
use it to choose what to screen, then measure (screening, compare).

Pure: standard library only.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any, Iterator

from moe_hydra import flops, memory, metrics, params, plan, rules
from moe_hydra.arch import Arch
from moe_hydra.layout import Layout
from moe_hydra.rules.base import _divisors
from moe_hydra.versions import McoreFacts, mcore_facts

RECOMPUTE_LEVELS = ("none", "selective", "full")
NOMINAL_TFLOPS, NOMINAL_GB_S = 1.0, 10.0
OVERRIDES_FOR = 100  # ranked candidates whose layouts.json row carries its command-line overrides
CP_FROM_SEQ = 8192  # workflow.md §5.1: CP once the sequence makes attention memory dominant (>= 8K)


@dataclass(frozen=True, slots=True)
class Candidate:
    tp: int
    cp: int
    pp: int
    vpp: int | None
    ep: int
    etp: int
    mbs: int
    split: str  # "even" | "account" | a pipeline_model_parallel_layout string

    def fields(self) -> dict[str, Any]:
        """This layout as ``parallel`` fields (the one mapping the config copy, the overrides and the search's
        in-place evaluation share)."""
        string = self.split not in ("even", "account")
        return {
            "tensor_model_parallel_size": self.tp, "context_parallel_size": self.cp,
            "pipeline_model_parallel_size": self.pp, "virtual_pipeline_model_parallel_size": self.vpp,
            "pipeline_model_parallel_layout": self.split if string else None,
            "account_for_embedding_in_pipeline_split": self.split == "account",
            "account_for_loss_in_pipeline_split": self.split == "account",
            "sequence_parallel": self.tp > 1,
            "expert_model_parallel_size": self.ep, "expert_tensor_parallel_size": self.etp,
        }

    def parallel(self, base: Any) -> Any:
        """``base`` (a ParallelConfig) set to this layout."""
        return replace(base, **self.fields(), num_layers_in_first_pipeline_stage=None,
                       num_layers_in_last_pipeline_stage=None)

    def overrides(self) -> list[str]:
        """The command-line overrides that select this layout."""

        def value(v: Any) -> str:
            if v is None:
                return "null"
            if isinstance(v, bool):
                return str(v).lower()
            return f"'{v}'" if isinstance(v, str) else str(v)

        return [f"parallel.{k}={value(v)}" for k, v in self.fields().items()] + [f"train.micro_batch_size={self.mbs}"]

    def describe(self) -> str:
        vpp = f" VPP{self.vpp}" if self.vpp else ""
        return f"TP{self.tp} CP{self.cp} PP{self.pp}{vpp} EP{self.ep} ETP{self.etp} MBS{self.mbs}"


def pipeline_split(a: Arch, pp: int, vpp: int | None) -> str | None:
    """The split Megatron recipes use for ``pp x vpp`` stages, or None when none exists."""
    stages = pp * (vpp or 1)
    if stages == 1 or (a.num_layers % stages == 0 and not a.mtp):
        return "even"
    if (a.num_layers + 2) % stages == 0 and not a.mtp:
        return "account"
    slots, rem = divmod(a.num_layers + 2 + a.mtp, stages)
    if rem or slots < 1 + a.mtp:
        return "even" if a.num_layers % stages == 0 else None
    first = "E" + "t" * (slots - 1)
    last = "t" * (slots - 1 - a.mtp) + "m" * a.mtp + "L"
    middle = "t" * slots
    inner = f"({middle}|)*{stages - 2}" if stages > 2 else ""
    return f"{first}|{inner}{last}"


def enumerate_layouts(cfg: Any, micro_batch_sizes: list[int] | None = None) -> Iterator[Candidate]:
    """Every candidate layout of the config's world size (before the rules)."""
    a = Arch.from_model(cfg.model)
    world = cfg.hardware.nodes * cfg.hardware.devices_per_node
    divs = _divisors(world)
    experts = [d for d in divs if not a.experts or a.experts % d == 0] if a.experts else [1]
    for mbs in micro_batch_sizes or [cfg.train.micro_batch_size]:
        for pp in divs:
            vpps = [None] + [v for v in range(2, a.num_layers // pp + 2)] if pp > 1 else [None]
            splits = [(v, s) for v in vpps if (s := pipeline_split(a, pp, v)) is not None]
            for tp in divs:
                for cp in divs:
                    if world % (tp * cp * pp):
                        continue
                    for ep in experts:
                        for etp in divs:
                            if world % (etp * ep * pp):
                                continue
                            for vpp, split in splits:
                                yield Candidate(tp, cp, pp, vpp, ep, etp, mbs, split)


@dataclass(slots=True)
class Result:
    candidate: Candidate
    violations: list[str]
    recompute: str | None = None  # the least recompute that fits
    memory_gib: float | None = None
    fits: bool | None = None
    terms: dict[str, float] | None = None
    rank: int | None = None
    pruned: bool = False  # weights + gradients alone exceed the memory: the rules were not run

    @property
    def legal(self) -> bool:
        return not self.violations

    def as_dict(self, world: int) -> dict[str, Any]:
        """A ``layouts.json`` row: every field for a ranked candidate; the verdict and why for the rest."""
        c = self.candidate
        lo = Layout(world, c.tp, c.cp, c.pp, c.vpp, c.ep, c.etp, c.tp > 1)
        row = {"rank": self.rank, "layout": lo.describe(), "micro_batch_size": c.mbs,
               "legal": None if self.pruned else self.legal, "fits": self.fits,
               "memory_gib": None if self.memory_gib is None else round(self.memory_gib, 3),
               "recompute": self.recompute}
        if self.violations:
            row.update(violations=sorted({v[1:v.index("]")] for v in self.violations}),
                       first_violation=self.violations[0])
        if self.pruned:
            row["pruned"] = "weights and gradients alone exceed the device memory (rules not checked)"
        if self.terms:
            row.update(parallel=lo.to_megatron(), pipeline_split=c.split, step_time_s=round(self.terms["step"], 5),
                       terms_s={k: round(v, 5) for k, v in self.terms.items()})
        return row


class Search:
    """One search: the base config, its fixed batch, presets and rates read once."""

    def __init__(self, cfg: Any, micro_batch_sizes: list[int] | None = None, mcore: McoreFacts | None = None):
        self.mcore = mcore or mcore_facts()
        self.arch = Arch.from_model(cfg.model)
        self.world = cfg.hardware.nodes * cfg.hardware.devices_per_node
        self.mbs = micro_batch_sizes or [cfg.train.micro_batch_size]
        gbs = cfg.train.global_batch_size or math.lcm(*self.mbs) * self.world
        self.cfg = replace(cfg, train=replace(cfg.train, global_batch_size=gbs))
        # The least recompute that fits, from the configured level up the workflow's ladder; a custom
        # recompute setting is kept as it is.
        name = cfg.recompute.name
        levels = RECOMPUTE_LEVELS[RECOMPUTE_LEVELS.index(name):] if name in RECOMPUTE_LEVELS else (name,)
        self.recompute = {level: cfg.recompute if level == name else self._preset_level(level, cfg.recompute)
                          for level in levels}
        self.work = copy.deepcopy(self.cfg)
        # the candidates' splits replace uneven first/last stages, as Candidate.parallel does
        self.work.parallel.num_layers_in_first_pipeline_stage = None
        self.work.parallel.num_layers_in_last_pipeline_stage = None
        self.base_recompute, self.base_name = self.work.recompute, cfg.recompute.name
        self.fixed_violations = rules.check(self.cfg, self.mcore, self.arch, reads=("fixed",))
        self.mesh_violations: dict[tuple, list] = {}
        self.mesh_terms: dict[tuple, tuple] = {}
        self.rank_params: dict[tuple, list] = {}
        self.estimators: dict[tuple, memory.Estimator] = {}
        self.pipeline_violations: dict[tuple, list] = {}
        self.recompute_rule_cache: dict[tuple, list] = {}
        self.te_spec, self.flash = plan.te_spec(cfg), cfg.hardware.arch != "cpu"
        self.flex = cfg.dispatcher.moe_token_dispatcher_type == "flex"
        self.remote_copies: dict[tuple[int, int], float] = {}
        self.cap = cfg.hardware.memory_gib
        self.cap_bytes = None if self.cap is None else self.cap * memory.GIB
        total = params.total_params(self.arch)
        self.expert_total = params.routed_expert_params(self.arch)
        self.dense_total = total - self.expert_total
        wdt = cfg.precision.params_dtype
        grads = "fp32" if wdt == "fp32" else cfg.optimizer.main_grads_dtype
        self.state_bytes = memory.DTYPE_BYTES[wdt] + memory.DTYPE_BYTES[grads]  # weights + gradients per parameter
        hw = cfg.hardware
        peak, _ = metrics.peak_tflops(hw, cfg.precision)
        self.flops_s = (peak or NOMINAL_TFLOPS) * 1e12
        self.nvlink = (hw.nvlink_bandwidth_gb_s or 2 * NOMINAL_GB_S) / 2 * 1e9  # declared bidirectional
        self.scaleout = (hw.scaleout_bandwidth_gb_s or NOMINAL_GB_S) * 1e9
        self.domain = hw.nvlink_domain_size
        fl = flops.flops_per_token(self.arch, cfg.train.seq_length)
        self.fpt, self.fpt_expert = fl.total, fl.routed_experts
        self.fpt_dense = fl.total - fl.routed_experts
        self.hbm = (hw.hbm_bandwidth_tb_s or NOMINAL_GB_S / 1000) * 1e12
        self.recompute_flops = {"none": 1.0, "full": 4 / 3,
                                "selective": 1 + (fl.attention_core / 3) / fl.total}

    def evaluate(self, c: Candidate) -> Result:
        """Rules, counts, the least recompute that fits, and the step-time terms of one candidate."""
        if self.cap is not None:  # weights + gradients of an average rank: a lower bound on the most loaded one
            floor = self.state_bytes * (self.dense_total / (c.tp * c.pp) + self.expert_total / (c.ep * c.etp * c.pp))
            if floor > self.cap_bytes:
                return Result(c, [], None, floor / memory.GIB, False, pruned=True)
        cfg, p = self.work, self.work.parallel  # private copies, set in place: thousands of layouts per second
        for field, value in c.fields().items():
            setattr(p, field, value)
        cfg.train.micro_batch_size = c.mbs
        cfg.recompute = self.base_recompute
        mesh = (c.tp, c.cp, c.pp, c.ep, c.etp, c.mbs)
        mesh_v = self.mesh_violations.get(mesh)
        if mesh_v is None:
            mesh_v = self.mesh_violations[mesh] = rules.check(cfg, self.mcore, self.arch, reads=("mesh",))
        pipe = (c.pp, c.vpp, c.split, self.world // (c.tp * c.cp * c.pp), c.mbs)
        pipe_v = self.pipeline_violations.get(pipe)
        if pipe_v is None:
            pipe_v = self.pipeline_violations[pipe] = rules.check(cfg, self.mcore, self.arch, reads=("pipeline",))
        rc_v = self._recompute_violations(c, self.base_name)
        if self.fixed_violations or mesh_v or pipe_v or rc_v:
            return Result(c, [f"[{v.rule}] {v.message}" for v in (*self.fixed_violations, *mesh_v, *pipe_v, *rc_v)])
        lo = Layout(self.world, c.tp, c.cp, c.pp, c.vpp, c.ep, c.etp, c.tp > 1)
        split = params.stages(self.arch, lo, p)
        key = (c.tp, c.etp, c.ep, c.pp, c.vpp, c.split)  # parameters do not depend on CP or the micro batch
        cached = self.rank_params.get(key)
        if cached is None:
            ranks = params.params_per_rank(self.arch, lo, p, te_spec=self.te_spec, split=split)
            cached = self.rank_params[key] = (ranks, memory.peak_candidates(self.arch, split, ranks), None)
        ranks, stages_to_check, static = cached
        m = cfg.train.global_batch_size // (c.mbs * lo.dp)
        terms = self.mesh_terms.get(mesh)
        if terms is None:  # the activation terms depend on the mesh, not on VPP or the split
            terms = self.mesh_terms[mesh] = (
                memory.layer_terms(cfg, lo, self.arch, False, flash=self.flash),
                memory.layer_terms(cfg, lo, self.arch, True, flash=self.flash) if self.arch.experts else {})
        cap = cfg.hardware.memory_gib
        for name, rc in self.recompute.items():
            if name != self.base_name and self._recompute_violations(c, name):
                continue  # e.g. full recompute with EP overlap
            cfg.recompute = rc
            est = self.estimators.get((mesh, name))
            if est is None:  # what an estimator precomputes depends on the mesh and the recompute only
                est = self.estimators[(mesh, name)] = memory.Estimator(cfg, lo, self.arch, m, flash=self.flash,
                                                                       terms=terms)
            est.lo = lo  # this candidate's VPP
            if static is None:  # the states depend on the parameters and DP x CP (= world / (TP PP)) and EDP only
                static = est.static(ranks)
                self.rank_params[key] = (ranks, stages_to_check, static)
            peak = est.peak(split, static, stages_to_check) / memory.GIB
            fits = None if cap is None else peak <= cap
            if fits is not False:
                break
            if max(map(sum, static)) / memory.GIB > cap:  # the states alone: no recompute helps
                break
        return Result(c, [], name, peak, fits, self._terms(cfg, lo, ranks, m, name))

    def _preset_level(self, level: str, node: Any) -> Any:
        """A rung of the recompute ladder as stage=plan's suggestions apply it (selective: MLA-aware)."""
        return plan.apply_overrides(replace(self.cfg, recompute=node), self._level_overrides(level)).recompute

    def _level_overrides(self, level: str) -> list[str]:
        return plan.selective_recompute(self.arch) if level == "selective" else [f"recompute={level}"]

    def _recompute_violations(self, c: Candidate, level: str) -> list:
        key = (c.pp, c.vpp, c.split, c.ep, level)
        if key not in self.recompute_rule_cache:
            self.work.recompute = self.recompute.get(level, self.base_recompute)
            self.recompute_rule_cache[key] = rules.check(self.work, self.mcore, self.arch, reads=("recompute",))
        return self.recompute_rule_cache[key]

    def _remote_copies(self, lo: Layout) -> float:
        """Copies of each token that cross the scale-out network in the all-to-all. The alltoall and
        allgather dispatchers send one per routed expert on another node; the flex dispatchers
        (DeepEP, HybridEP) one per other node routed to, forwarding inside the node over NVLink. Routing
        is taken as uniform, or limited to ``moe_router_group_topk`` groups when the groups fall on nodes."""
        key = (lo.ep, lo.etp)
        if key not in self.remote_copies:
            self.remote_copies[key] = self._count_remote_copies(lo)
        return self.remote_copies[key]

    def _count_remote_copies(self, lo: Layout) -> float:
        a, group = self.arch, lo.ep * lo.etp
        nodes = math.ceil(group / self.domain)
        if nodes <= 1:
            return 0.0
        if self.flex:
            reached = nodes * (1 - (1 - 1 / nodes) ** a.topk)
            groups, group_topk = self.cfg.model.moe_router_num_groups, self.cfg.model.moe_router_group_topk
            if groups and group_topk and groups % nodes == 0:
                reached = min(reached, group_topk)  # node-limited routing
            return reached * (nodes - 1) / nodes
        return a.topk * (lo.ep - 1) / lo.ep * (1 - self.domain / group)

    def _terms(self, cfg: Any, lo: Layout, ranks: list[params.RankParams], m: int, recompute: str) -> dict[str, float]:
        a, s, b = self.arch, cfg.train.seq_length, cfg.train.micro_batch_size
        world, domain, nvl, out = self.world, self.domain, self.nvlink, self.scaleout
        tokens_step = cfg.train.global_batch_size * s
        worst = max(ranks, key=lambda r: r.total)
        # roofline per pipeline rank: the GEMMs' FLOPs at peak, or their weights streamed from HBM once per
        # pass (read forward, read for the data gradient, fp32 main-grad read + write: 12 B per parameter)
        # for every micro-batch, whichever is slower, for the dense part and the routed experts apart
        per_rank = tokens_step * self.recompute_flops[recompute] / world
        compute = (max(self.fpt_dense * per_rank / self.flops_s, 12 * worst.dense * m / self.hbm)
                   + max(self.fpt_expert * per_rank / self.flops_s, 12 * worst.expert * m / self.hbm))
        seq_rows = s * b / lo.cp
        rows = seq_rows / lo.tp if lo.sp else seq_rows
        layers = (a.num_layers + a.mtp) / lo.pp
        moe_layers = (a.n_moe + (a.mtp if a.mtp_is_moe else 0)) / lo.pp
        ep = 0.0
        if lo.ep > 1:
            per_copy = 4 * moe_layers * m * rows * a.h * 2  # one token copy: dispatch + combine, forward + backward
            inside = min(1.0, domain / (lo.ep * lo.etp))
            ep = per_copy * a.topk * (lo.ep - 1) / lo.ep * inside / nvl
            ep += per_copy * self._remote_copies(lo) / out
            if cfg.overlap.overlap_moe_expert_parallel_comm:  # hidden under another micro-batch's compute
                ep = max(0.0, ep - compute)
        etp = 0.0
        if lo.etp > 1:  # tokens all-gathered to and reduce-scattered from the expert-TP group, fwd + bwd
            etp = (4 * moe_layers * m * rows * a.topk * a.h * 2 * (lo.etp - 1)
                   / (nvl if lo.ep * lo.etp <= domain else out))
        tp = 8 * layers * m * seq_rows * a.h * 2 * (lo.tp - 1) / lo.tp / (nvl if lo.tp * lo.cp <= domain else out)
        cp = (3 * layers * m * (lo.cp - 1) * seq_rows * 2 * a.kv_width * 2 / lo.tp
              / (nvl if lo.tp * lo.cp <= domain else out))
        dp_bw = nvl if world <= domain else out
        dense_dp, edp = world // (lo.tp * lo.pp), world // (lo.ep * lo.etp * lo.pp)  # DP x CP, EDP
        dp = (worst.dense * 6 * (dense_dp - 1) / dense_dp + worst.expert * 6 * (edp - 1) / edp) / dp_bw
        if cfg.overlap.overlap_grad_reduce:  # bucketed reduce-scatter under the backward pass (2/3 of compute)
            dp = max(dp / (m * (lo.vpp or 1)), dp - 2 / 3 * compute)
        vpp = lo.vpp or 1
        bubble = (lo.pp - 1) / (vpp * m) * (compute + ep + etp + tp + cp)
        p2p_bw = out if world // lo.pp >= domain and world > domain else nvl
        p2p = 2 * vpp * m * rows * a.h * 2 / p2p_bw if lo.pp > 1 else 0.0
        terms = {"compute": compute, "ep": ep, "etp": etp, "tp": tp, "cp": cp, "dp": dp, "bubble": bubble, "p2p": p2p}
        terms["step"] = sum(terms.values())
        return terms

    def run(self) -> list[Result]:
        """Every candidate, evaluated; the legal ones that fit ranked 1..n."""
        results = [self.evaluate(c) for c in enumerate_layouts(self.cfg, self.mbs)]
        rank(results, self.domain, self.cfg.train.seq_length)
        return results


    def overrides(self, r: Result) -> list[str]:
        """The overrides that run a candidate as the search evaluated it: layout, micro batch, recompute,
        and the search's fixed global batch."""
        out = r.candidate.overrides() + [f"train.global_batch_size={self.cfg.train.global_batch_size}"]
        if r.recompute and r.recompute != self.base_name:
            out += self._level_overrides(r.recompute)
        return out

    def report(self, results: list[Result], seconds: float) -> dict[str, Any]:
        """``layouts.json``: every candidate (rank, legality, memory, terms, overrides), best first."""
        ranked = sorted((r for r in results if r.rank), key=lambda r: r.rank)
        rest = [r for r in results if not r.rank]
        cfg = self.cfg
        return {
            "model": cfg.model.name, "hardware": cfg.hardware.name, "world_size": self.world,
            "global_batch_size": cfg.train.global_batch_size, "seq_length": cfg.train.seq_length,
            "memory_gib": cfg.hardware.memory_gib, "recompute_levels": list(self.recompute),
            "counts": {"candidates": len(results), "legal": sum(r.legal and not r.pruned for r in results),
                       "pruned_by_memory": sum(r.pruned for r in results),
                       "fit": sum(r.legal and r.fits is not False for r in results), "ranked": len(ranked)},
            "search_seconds": round(seconds, 3),
            "step_time_model": "moe_hydra.search (analytic, peak rates; see the module documentation)",
            # overrides for the best: the rest follow from parallel, micro_batch_size and recompute
            "candidates": [{**r.as_dict(self.world), **({"overrides": self.overrides(r)} if i < OVERRIDES_FOR else {})}
                           for i, r in enumerate(ranked + rest)],
        }


def _priority(r: Result, domain: int, seq: int) -> tuple:
    c = r.candidate
    return (c.cp > 1 and seq < CP_FROM_SEQ, c.etp > 1, round(r.terms["step"], 6), c.tp * c.cp * c.pp,
            c.ep * c.etp > domain, c.vpp or 1, -c.mbs)


def rank(results: list[Result], domain: int, seq: int) -> None:
    """Rank the legal candidates that fit (or whose fit is unknown): CP only for long sequences and
    ETP 1 first (workflow.md §5.1, 5 and 4), then by step time, then the other priorities."""
    ok = [r for r in results if r.legal and r.fits is not False]
    for i, r in enumerate(sorted(ok, key=lambda r: _priority(r, domain, seq)), 1):
        r.rank = i
