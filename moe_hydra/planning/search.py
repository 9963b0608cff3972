"""The layout search: enumerate every Parallel Folding layout of a world size -> legality -> fit -> rank.

**Enumerate.** TP, CP, PP, EP, ETP over the divisors of the world size (TP x CP x PP and
ETP x EP x PP must divide it, EP must divide the experts: rules L01/L02/L10 would refuse the rest),
VPP from none to as many chunks as there are layers, SP on whenever TP > 1 (Megatron needs it for
MoE with TP), and micro-batch sizes when asked. Each (PP, VPP) gets the pipeline splits Megatron
recipes use (:func:`pipeline_splits`, each a candidate): an even split; else the embedding and loss counted as
one layer each (``account_for_*_in_pipeline_split``); else ``pipeline_model_parallel_layout`` strings — with
MTP, E, m and L each taking a layer's slot (``Et|(tt|)*30mL``, DeepSeek-V3 on PP8 x VPP4), and the uneven kinds
(``Etttt|(tttt|)*14tmL`` on PP4 x VPP4, ``Et|(tt|)*30L`` for Kimi-K2 on PP16 x VPP2). Every candidate is
a config (the base config with the candidate's fields), resolved by the same constructor as ``stage=plan``
(:func:`moe_hydra.core.resolved.resolve`), then checked by the same rules and estimates as
:func:`moe_hydra.planning.plan.assess`, each cached by exactly
the resolved fields it reads (:func:`moe_hydra.planning.rules.base.cache_key`). The global batch stays fixed
across candidates (the contract).

**Fit.** The least recompute that fits (none -> the selective module lists -> full, the workflow's order; the
lists by the step model's cost of what they re-run, :func:`recompute_ladder`) is kept
with the candidate; a candidate that fits with none of them is kept as ``fits: false``.

**Communication settings.** A Search may also try other dispatchers and EP overlap with every layout
(the layout sweeper does unless the command sets them): cross-node expert parallelism is a different
strategy with a flex dispatcher and EP overlap than without. A layout keeps the fastest setting that
passes the rules that read it (dispatcher L35-L45, EP overlap L65-L73) and fits at the layout's least
recompute or above (a flex dispatcher's buffers and EP overlap's extra layer in flight cost
memory). A flex dispatcher is tried wherever there is expert parallelism: inside the NVLink domain it sends a
token once per rank rather than once per expert, across it once per node.

With ``hardware.calibration``, a candidate the calibration holds for (its layout measured on this machine, its
recompute and dispatcher measured there) takes the calibration's step time (:mod:`moe_hydra.core.calibrated_step`)
and ranks before those it does not hold for; its ties are within the calibration's held-out error.

**Rank** by the analytic step time of :mod:`moe_hydra.planning.step_model` (a ranking aid, every term printed per
layout), after the workflow's priorities (docs/workflow.md) that apply to every layout — CP only once
the sequence reaches 8K, ETP 1 before expert-tensor parallelism; ties break on less model
parallelism, EP x ETP inside the NVLink domain, fewer chunks, the larger micro batch. Use it to choose
what to screen, then measure (screening, compare).

Pure: standard library only.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Iterator

from moe_hydra.core import calibrated_step, overrides, params
from moe_hydra.core.arch import Arch
from moe_hydra.core.layout import Layout
from moe_hydra.core.resolved import Resolved, resolve
from moe_hydra.core.versions import McoreFacts, mcore_facts
from moe_hydra.planning import memory, plan, rules, step_model, step_time
from moe_hydra.planning.rules.base import READS, _divisors, cache_key
from moe_hydra.planning.step_model import TERMS, StepModel

RECOMPUTE_LEVELS = ("none", "selective", "full")
# The selective module lists the recompute ladder climbs besides the ``selective`` preset, each where the model has
# its modules: the lists NVIDIA's published runs use (benchmarks/data/measured_runs.yaml: Megatron-Bridge's
# performance recipes for DeepSeek-V3, Kimi-K2, GPT-OSS; Megatron-MoE-ModelZoo's Qwen3, long context included).
PUBLISHED_SELECTIVE = (
    ("layernorm", "moe_act"),
    ("mlp",),
    ("mla_up_proj",),
    ("mla_up_proj", "mlp"),
    ("layernorm", "moe"),
)
OVERRIDES_FOR = 100  # ranked candidates whose layouts.json row carries its command-line overrides
CP_FROM_SEQ = 8192  # docs/workflow.md: CP once the sequence makes attention memory dominant (>= 8K)


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
        """This candidate as ``parallel`` fields: what it sets in the config it is resolved from (uneven
        first/last stages are replaced by its split)."""
        string = self.split not in ("even", "account")
        return {
            "tensor_model_parallel_size": self.tp, "context_parallel_size": self.cp,
            "pipeline_model_parallel_size": self.pp, "virtual_pipeline_model_parallel_size": self.vpp,
            "pipeline_model_parallel_layout": self.split if string else None,
            "account_for_embedding_in_pipeline_split": self.split == "account",
            "account_for_loss_in_pipeline_split": self.split == "account",
            "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
            "sequence_parallel": self.tp > 1,
            "expert_model_parallel_size": self.ep, "expert_tensor_parallel_size": self.etp,
        }

    def overrides(self) -> list[str]:
        """The command-line overrides that select this candidate (Hydra's grammar)."""
        return ([overrides.override(f"parallel.{k}", v) for k, v in self.fields().items() if "num_layers_in" not in k]
                + [f"train.micro_batch_size={self.mbs}"])

    def layout(self, world: int) -> Layout:
        """The layout this candidate's config resolves to on ``world`` ranks (what :meth:`fields` sets)."""
        return Layout(world, self.tp, self.cp, self.pp, self.vpp, self.ep, self.etp, self.tp > 1)

    def describe(self) -> str:
        vpp = f" VPP{self.vpp}" if self.vpp else ""
        return f"TP{self.tp} CP{self.cp} PP{self.pp}{vpp} EP{self.ep} ETP{self.etp} MBS{self.mbs}"


def pipeline_splits(a: Arch, pp: int, vpp: int | None) -> list[str]:
    """The splits Megatron recipes use for ``pp x vpp`` stages (none when none exists): an even split; else the
    embedding and loss counted as a layer each; else the pipeline_model_parallel_layout strings of the recipes:
    with MTP, E, m and L each taking a layer's slot (``Et|(tt|)*30mL``, DeepSeek-V3 on PP8 x VPP4), and the uneven
    kinds of :func:`_uneven_splits` with the MTP block before the loss (``Etttt|(tttt|)*14tmL`` on PP4 x VPP4)."""
    stages = pp * (vpp or 1)
    if stages == 1 or (a.num_layers % stages == 0 and not a.mtp):
        return ["even"]
    if (a.num_layers + 2) % stages == 0 and not a.mtp:
        return ["account"]
    out = []
    if a.mtp:
        slots, rem = divmod(a.num_layers + 2 + a.mtp, stages)
        if not rem and slots >= 1 + a.mtp:
            first = "E" + "t" * (slots - 1)
            last = "t" * (slots - 1 - a.mtp) + "m" * a.mtp + "L"
            out.append(f"{first}|({'t' * slots}|)*{stages - 2}{last}" if stages > 2 else f"{first}|{last}")
        elif a.num_layers % stages == 0:
            out.append("even")
    out += [x for x in _uneven_splits(a.num_layers, stages, "m" * a.mtp + "L") if x not in out]
    return out


def pipeline_split(a: Arch, pp: int, vpp: int | None) -> str | None:
    """The first of :func:`pipeline_splits` (the recipes' usual one), or None."""
    return next(iter(pipeline_splits(a, pp, vpp)), None)


def _uneven_splits(layers: int, stages: int, tail: str) -> list[str]:
    """The recipes' splits for layers that do not divide the stages: ``ceil(layers / stages)`` layers on every
    stage but the last, which holds the rest and ``tail`` (the loss, after MTP) (``Etttt|(tttt|)*14tL``, DeepSeek-V3's
    61 layers on 16 stages); and the embedding taking a layer's slot on the first stage, the last holding what is left,
    possibly nothing but the tail (``Et|(tt|)*30L``, Kimi-K2's 61 layers on 32 stages)."""
    if stages < 2:
        return []
    each = -(-layers // stages)
    inner = f"({'t' * each}|)*{stages - 2}" if stages > 2 else ""
    out = []
    rest = layers - each * (stages - 1)
    if rest >= 1:
        out.append(f"E{'t' * each}|{inner}{'t' * rest}{tail}")
    rest = layers - (each - 1) - each * (stages - 2)
    if rest >= 0 and each > 1:
        out.append(f"E{'t' * (each - 1)}|{inner}{'t' * rest}{tail}")
    return out


def level_overrides(a: Arch, level: str) -> list[str]:
    """The overrides of a rung of the recompute ladder: a preset (none | selective | full), or ``selective[m,...]``
    (selective recompute of those modules)."""
    if level == "selective":
        return plan.selective_recompute(a)
    if level.startswith("selective["):
        return ["recompute=selective", f"recompute.recompute_modules={level.removeprefix('selective')}"]
    return [f"recompute={level}"]


def recompute_levels(a: Arch) -> list[str]:
    """The rungs of the recompute ladder for this model, before ordering: none, the ``selective`` preset, the
    published selective lists whose modules the model has, full."""
    has = {"core_attn", "layernorm", *(("moe_act", "moe") if a.experts else ()), *(("mla_up_proj",) if a.mla else ()),
           *(("mlp",) if a.n_dense else ()), *(("shared_experts",) if a.shared_ffn else ())}
    published = [f"selective[{','.join(m)}]" for m in PUBLISHED_SELECTIVE if set(m) <= has]
    return ["none", "selective", *published, "full"]


def recompute_ladder(nodes: dict[str, Any], model: StepModel) -> list[str]:
    """The rungs the search climbs, least recompute first: none, the selective rungs by the step model's cost of
    what they re-run (equal costs keep their order), then full. ``nodes``: each rung's ``recompute`` node. A
    selective rung that removes no more activation terms than a cheaper one is left out."""
    selective = [n for n in nodes if n not in ("none", "full")]
    cost = {n: sum(model.recompute_factors(nodes[n])) for n in selective}
    drops = {n: memory.recompute_drops(nodes[n]) for n in selective}
    rungs: list[str] = []
    for name in sorted(selective, key=cost.__getitem__):
        if not any(drops[kept] >= drops[name] for kept in rungs):
            rungs.append(name)
    return ["none", *rungs, "full"]


def enumerate_layouts(r: Resolved, micro_batch_sizes: list[int] | None = None) -> Iterator[Candidate]:
    """Every candidate layout of the plan's world size (before the rules)."""
    a, world = r.arch, r.layout.world_size
    divs = _divisors(world)
    experts = [d for d in divs if a.experts % d == 0] if a.experts else [1]
    for mbs in micro_batch_sizes or [r.batch.micro_batch_size]:
        for pp in divs:
            vpps = [None] + [v for v in range(2, a.num_layers // pp + 2)] if pp > 1 else [None]
            splits = [(v, s) for v in vpps for s in pipeline_splits(a, pp, v)]
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
    layout: Layout  # as the candidate's config resolved
    violations: list[str]
    recompute: str | None = None  # the least recompute that fits
    memory_gib: float | None = None
    fits: bool | None = None
    terms: dict[str, float] | None = None
    rank: int | None = None
    pruned: bool = False  # weights + gradients alone exceed the memory: the rules were not run
    comm: Comm | None = None  # the communication settings the terms are for
    # with hardware.calibration: whether the terms are the calibration's (True) or the priors' (False: it does not
    # hold for this layout); None without one
    calibrated: bool | None = None

    @property
    def legal(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        """A ``layouts.json`` row: every field for a ranked candidate; the verdict and why for the rest."""
        c, lo = self.candidate, self.layout
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
            if self.calibrated is not None:
                row["step_time_from"] = "calibration" if self.calibrated else "priors"
        return row


# What the search's own caches read of a resolved candidate (besides what stays fixed in one search): the
# parameters per rank (the mesh's model-parallel sizes and the split), the activation terms of a layer
# (memory.layer_terms), the states' sharding (DP x CP, EDP).
_RANKS = attrgetter("layout.tp", "layout.etp", "layout.ep", "layout.pp", "layout.vpp",
                    *(f"cfg.parallel.{f}" for f in ("pipeline_model_parallel_layout", "num_layers_in_first_pipeline_stage",
                                                    "num_layers_in_last_pipeline_stage",
                                                    "account_for_embedding_in_pipeline_split",
                                                    "account_for_loss_in_pipeline_split")))
_TERMS = attrgetter("layout.tp", "layout.cp", "layout.sp", "layout.etp", "layout.ep", "batch.micro_batch_size")
_SHARDS = attrgetter("layout.dp", "layout.cp", "layout.edp")


class Search:
    """One search: the base config, its fixed batch, presets and rates read once.

    ``dispatchers`` (dispatcher preset names) and ``ep_overlap`` (values of
    ``overlap.overlap_moe_expert_parallel_comm``): the communication settings to try with every layout;
    None tries the configured one only. The first of each is the primary setting: legality and the
    least recompute that fits are decided with it."""

    def __init__(self, cfg: Any, micro_batch_sizes: list[int] | None = None, mcore: McoreFacts | None = None,
                 dispatchers: list[str] | None = None, ep_overlap: list[bool] | None = None):
        self.mcore = mcore or mcore_facts()
        world = cfg.hardware.nodes * cfg.hardware.devices_per_node
        self.mbs = micro_batch_sizes or [cfg.train.micro_batch_size]
        # the communication settings: the primary first (legality and fit are decided with it)
        names = list(dict.fromkeys(dispatchers or [cfg.dispatcher.name]))
        overlaps = list(dict.fromkeys(ep_overlap if ep_overlap is not None
                                      else [cfg.overlap.overlap_moe_expert_parallel_comm]))
        self.dispatcher_nodes = {n: cfg.dispatcher if n == cfg.dispatcher.name
                                 else overrides.preset("dispatcher", n, cfg.dispatcher) for n in names}
        self.comms = [Comm(n, o, self.dispatcher_nodes[n].moe_token_dispatcher_type == "flex")
                      for n in names for o in overlaps]
        primary = self.comms[0]
        # the base every candidate's config starts from: the batch fixed (the contract), the primary setting
        gbs = cfg.train.global_batch_size or math.lcm(*self.mbs) * world
        self.cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, global_batch_size=gbs),
            dispatcher=self.dispatcher_nodes[primary.dispatcher],
            overlap=dataclasses.replace(cfg.overlap, overlap_moe_expert_parallel_comm=primary.ep_overlap))
        self.base = resolve(self.cfg)
        self.arch, self.impl, self.world = self.base.arch, self.base.impl, world
        # The least recompute that fits, from the configured level up the workflow's ladder; a custom
        # recompute setting is kept as it is.
        self.model = StepModel(self.base)
        name = cfg.recompute.name
        if name in RECOMPUTE_LEVELS:
            nodes = {level: cfg.recompute if level == name
                     else overrides.apply(self.cfg, level_overrides(self.arch, level)).recompute
                     for level in recompute_levels(self.arch)}
            ladder = recompute_ladder(nodes, self.model)
            self.recompute = {level: nodes[level] for level in ladder[ladder.index(name):]}
        else:
            self.recompute = {name: cfg.recompute}
        self.base_name = name
        # the ladder from each level up: where another communication setting may need more recompute
        self.levels_from = {lvl: list(self.recompute)[i:] for i, lvl in enumerate(self.recompute)}
        # the nodes a candidate's config is built from (dataclass __init__: a fast replace)
        self._config_kw = {f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(self.cfg)}
        self._parallel_kw = {f.name: getattr(self.cfg.parallel, f.name) for f in dataclasses.fields(self.cfg.parallel)}
        self._train_kw = {f.name: getattr(self.cfg.train, f.name) for f in dataclasses.fields(self.cfg.train)}
        self.overlap_nodes = {o: dataclasses.replace(self.cfg.overlap, overlap_moe_expert_parallel_comm=o)
                              for o in (False, True)}
        # each kind of rule keyed by what it reads, with the communication setting where a rule of it reads that
        self.comm_kinds = [kind for kind in ("mesh", "pipeline", "recompute") if any(x.comm for x in rules.RULES
                                                                                    if x.reads == kind)]
        self.keys = {kind: cache_key(kind, settings=("recompute", "dispatcher", "overlap")) for kind in READS}
        # (kind, level, comm): the values at the paths of a recompute level and communication setting, the same
        # for every candidate (None: the base's)
        self.settings_parts = {
            (kind, level, comm): self.keys[kind][1](self.base.with_settings(**self._settings(level, comm)))
            for kind in READS for level in (None, *self.recompute) for comm in (None, *self.comms)}
        self.fixed_violations = rules.check(self.base, self.mcore, reads=("fixed",))
        self.rule_cache: dict[tuple, list] = {}
        self.messages: dict[tuple, list[str]] = {}
        self.rank_params: dict[tuple, list] = {}
        self.layer_terms: dict[tuple, tuple] = {}
        self.estimators: dict[tuple, memory.Estimator] = {}
        self.static: dict[tuple, list] = {}
        self._peak_cache: tuple = (None, None)  # the last (candidate, level) and its peaks
        self._memo: tuple = (None, {})  # the candidate being evaluated and its resolved plans
        self.flex_gib = self.cfg.memory.flex_dispatcher_gib
        self.cap = cfg.hardware.memory_gib
        self.cap_bytes = None if self.cap is None else self.cap * memory.GIB
        total = params.total_params(self.arch)
        self.expert_total = params.routed_expert_params(self.arch)
        self.dense_total = total - self.expert_total
        # weights + gradients per parameter
        self.state_bytes = memory.weight_bytes(cfg.precision) + memory.grad_bytes(cfg)
        self.domain = cfg.hardware.nvlink_domain_size
        # the user's settings, which a row's overrides change when its setting differs
        self.base_dispatcher, self.base_overlap = cfg.dispatcher.name, cfg.overlap.overlap_moe_expert_parallel_comm
        # hardware.calibration: the layouts it holds for are ranked by what it measured, their ties by its held-out
        # error (the rules refused a file that is none, or of another device kind or implementation: K01)
        self.calibration = calibrated_step.load(cfg.hardware.calibration)[0] if calibrated_step.named(cfg) else None
        self.tie_width = (math.exp(self.calibration["step"]["held_out"]["p90"]) if self.calibration
                          else step_model.tie_width())

    # ------------------------------------------------------------------ a candidate as a resolved plan

    def config(self, c: Candidate, level: str | None = None, comm: Comm | None = None) -> Any:
        """The config of a candidate (at a recompute level, with a communication setting): the base config with
        the candidate's fields, as the overrides of its layouts.json row would set them."""
        kw = {**self._config_kw, "parallel": type(self.cfg.parallel)(**{**self._parallel_kw, **c.fields()}),
              "train": type(self.cfg.train)(**{**self._train_kw, "micro_batch_size": c.mbs})}
        if level is not None or comm is not None:
            kw.update(self._settings(level, comm))
        return type(self.cfg)(**kw)

    def resolved(self, c: Candidate, level: str | None = None, comm: Comm | None = None) -> Resolved:
        """The candidate's resolved plan: the same constructor as stage=plan's, with this search's model facts
        and implementation (kept for the candidate being evaluated, by level and setting)."""
        level, comm = self._varied(level, comm)
        if self._memo[0] is not c:
            self._memo = (c, {})
        r = self._memo[1].get((level, comm))
        if r is None:
            if level is None and comm is None:
                r = resolve(self.config(c), self.impl, self.arch, varied=("parallel", "train"))
            else:  # the candidate's plan with another recompute or communication setting, which no fact reads
                r = self.resolved(c).with_settings(**self._settings(level, comm))
            self._memo[1][level, comm] = r
        return r

    def _varied(self, level: str | None, comm: Comm | None) -> tuple[str | None, Comm | None]:
        """(level, setting) with the base's written as None: the keys of the memo and of the settings' values."""
        return (None if level == self.base_name else level,
                None if comm is None or comm == self.comms[0] else comm)

    def _settings(self, level: str | None, comm: Comm | None) -> dict[str, Any]:
        """The config nodes of a recompute level and a communication setting (None: the base's)."""
        out = {}
        if level is not None:
            out["recompute"] = self.recompute[level]
        if comm is not None:
            out.update(dispatcher=self.dispatcher_nodes[comm.dispatcher], overlap=self.overlap_nodes[comm.ep_overlap])
        return out

    def _check(self, c: Candidate, kind: str, level: str | None = None, comm: Comm | None = None,
               comm_only: bool = False) -> list:
        """The violations of one kind of rule for a candidate at a recompute level and communication setting,
        cached by the values those rules read (:func:`cache_key`): the candidate's plan's values outside the
        settings (once per candidate) and the setting's own (once per search); the plan at that setting is
        resolved only when the rules must run."""
        level, comm = self._varied(level, comm)
        if self._memo[0] is not c:
            self.resolved(c)
        memo = self._memo[1]  # the candidate's plan and the values it was keyed by
        plan_part = memo.get(kind)
        if plan_part is None:
            plan_part = memo[kind] = self.keys[kind][0](memo[None, None])
        key = (kind, comm_only, plan_part, self.settings_parts[kind, level, comm])
        found = self.rule_cache.get(key)
        if found is None:
            found = self.rule_cache[key] = rules.check(self.resolved(c, level, comm), self.mcore, reads=(kind,),
                                                       comm_only=comm_only)
        return found

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, c: Candidate) -> Result:
        """Rules, counts, the least recompute that fits, and the step-time terms of one candidate (with the
        fastest communication setting that is legal and fits)."""
        if self.cap is not None:  # weights + gradients of an average rank: a lower bound on the most loaded one
            floor = self.state_bytes * (self.dense_total / (c.tp * c.pp) + self.expert_total / (c.ep * c.etp * c.pp))
            if floor > self.cap_bytes:  # not resolved: its layout is what the candidate sets
                return Result(c, c.layout(self.world), [], None, floor / memory.GIB, False, pruned=True)
        r = self.resolved(c)
        lo = r.layout
        found = [self._check(c, kind) for kind in ("mesh", "pipeline", "recompute")]
        if self.fixed_violations or any(found):
            key = tuple(map(id, found))  # the cached lists: one message list per combination
            messages = self.messages.get(key)
            if messages is None:
                messages = self.messages[key] = [f"[{v.rule}] {v.message}"
                                                  for v in (*self.fixed_violations, *(v for f in found for v in f))]
            return Result(c, lo, messages)
        ranks_key = _RANKS(r)
        ranks, stages, worst = self._rank_params(r)
        static_key = (ranks_key, _SHARDS(r))
        static = self.static.get(static_key)
        if static is None:  # the states depend on the parameters and their sharding only
            static = self.static[static_key] = self._estimator(c, r, self.base_name).static(ranks)
        level, peak, fits = self._least_recompute(c, r, static, stages)
        comm = self.comms[0]
        if fits is not False and len(self.comms) > 1:
            comm, level, peak = self._fastest_comm(c, r, level, peak, worst, static, stages)
        terms = self.model.terms(r, worst.dense, worst.expert, self.recompute[level], comm.flex, comm.ep_overlap)
        return Result(c, lo, [], level, peak, fits, terms, comm=comm)

    def _rank_params(self, r: Resolved) -> tuple:
        """(each rank's parameters, the memory's peak candidates, the most loaded rank) of ``r``'s layout and
        split, counted once per layout (``rank_params``)."""
        key = _RANKS(r)
        cached = self.rank_params.get(key)
        if cached is None:
            ranks = params.params_per_rank(self.arch, r.layout, r.split, te_spec=self.impl.te)
            cached = self.rank_params[key] = (ranks, memory.peak_candidates(self.arch, r.split, ranks),
                                              max(ranks, key=lambda x: x.total))
        return cached

    def _fastest_comm(self, c: Candidate, r: Resolved, level: str, peak: float, worst, static,
                      stages) -> tuple[Comm, str, float]:
        """(setting, recompute, peak GiB): the fastest communication setting that the rules accept and that
        fits, at the primary's least recompute or above."""
        model, primary = self.model, self.comms[0]
        best = (primary, level, peak)
        best_step = model.step(r, worst.dense, worst.expert, self.recompute[level], primary.flex, primary.ep_overlap)
        for comm in self.comms[1:]:
            if r.layout.ep == 1 and (comm.flex or comm.ep_overlap):
                continue  # no all-to-all: the model gives a flex dispatcher the same time, a rule refuses overlap (L65)
            for lvl in self.levels_from[level]:
                step = model.step(r, worst.dense, worst.expert, self.recompute[lvl], comm.flex, comm.ep_overlap)
                if step >= best_step:
                    break  # more recompute only adds time
                if self._level_refused(c, lvl) or not self._comm_legal(c, lvl, comm):
                    continue
                peak_c = self._peak_with(c, r, lvl, comm, static, stages)
                if self.cap is None or peak_c <= self.cap:
                    best, best_step = (comm, lvl, peak_c), step
                    break
        return best

    def _least_recompute(self, c: Candidate, r: Resolved, static, stages) -> tuple:
        """(level, peak GiB, fits) with the primary communication setting: the least recompute that fits."""
        cap, overlap = self.cap, self.comms[0].ep_overlap
        found = None  # the last level tried: a refused rung (e.g. full recompute with EP overlap, L68) is skipped
        for name in self.recompute:
            if self._level_refused(c, name):
                continue
            peak = self._peaks(c, r, name, static, stages)[overlap]
            found = (name, peak, None if cap is None else peak <= cap)
            if found[2] is not False:
                break
            if max(w + g + o + ws for w, g, o, _, ws in static) / memory.GIB > cap:  # the states alone: no recompute helps
                break
        return found

    def _peaks(self, c: Candidate, r: Resolved, level: str, static, stages) -> tuple[float, float]:
        """The peak (GiB) at a recompute level, without and with EP overlap (the primary dispatcher's
        buffers; :meth:`_peak_with` adds another's)."""
        key = (c, level)
        if self._peak_cache[0] != key:
            est = self._estimator(c, r, level)
            self._peak_cache = (key, tuple(p / memory.GIB for p in est.peaks(r.split, static, stages)))
        return self._peak_cache[1]

    def _estimator(self, c: Candidate, r: Resolved, level: str) -> memory.Estimator:
        """The estimator of a candidate at a recompute level. The layer terms are cached by what they read of
        the layout (:data:`_TERMS`); an estimator by those, the micro-batches per step and the level, then set
        to this candidate's layout (its PP and VPP: the micro-batches in flight)."""
        terms_key = _TERMS(r)
        est_key = (terms_key, r.batch.micro_batches_per_step, level)
        est = self.estimators.get(est_key)
        if est is None:
            terms = self.layer_terms.get(terms_key)
            if terms is None:  # the activation terms do not depend on VPP, the split or recompute
                terms = self.layer_terms[terms_key] = (memory.layer_terms(r, False),
                                                       memory.layer_terms(r, True) if self.arch.experts else {})
            at_level = r if level == self.base_name else self.resolved(c, level)
            est = self.estimators[est_key] = memory.Estimator(at_level, terms=terms)
        est.lo = r.layout
        return est

    def _peak_with(self, c: Candidate, r: Resolved, level: str, comm: Comm, static, stages) -> float:
        """The peak (GiB) with another communication setting: EP overlap holds one more layer of a micro-batch,
        a flex dispatcher adds its buffers."""
        peak = self._peaks(c, r, level, static, stages)[comm.ep_overlap]
        return peak + self.flex_gib * (comm.flex - self.comms[0].flex)

    def _level_refused(self, c: Candidate, level: str) -> bool:
        """Whether the rules refuse a rung of the recompute ladder above the configured one."""
        if level == self.base_name:
            return False
        return bool(self._check(c, "recompute", level))

    def _comm_legal(self, c: Candidate, level: str, comm: Comm) -> bool:
        """Whether the rules that read the dispatcher or EP overlap accept ``comm`` with this candidate."""
        return not any(self._check(c, kind, level, comm, comm_only=True) for kind in self.comm_kinds)

    # ------------------------------------------------------------------ the whole search

    def run(self, workers: int | None = None) -> list[Result]:
        """Every candidate, evaluated; the legal ones that fit ranked 1..n. ``workers``: processes to
        evaluate in (None: one per CPU this process may use, for large searches, on Linux)."""
        candidates = list(enumerate_layouts(self.base, self.mbs))
        if workers is None:
            workers = search_workers(len(candidates))
        if workers > 1:
            results = self._run_forked(candidates, workers)
        else:
            results = [self.evaluate(c) for c in candidates]
        if self.calibration is not None:
            self._calibrated(results)
        rank(results, self.domain, self.cfg.train.seq_length)
        return results

    def _calibrated(self, results: list[Result]) -> None:
        """``hardware.calibration``: each legal candidate that fits, at its recompute level and communication
        setting, predicted from the calibration where it holds for it (:func:`moe_hydra.core.calibrated_step.estimate`:
        its layout measured, its settings measured or its own); the others keep the priors' terms, marked, and rank
        after them (:func:`rank`)."""
        for res in results:
            if res.terms is None:
                continue
            r = self.resolved(res.candidate, res.recompute, res.comm)
            worst = self._rank_params(r)[2]
            estimate = step_time.estimate(self.calibration, r, worst.dense, worst.expert)
            res.calibrated = not isinstance(estimate, list)
            if res.calibrated:
                res.terms = {**estimate[1], "step": estimate[0]}

    def _run_forked(self, candidates: list[Candidate], workers: int) -> list[Result]:
        """Evaluate in forked processes. The work is cut into tasks of whole (PP, TP, CP) groups (so a
        process's caches stay warm), largest first, handed out as processes free up; the results come
        back as plain tuples. A pool whose workers stop returning results (one killed, say, which a
        ``multiprocessing.Pool`` would wait for forever) is given up after :data:`STALL_S` without a result, and
        the search runs in this process instead."""
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
        gc.freeze()  # a fork never collects what it inherits: a finalizer of the parent's run in a worker can hang it
        try:
            # leaving the pool terminates the workers
            with multiprocessing.get_context("fork").Pool(workers, initializer=_die_on_sigterm) as pool:
                shares = pool.imap_unordered(_evaluate_share, range(len(tasks)))
                packed = [shares.next(timeout=STALL_S) for _ in tasks]
        except multiprocessing.TimeoutError:
            warnings.warn(f"the forked layout search made no progress for {STALL_S} s (a worker died or hung): "
                          "evaluating in this process instead", RuntimeWarning, stacklevel=2)
            return [self.evaluate(c) for c in candidates]
        finally:
            _FORKED = None
            gc.unfreeze()
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
            out += level_overrides(self.arch, r.recompute)
        if r.comm and r.comm.dispatcher != self.base_dispatcher:
            out.append(f"dispatcher={r.comm.dispatcher}")
        if r.comm and r.comm.ep_overlap != self.base_overlap:
            out.append(overrides.override("overlap.overlap_moe_expert_parallel_comm", r.comm.ep_overlap))
        return out

    def report(self, results: list[Result], seconds: float) -> dict[str, Any]:
        """``layouts.json``: every candidate (rank, legality, memory, terms, overrides), best first; ``tied``
        marks the ranked layouts the step model cannot tell from the best (:func:`tied_set`)."""
        ranked = sorted((r for r in results if r.rank), key=lambda r: r.rank)
        rest = [r for r in results if not r.rank]
        tied = tied_set(ranked, self.tie_width)
        cfg = self.cfg
        return {
            "model": cfg.model.name, "hardware": cfg.hardware.name, "world_size": self.world,
            "global_batch_size": cfg.train.global_batch_size, "seq_length": cfg.train.seq_length,
            "memory_gib": cfg.hardware.memory_gib, "recompute_levels": list(self.recompute),
            "implementation": self.base.as_dict()["implementation"],
            "counts": {"candidates": len(results), "legal": sum(r.legal and not r.pruned for r in results),
                       "pruned_by_memory": sum(r.pruned for r in results),
                       "fit": sum(r.legal and r.fits is not False for r in results), "ranked": len(ranked)},
            "search_seconds": round(seconds, 3),
            "step_time_model": {"model": "moe_hydra.planning.step_model (analytic; see its documentation)",
                                "calibration": step_model.CALIBRATION, "held_out": step_model.HELD_OUT,
                                **dataclasses.asdict(cfg.step_model)},
            # layouts whose predicted step is within this ratio of the best are ties (the held-out ranking error)
            **({"calibration": {"file": str(calibrated_step.resolve_path(cfg.hardware.calibration)),
                                "held_out": self.calibration["step"]["held_out"],
                                "calibrated": sum(bool(r.calibrated) for r in ranked)}} if self.calibration else {}),
            "tie_width": self.tie_width, "tied": len(tied),
            "communication_settings": [c.describe() for c in self.comms],
            # overrides for the best: the rest follow from parallel, micro_batch_size and recompute
            "candidates": [{**r.as_dict(), **({"tied": i < len(tied)} if r.rank else {}),
                            **({"overrides": self.overrides(r)} if i < max(OVERRIDES_FOR, len(tied)) else {})}
                           for i, r in enumerate(ranked + rest)],
        }


PARALLEL_FROM = 4000  # candidates from which a search forks (below, starting processes costs more than it saves)
STALL_S = 120  # seconds without a finished task before a forked search is given up (a task: ~1/16 of a worker's share)
_FORKED: tuple | None = None  # (search, candidates, tasks) for the forked workers


def search_workers(candidates: int) -> int:
    """Processes for a search of this many candidates: the CPUs this process may use (its affinity, as
    Slurm and cgroups set it), up to 8, on Linux (fork) and for large searches only; else 1. Never from a process
    that runs other threads (a torch or launcher thread holding a lock at the fork deadlocks the worker): 1 then.
    ``MOE_HYDRA_SEARCH_WORKERS`` overrides it."""
    if os.environ.get("MOE_HYDRA_SEARCH_WORKERS"):
        return max(1, int(os.environ["MOE_HYDRA_SEARCH_WORKERS"]))
    if candidates < PARALLEL_FROM or not sys.platform.startswith("linux") or threading.active_count() > 1:
        return 1
    return max(1, min(8, len(os.sched_getaffinity(0))))


def _die_on_sigterm() -> None:
    """A forked worker dies on the SIGTERM that ``Pool.terminate`` sends. Terminate takes the task queue's lock and
    relies on the signal to end workers blocked on it; a Python handler inherited from the parent (one a test or a
    library installed) would run and return, leaving the worker blocked and the pool's join waiting forever."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
        lo = r.layout
        rows.append((v, (lo.world_size, lo.tp, lo.cp, lo.pp, lo.vpp, lo.ep, lo.etp, lo.sp), r.recompute, r.memory_gib,
                     r.fits, r.pruned,
                     None if r.comm is None else s.comms.index(r.comm), terms))
    return k, rows, violations


def _unpack(c: Candidate, row: tuple, violations: list[list[str]], comms: list[Comm]) -> Result:
    v, layout, recompute, memory_gib, fits, pruned, comm, terms = row
    return Result(c, Layout(*layout), [] if v is None else violations[v], recompute, memory_gib, fits,
                  None if terms is None else dict(zip((*TERMS, "step"), terms)), pruned=pruned,
                  comm=None if comm is None else comms[comm])


def tied_set(ranked: list[Result], width: float | None = None) -> list[Result]:
    """The leading ranked layouts the step model cannot tell from the best: predicted within ``width`` of its step
    time (:func:`moe_hydra.planning.step_model.tie_width`, the held-out error of the ratio of two predictions, by
    default; a calibration's held-out error with one), from the same source as the best's. What screening
    measures, rather than a fixed top-K."""
    if not ranked:
        return []
    bound = ranked[0].terms["step"] * (width or step_model.tie_width())
    return list(itertools.takewhile(lambda r: r.terms["step"] <= bound and r.calibrated == ranked[0].calibrated,
                                    ranked))


def _priority(r: Result, domain: int, seq: int) -> tuple:
    c = r.candidate
    return (r.calibrated is False, c.cp > 1 and seq < CP_FROM_SEQ, c.etp > 1, round(r.terms["step"], 6),
            c.tp * c.cp * c.pp, c.ep * c.etp > domain, c.vpp or 1, -c.mbs)


def rank(results: list[Result], domain: int, seq: int) -> None:
    """Rank the legal candidates that fit (or whose fit is unknown): with a calibration, those it predicts first
    (two sources' step times do not compare); CP only for long sequences and ETP 1 first (docs/workflow.md), then by
    step time, then the other priorities."""
    ok = [r for r in results if r.legal and r.fits is not False]
    for i, r in enumerate(sorted(ok, key=lambda r: _priority(r, domain, seq)), 1):
        r.rank = i
