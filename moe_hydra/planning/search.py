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

**Communication settings.** A Search may also try other dispatchers and EP overlap with every layout
(the layout sweeper does unless the command sets them): cross-node expert parallelism is a different
strategy with a flex dispatcher and EP overlap than without. A layout keeps the fastest setting that
passes the rules that read it (dispatcher L35-L45, EP overlap L65-L73) and fits at the layout's least
recompute or above (a flex dispatcher's buffers and EP overlap's extra micro-batch in flight cost
memory). A flex dispatcher is tried only where the EP group leaves the NVLink domain: inside it, the
step-time model gives it the time of the all-to-all.

**Rank** by the analytic step time of :mod:`moe_hydra.step_model` (a ranking aid, every term printed per
layout), after the workflow's priorities (workflow.md §5.1) that apply to every layout — CP only once
the sequence reaches 8K, ETP 1 before expert-tensor parallelism; ties break on less model
parallelism, EP x ETP inside the NVLink domain, fewer chunks, the larger micro batch. Use it to choose
what to screen, then measure (screening, compare).

Pure: standard library only.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import multiprocessing
import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Iterator

from moe_hydra.core import params
from moe_hydra.core.arch import Arch
from moe_hydra.core.layout import Layout
from moe_hydra.core.versions import McoreFacts, mcore_facts
from moe_hydra.planning import memory, plan, rules
from moe_hydra.planning.rules.base import _divisors
from moe_hydra.planning.step_model import TERMS, StepModel

RECOMPUTE_LEVELS = ("none", "selective", "full")
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


@dataclass(frozen=True, slots=True)
class Comm:
    """The communication settings a layout is evaluated with: a dispatcher preset and EP overlap."""

    dispatcher: str  # conf/dispatcher/<name>.yaml
    ep_overlap: bool  # overlap.overlap_moe_expert_parallel_comm
    flex: bool  # the preset's moe_token_dispatcher_type is flex

    def describe(self) -> str:
        return self.dispatcher + (" +EP overlap" if self.ep_overlap else "")


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
    comm: Comm | None = None  # the communication settings the terms are for

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
        if self.comm:
            row.update(dispatcher=self.comm.dispatcher, overlap_moe_expert_parallel_comm=self.comm.ep_overlap)
        if self.terms:
            row.update(parallel=lo.to_megatron(), pipeline_split=c.split, step_time_s=round(self.terms["step"], 5),
                       terms_s={k: round(v, 5) for k, v in self.terms.items()})
        return row


class Search:
    """One search: the base config, its fixed batch, presets and rates read once.

    ``dispatchers`` (dispatcher preset names) and ``ep_overlap`` (values of
    ``overlap.overlap_moe_expert_parallel_comm``): the communication settings to try with every layout;
    None tries the configured one only. The first of each is the primary setting: legality and the
    least recompute that fits are decided with it."""

    def __init__(self, cfg: Any, micro_batch_sizes: list[int] | None = None, mcore: McoreFacts | None = None,
                 dispatchers: list[str] | None = None, ep_overlap: list[bool] | None = None):
        self.mcore = mcore or mcore_facts()
        self.arch = Arch.from_model(cfg.model)
        self.world = cfg.hardware.nodes * cfg.hardware.devices_per_node
        self.mbs = micro_batch_sizes or [cfg.train.micro_batch_size]
        gbs = cfg.train.global_batch_size or math.lcm(*self.mbs) * self.world
        self.cfg = replace(cfg, train=replace(cfg.train, global_batch_size=gbs))
        # the communication settings: the primary first (legality and fit are decided with it)
        names = list(dict.fromkeys(dispatchers or [cfg.dispatcher.name]))
        overlaps = list(dict.fromkeys(ep_overlap if ep_overlap is not None
                                      else [cfg.overlap.overlap_moe_expert_parallel_comm]))
        self.dispatcher_nodes = {n: cfg.dispatcher if n == cfg.dispatcher.name else plan.preset("dispatcher", n, cfg.dispatcher)
                                 for n in names}
        self.comms = [Comm(n, o, self.dispatcher_nodes[n].moe_token_dispatcher_type == "flex")
                      for n in names for o in overlaps]
        primary = self.comms[0]
        self.cfg.dispatcher = self.dispatcher_nodes[primary.dispatcher]
        self.cfg.overlap = replace(self.cfg.overlap, overlap_moe_expert_parallel_comm=primary.ep_overlap)
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
        # the ladder from each level up: where another communication setting may need more recompute
        self.levels_from = {lvl: list(self.recompute)[i:] for i, lvl in enumerate(self.recompute)}
        self.fixed_violations = rules.check(self.cfg, self.mcore, self.arch, reads=("fixed",))
        self.mesh_violations: dict[tuple, list] = {}
        self.mesh_terms: dict[tuple, tuple] = {}
        self.rank_params: dict[tuple, list] = {}
        self.estimators: dict[tuple, memory.Estimator] = {}
        self.pipeline_violations: dict[tuple, list] = {}
        self.recompute_rule_cache: dict[tuple, list] = {}
        self.comm_rule_cache: dict[tuple, bool] = {}
        self.splits: dict[tuple, tuple] = {}
        self.messages: dict[tuple, list[str]] = {}
        self._current: Candidate | None = None  # whose layout fields self.work holds
        self._peak_cache: tuple = (None, None)  # the last (candidate, level) and its peaks
        self.te_spec, self.flash = plan.te_spec(cfg), cfg.hardware.arch != "cpu"
        self.flex_gib = self.cfg.memory.flex_dispatcher_gib
        self.cap = cfg.hardware.memory_gib
        self.cap_bytes = None if self.cap is None else self.cap * memory.GIB
        total = params.total_params(self.arch)
        self.expert_total = params.routed_expert_params(self.arch)
        self.dense_total = total - self.expert_total
        # weights + gradients per parameter
        self.state_bytes = memory.DTYPE_BYTES[cfg.precision.params_dtype] + memory.grad_bytes(cfg)
        self.domain = cfg.hardware.nvlink_domain_size
        self.model = StepModel(self.cfg, self.arch, self.world)
        # the user's settings, which a row's overrides change when its setting differs
        self.base_dispatcher, self.base_overlap = cfg.dispatcher.name, cfg.overlap.overlap_moe_expert_parallel_comm

    def evaluate(self, c: Candidate) -> Result:
        """Rules, counts, the least recompute that fits, and the step-time terms of one candidate (with the
        fastest communication setting that is legal and fits)."""
        if self.cap is not None:  # weights + gradients of an average rank: a lower bound on the most loaded one
            floor = self.state_bytes * (self.dense_total / (c.tp * c.pp) + self.expert_total / (c.ep * c.etp * c.pp))
            if floor > self.cap_bytes:
                return Result(c, [], None, floor / memory.GIB, False, pruned=True)
        cfg = self.work  # a private copy, set in place (its layout fields only where a cache misses)
        cfg.train.micro_batch_size = c.mbs
        cfg.recompute = self.base_recompute
        self._current = None
        mesh = (c.tp, c.cp, c.pp, c.ep, c.etp, c.mbs)
        mesh_v = self.mesh_violations.get(mesh)
        if mesh_v is None:
            mesh_v = self.mesh_violations[mesh] = rules.check(self._set(c), self.mcore, self.arch, reads=("mesh",))
        pipe = (c.pp, c.vpp, c.split, self.world // (c.tp * c.cp * c.pp), c.mbs)
        pipe_v = self.pipeline_violations.get(pipe)
        if pipe_v is None:
            pipe_v = self.pipeline_violations[pipe] = rules.check(self._set(c), self.mcore, self.arch, reads=("pipeline",))
        rc_v = self._recompute_violations(c, self.base_name)
        if self.fixed_violations or mesh_v or pipe_v or rc_v:
            key = (id(mesh_v), id(pipe_v), id(rc_v))  # the cached lists: one message list per combination
            messages = self.messages.get(key)
            if messages is None:
                messages = self.messages[key] = [f"[{v.rule}] {v.message}"
                                                  for v in (*self.fixed_violations, *mesh_v, *pipe_v, *rc_v)]
            return Result(c, messages)
        lo = Layout(self.world, c.tp, c.cp, c.pp, c.vpp, c.ep, c.etp, c.tp > 1)
        split = self.splits.get((c.pp, c.vpp, c.split))
        if split is None:
            split = self.splits[(c.pp, c.vpp, c.split)] = params.stages(self.arch, lo, self._set(c).parallel)
        key = (c.tp, c.etp, c.ep, c.pp, c.vpp, c.split)  # parameters do not depend on CP or the micro batch
        cached = self.rank_params.get(key)
        if cached is None:
            ranks = params.params_per_rank(self.arch, lo, self._set(c).parallel, te_spec=self.te_spec, split=split)
            cached = self.rank_params[key] = [ranks, memory.peak_candidates(self.arch, split, ranks), None,
                                              max(ranks, key=lambda r: r.total)]
        ranks, stages_to_check, static, worst = cached
        if static is None:  # the states depend on the parameters and DP x CP (= world / (TP PP)) and EDP only
            static = cached[2] = self._estimator(c, mesh, lo, self.base_name).static(ranks)
        level, peak, fits = self._least_recompute(c, mesh, lo, split, static, stages_to_check)
        comm = self.comms[0]
        if fits is not False and len(self.comms) > 1:
            comm, level, peak = self._fastest_comm(c, mesh, lo, level, peak, worst, split, static, stages_to_check)
        terms = self.model.terms(lo, worst.dense, worst.expert, c.mbs, level, comm.flex, comm.ep_overlap)
        return Result(c, [], level, peak, fits, terms, comm=comm)

    def _fastest_comm(self, c: Candidate, mesh: tuple, lo: Layout, level: str, peak: float, worst, split, static,
                      stages) -> tuple[Comm, str, float]:
        """(setting, recompute, peak GiB): the fastest communication setting that the rules accept and that
        fits, at the primary's least recompute or above."""
        model, primary = self.model, self.comms[0]
        best = (primary, level, peak)
        best_step = model.step(lo, worst.dense, worst.expert, c.mbs, level, primary.flex, primary.ep_overlap)
        cross_node = c.ep * c.etp > self.domain
        for comm in self.comms[1:]:
            if (comm.flex and not cross_node and not primary.flex) or (comm.ep_overlap and c.ep == 1):
                continue  # the model gives the same time (flex inside the domain), or a rule refuses it (L65)
            for lvl in self.levels_from[level]:
                step = model.step(lo, worst.dense, worst.expert, c.mbs, lvl, comm.flex, comm.ep_overlap)
                if step >= best_step:
                    break  # more recompute only adds time
                if self._level_refused(c, lvl) or not self._comm_legal(c, mesh, lvl, comm):
                    continue
                peak_c = self._peak_with(c, mesh, lo, lvl, comm, split, static, stages)
                if self.cap is None or peak_c <= self.cap:
                    best, best_step = (comm, lvl, peak_c), step
                    break
        return best

    def _set(self, c: Candidate) -> Any:
        """The working config with ``c``'s layout fields (set once per candidate, when a cache misses)."""
        if self._current is not c:
            p = self.work.parallel
            for field, value in c.fields().items():
                setattr(p, field, value)
            self._current = c
        return self.work

    def _least_recompute(self, c: Candidate, mesh: tuple, lo: Layout, split, static, stages) -> tuple:
        """(level, peak GiB, fits) with the primary communication setting: the least recompute that fits."""
        cap, overlap = self.cap, self.comms[0].ep_overlap
        for name in self.recompute:
            if self._level_refused(c, name):
                continue  # e.g. full recompute with EP overlap
            peak = self._peaks(c, mesh, lo, name, split, static, stages)[overlap]
            fits = None if cap is None else peak <= cap
            if fits is not False:
                break
            if max(map(sum, static)) / memory.GIB > cap:  # the states alone: no recompute helps
                break
        return name, peak, fits

    def _peaks(self, c: Candidate, mesh: tuple, lo: Layout, level: str, split, static, stages) -> tuple[float, float]:
        """The peak (GiB) at a recompute level, without and with EP overlap (the primary dispatcher's
        buffers; :meth:`_peak_with` adds another's)."""
        key = (c, level)
        if self._peak_cache[0] != key:
            est = self._estimator(c, mesh, lo, level)
            self._peak_cache = (key, tuple(p / memory.GIB for p in est.peaks(split, static, stages)))
        return self._peak_cache[1]

    def _estimator(self, c: Candidate, mesh: tuple, lo: Layout, level: str) -> memory.Estimator:
        """The estimator of a mesh at a recompute level, set to this candidate's VPP (and the work config
        to the level's recompute, which its activations read)."""
        self.work.recompute = self.recompute.get(level, self.base_recompute)
        est = self.estimators.get((mesh, level))
        if est is None:  # what an estimator precomputes depends on the mesh and the recompute only
            terms = self.mesh_terms.get(mesh)
            if terms is None:  # the activation terms depend on the mesh, not on VPP or the split
                terms = self.mesh_terms[mesh] = (
                    memory.layer_terms(self.work, lo, self.arch, False, flash=self.flash),
                    memory.layer_terms(self.work, lo, self.arch, True, flash=self.flash) if self.arch.experts else {})
            m = self.work.train.global_batch_size // (c.mbs * lo.dp)
            est = self.estimators[(mesh, level)] = memory.Estimator(self.work, lo, self.arch, m, flash=self.flash,
                                                                    terms=terms)
        est.lo = lo  # this candidate's VPP
        return est

    def _peak_with(self, c: Candidate, mesh: tuple, lo: Layout, level: str, comm: Comm, split, static, stages) -> float:
        """The peak (GiB) with another communication setting: EP overlap holds one more micro-batch chunk in
        flight, a flex dispatcher adds its buffers."""
        peak = self._peaks(c, mesh, lo, level, split, static, stages)[comm.ep_overlap]
        return peak + self.flex_gib * (comm.flex - self.comms[0].flex)

    def _comm_legal(self, c: Candidate, mesh: tuple, level: str, comm: Comm) -> bool:
        """Whether the rules that read the dispatcher or EP overlap accept ``comm`` with this candidate: those
        that read the mesh once per mesh, those that read the pipeline and recompute once per those."""
        keys = ((mesh, comm.dispatcher), (c.pp, c.vpp, c.split, c.ep, level, comm))
        for reads, key in zip(("mesh", "recompute"), keys):
            ok = self.comm_rule_cache.get(key)
            if ok is None:
                cfg, primary = self.work, self.comms[0]
                cfg.recompute = self.recompute.get(level, self.base_recompute)
                cfg.dispatcher = self.dispatcher_nodes[comm.dispatcher]
                cfg.overlap.overlap_moe_expert_parallel_comm = comm.ep_overlap
                try:
                    ok = self.comm_rule_cache[key] = not rules.check(self._set(c), self.mcore, self.arch,
                                                                    reads=(reads,), comm_only=True)
                finally:
                    cfg.dispatcher = self.dispatcher_nodes[primary.dispatcher]
                    cfg.overlap.overlap_moe_expert_parallel_comm = primary.ep_overlap
            if not ok:
                return False
        return True

    def _preset_level(self, level: str, node: Any) -> Any:
        """A rung of the recompute ladder as stage=plan's suggestions apply it (selective: MLA-aware)."""
        return plan.apply_overrides(replace(self.cfg, recompute=node), self._level_overrides(level)).recompute

    def _level_overrides(self, level: str) -> list[str]:
        return plan.selective_recompute(self.arch) if level == "selective" else [f"recompute={level}"]

    def _level_refused(self, c: Candidate, level: str) -> bool:
        """Whether the rules refuse a rung of the recompute ladder above the configured one."""
        return level != self.base_name and bool(self._recompute_violations(c, level))

    def _recompute_violations(self, c: Candidate, level: str) -> list:
        key = (c.pp, c.vpp, c.split, c.ep, level)
        if key not in self.recompute_rule_cache:
            self.work.recompute = self.recompute.get(level, self.base_recompute)
            self.recompute_rule_cache[key] = rules.check(self._set(c), self.mcore, self.arch, reads=("recompute",))
        return self.recompute_rule_cache[key]

    def run(self, workers: int | None = None) -> list[Result]:
        """Every candidate, evaluated; the legal ones that fit ranked 1..n. ``workers``: processes to
        evaluate in (None: one per CPU this process may use, for large searches, on Linux)."""
        candidates = list(enumerate_layouts(self.cfg, self.mbs))
        if workers is None:
            workers = search_workers(len(candidates))
        if workers > 1:
            results = self._run_forked(candidates, workers)
        else:
            results = [self.evaluate(c) for c in candidates]
        rank(results, self.domain, self.cfg.train.seq_length)
        return results

    def _run_forked(self, candidates: list[Candidate], workers: int) -> list[Result]:
        """Evaluate in forked processes. The work is cut into tasks of whole (PP, TP, CP) groups (so a
        process's caches stay warm), largest first, handed out as processes free up; the results come
        back as plain tuples."""
        groups: dict[tuple, list[int]] = {}
        for i, c in enumerate(candidates):
            groups.setdefault((c.pp, c.tp, c.cp), []).append(i)
        tasks: list[list[int]] = []
        size = -(-len(candidates) // (16 * workers))  # ~16 tasks per process
        for g in sorted(groups.values(), key=len, reverse=True):
            if tasks and len(tasks[-1]) + len(g) <= size:
                tasks[-1].extend(g)
            else:
                tasks.append(list(g))
        global _FORKED
        _FORKED = (self, candidates, tasks)
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                packed = list(pool.imap_unordered(_evaluate_share, range(len(tasks))))
        finally:
            _FORKED = None
        results: list[Result | None] = [None] * len(candidates)
        for k, rows, violations in packed:
            for i, row in zip(tasks[k], rows):
                results[i] = _unpack(candidates[i], row, violations, self.comms)
        return results

    def overrides(self, r: Result) -> list[str]:
        """The overrides that run a candidate as the search evaluated it: layout, micro batch, recompute,
        and the search's fixed global batch."""
        out = r.candidate.overrides() + [f"train.global_batch_size={self.cfg.train.global_batch_size}"]
        if r.recompute and r.recompute != self.base_name:
            out += self._level_overrides(r.recompute)
        if r.comm and r.comm.dispatcher != self.base_dispatcher:
            out.append(f"dispatcher={r.comm.dispatcher}")
        if r.comm and r.comm.ep_overlap != self.base_overlap:
            out.append(f"overlap.overlap_moe_expert_parallel_comm={str(r.comm.ep_overlap).lower()}")
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
            "step_time_model": {"model": "moe_hydra.step_model (analytic; see its documentation)",
                                **dataclasses.asdict(cfg.step_model)},
            "communication_settings": [c.describe() for c in self.comms],
            # overrides for the best: the rest follow from parallel, micro_batch_size and recompute
            "candidates": [{**r.as_dict(self.world), **({"overrides": self.overrides(r)} if i < OVERRIDES_FOR else {})}
                           for i, r in enumerate(ranked + rest)],
        }


PARALLEL_FROM = 4000  # candidates from which a search forks (below, starting processes costs more than it saves)
_FORKED: tuple | None = None  # (search, candidates, tasks) for the forked workers


def search_workers(candidates: int) -> int:
    """Processes for a search of this many candidates: the CPUs this process may use (its affinity, as
    Slurm and cgroups set it), up to 8, on Linux (fork) and for large searches only; else 1.
    ``MOE_HYDRA_SEARCH_WORKERS`` overrides it."""
    if os.environ.get("MOE_HYDRA_SEARCH_WORKERS"):
        return max(1, int(os.environ["MOE_HYDRA_SEARCH_WORKERS"]))
    if candidates < PARALLEL_FROM or not sys.platform.startswith("linux"):
        return 1
    return max(1, min(8, len(os.sched_getaffinity(0))))


def _evaluate_share(k: int) -> tuple[int, list[tuple], list[list[str]]]:
    """A forked worker: evaluate task ``k``; results as tuples, violation lists numbered (each list once)."""
    s, candidates, tasks = _FORKED
    rows, violations, ids = [], [], {}
    for i in tasks[k]:
        r = s.evaluate(candidates[i])
        v = ids.get(id(r.violations)) if r.violations else None
        if r.violations and v is None:
            v = ids[id(r.violations)] = len(violations)
            violations.append(r.violations)
        terms = tuple(r.terms[t] for t in (*TERMS, "step")) if r.terms else None
        rows.append((v, r.recompute, r.memory_gib, r.fits, r.pruned,
                     None if r.comm is None else s.comms.index(r.comm), terms))
    return k, rows, violations


def _unpack(c: Candidate, row: tuple, violations: list[list[str]], comms: list[Comm]) -> Result:
    v, recompute, memory_gib, fits, pruned, comm, terms = row
    return Result(c, [] if v is None else violations[v], recompute, memory_gib, fits,
                  None if terms is None else dict(zip((*TERMS, "step"), terms)), pruned=pruned,
                  comm=None if comm is None else comms[comm])


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
