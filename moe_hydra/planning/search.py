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
(:func:`moe_hydra.core.resolved.resolve`) and checked by the same rules and estimates as
:func:`moe_hydra.planning.plan.assess`, evaluated as columns (:meth:`Search.evaluate_all`, one row a candidate):
each rule runs on a candidate's resolved plan and its answer holds for every candidate with the same values where
it read; the pipeline split is derived once per (PP, VPP, split); parameters, memory and step time are
:mod:`~moe_hydra.core.params`', :mod:`~moe_hydra.planning.memory`'s and :mod:`~moe_hydra.planning.step_model`'s own
formulas on the columns (:mod:`moe_hydra.core.columns`), every recompute rung and communication setting at once.
The global batch stays fixed across candidates (the contract).

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

Pure: standard library, and numpy for the columns (imported when a search runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Iterator, NamedTuple

from moe_hydra.core import calibrated_step, overrides, params
from moe_hydra.core.arch import Arch
from moe_hydra.core.columns import Mesh
from moe_hydra.core.layout import Layout
from moe_hydra.core.resolved import Resolved, rank_layers, resolve
from moe_hydra.core.versions import McoreFacts, mcore_facts
from moe_hydra.planning import memory, plan, rules, step_model, step_time
from moe_hydra.planning.rules.base import VARIED, Ctx, _divisors, check_reading, tp_choices_at
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


class Candidate(NamedTuple):
    """One layout the search evaluates (a named tuple: a search makes a few hundred thousand)."""

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


class Terms(Mapping):
    """A search row's step-time terms by name (:data:`~moe_hydra.planning.step_model.TERMS`, then ``step``): its
    row of the term columns, read as a dict (built for a hundred thousand rows, read for few)."""

    __slots__ = ("_values",)
    _index = {name: i for i, name in enumerate((*TERMS, "step"))}

    def __init__(self, values: list[float]):
        self._values = values

    def __getitem__(self, name: str) -> float:
        return self._values[self._index[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return repr(dict(self))


@dataclass(slots=True)
class Result:
    candidate: Candidate
    world: int
    violations: list[str]
    recompute: str | None = None  # the least recompute that fits
    memory_gib: float | None = None
    fits: bool | None = None
    terms: Mapping[str, float] | None = None  # Terms, or a calibration's dict
    rank: int | None = None
    pruned: bool = False  # weights + gradients alone exceed the memory: the rules were not run
    comm: Comm | None = None  # the communication settings the terms are for
    # with hardware.calibration: whether the terms are the calibration's (True) or the priors' (False: it does not
    # hold for this layout); None without one
    calibrated: bool | None = None
    prior_step: float | None = None  # with a calibration that holds for it: the step model's own step time

    @property
    def layout(self) -> Layout:
        """The layout the candidate's config resolves to (built when asked: a search has a few hundred thousand)."""
        return self.candidate.layout(self.world)

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
        # the nodes a candidate's config is built from (dataclass __init__: a fast replace)
        self._config_kw = {f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(self.cfg)}
        self._parallel_kw = {f.name: getattr(self.cfg.parallel, f.name) for f in dataclasses.fields(self.cfg.parallel)}
        self._train_kw = {f.name: getattr(self.cfg.train, f.name) for f in dataclasses.fields(self.cfg.train)}
        self.overlap_nodes = {o: dataclasses.replace(self.cfg.overlap, overlap_moe_expert_parallel_comm=o)
                              for o in (False, True)}
        # the rules a candidate is checked by (the fixed ones once, below), in their order, and those of them that
        # read the dispatcher or EP overlap (checked again with each other communication setting)
        self.candidate_rules = [x for x in rules.RULES if x.reads in ("mesh", "pipeline", "recompute")]
        self.comm_rules = [x for x in self.candidate_rules if x.comm]
        self.recompute_rules = [x for x in self.candidate_rules if x.reads == "recompute"]
        self.fixed_violations = rules.check(self.base, self.mcore, reads=("fixed",))
        self.most_loaded: dict[tuple, params.RankParams] = {}
        self._plans: dict[Candidate, dict] = {}  # the candidates' resolved plans (by level and setting) the rules read
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
        self.model_tie_width = step_model.tie_width("moe" if self.arch.experts else "dense")
        self.tie_width = (math.exp(self.calibration["step"]["held_out"]["p90"]) if self.calibration
                          else self.model_tie_width)

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
        memo = self._plans.get(c)
        if memo is None:
            memo = self._plans[c] = {}
        r = memo.get((level, comm))
        if r is None:
            if level is None and comm is None:
                r = resolve(self.config(c), self.impl, self.arch, varied=("parallel", "train"))
            else:  # the candidate's plan with another recompute or communication setting, which no fact reads
                r = self.resolved(c).with_settings(**self._settings(level, comm))
            memo[level, comm] = r
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

    # ------------------------------------------------------------------ evaluation, as columns

    def evaluate(self, c: Candidate) -> Result:
        """One candidate, as :meth:`evaluate_all` evaluates it among many."""
        return self.evaluate_all([c])[0]

    def evaluate_all(self, candidates: list[Candidate]) -> list[Result]:
        """Rules, counts, the least recompute that fits, and the step-time terms (with the fastest communication
        setting that is legal and fits) of each candidate, as numpy columns, one row per candidate
        (:class:`_Columns`): a rule runs once per distinct value of what it read (the rows alike there share its
        answer); parameters, memory and step time are the single-plan formulas evaluated on the columns
        (:mod:`moe_hydra.core.columns`), so a row equals what ``plan.assess`` gives its candidate, bit for bit."""
        with _collector_paused():
            return self._evaluate_all(candidates)

    def _evaluate_all(self, candidates: list[Candidate]) -> list[Result]:
        import numpy as np

        t = _Columns(self, candidates)
        results: list[Result | None] = [None] * len(candidates)
        alive = np.arange(len(candidates))
        if self.cap is not None:  # weights + gradients of an average rank: a lower bound on the most loaded one
            floor = self.state_bytes * (self.dense_total / (t.tp * t.pp) + self.expert_total / (t.ep * t.etp * t.pp))
            pruned = np.flatnonzero(floor > self.cap_bytes)
            for i, gib in zip(pruned.tolist(), (floor[pruned] / memory.GIB).tolist()):  # not resolved
                results[i] = Result(candidates[i], self.world, [], None, gib, False, pruned=True)
            alive = np.flatnonzero(floor <= self.cap_bytes)
        combo, combos = t.violations(alive, self.candidate_rules)
        messages = [[f"[{v.rule}] {v.message}" for v in (*self.fixed_violations, *found)] for found in combos]
        illegal = np.array([bool(m) for m in messages], dtype=bool)[combo] if len(alive) else np.zeros(0, dtype=bool)
        for i, k in zip(alive[illegal].tolist(), combo[illegal].tolist()):
            results[i] = Result(candidates[i], self.world, messages[k])
        legal = alive[~illegal].tolist()
        if legal:
            for i, res in zip(legal, t.assess(np.array(legal))):
                results[i] = res
        return results

    def _most_loaded(self, r: Resolved) -> params.RankParams:
        """The rank of ``r``'s layout and split with the most parameters, counted once per layout (``most_loaded``)."""
        key = _RANKS(r)
        found = self.most_loaded.get(key)
        if found is None:
            ranks = params.params_per_rank(self.arch, r.layout, r.split, te_spec=self.impl.te)
            found = self.most_loaded[key] = max(ranks, key=lambda x: x.total)
        return found

    def _split(self, c: Candidate) -> tuple:
        """What each pipeline rank of a candidate's plan holds (:func:`~moe_hydra.core.resolved.rank_layers`, as
        :func:`resolve` derives it; the rules have passed it)."""
        return rank_layers(self.arch, c.layout(self.world),
                           type(self.cfg.parallel)(**{**self._parallel_kw, **c.fields()}))

    # ------------------------------------------------------------------ the whole search

    def run(self) -> list[Result]:
        """Every candidate, evaluated as columns (:meth:`evaluate_all`); the legal ones that fit ranked 1..n."""
        with _collector_paused():
            results = self.evaluate_all(list(enumerate_layouts(self.base, self.mbs)))
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
            worst = self._most_loaded(r)
            estimate = step_time.estimate(self.calibration, r, worst.dense, worst.expert)
            res.calibrated = not isinstance(estimate, list)
            if res.calibrated:
                res.prior_step = res.terms["step"]
                res.terms = {**estimate[1], "step": estimate[0]}

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
            # layouts whose predicted step is within this ratio of the best are ties (the model cannot order them)
            **({"calibration": {"file": str(calibrated_step.resolve_path(cfg.hardware.calibration)),
                                "held_out": self.calibration["step"]["held_out"],
                                "calibrated": sum(bool(r.calibrated) for r in ranked)}} if self.calibration else {}),
            "tie_width": self.tie_width, "tied": len(tied),
            # the tie set the step model alone gives, and what the calibration made of it
            **({"tie_width_uncalibrated": self.model_tie_width,
                "tied_uncalibrated": uncalibrated_ties(ranked, self.model_tie_width)} if self.calibration else {}),
            "communication_settings": [c.describe() for c in self.comms],
            # overrides for the best: the rest follow from parallel, micro_batch_size and recompute
            "candidates": [{**r.as_dict(), **({"tied": i < len(tied)} if r.rank else {}),
                            **({"overrides": self.overrides(r)} if i < max(OVERRIDES_FOR, len(tied)) else {})}
                           for i, r in enumerate(ranked + rest)],
        }


class _Columns:
    """A search's candidates as numpy columns (one row each) and what :meth:`Search.evaluate_all` derives from them."""

    # Each path into a candidate's plan that a rule may read and the search varies, as the columns that decide its
    # value (a rule's answer is cached by the values it read: rules.base.check_reading); CONSTANT: the varied paths
    # every candidate of a search shares; the settings' paths (a recompute rung's, a communication setting's) are
    # keyed by their values.
    PATH_COLUMNS = {
        "layout.tp": ("tp",), "layout.cp": ("cp",), "layout.pp": ("pp",), "layout.ep": ("ep",), "layout.etp": ("etp",),
        "layout.sp": ("sp",), "layout.dp": ("dp",), "layout.edp": ("edp",), "layout.vpp": ("vpp",),
        "layout.virtual_stages": ("virtual_stages",), "layout.expert_parallel": ("expert_parallel",),
        "layout.attention_model_size": ("attention",), "layout.expert_model_size": ("expert",),
        "cfg.parallel.tensor_model_parallel_size": ("tp",), "cfg.parallel.context_parallel_size": ("cp",),
        "cfg.parallel.pipeline_model_parallel_size": ("pp",), "cfg.parallel.expert_model_parallel_size": ("ep",),
        "cfg.parallel.expert_tensor_parallel_size": ("etp",), "cfg.parallel.sequence_parallel": ("sp",),
        "cfg.parallel.virtual_pipeline_model_parallel_size": ("vpp",),
        "cfg.parallel.pipeline_model_parallel_layout": ("split",),
        "cfg.parallel.account_for_embedding_in_pipeline_split": ("split",),
        "cfg.parallel.account_for_loss_in_pipeline_split": ("split",),
        "split": ("pp", "vpp", "split"),
        "batch.micro_batch_size": ("mbs",), "cfg.train.micro_batch_size": ("mbs",),
        "batch.micro_batches_per_step": ("m",),
        "derived.tp_choices": ("tp_choices",),
    }
    CONSTANT = ("layout.world_size", "batch.global_batch_size", "batch.seq_length", "batch.tokens_per_step",
                "cfg.train.global_batch_size", "cfg.parallel.cp_comm_type",
                "cfg.parallel.hierarchical_context_parallel_sizes", "cfg.parallel.use_tp_pp_dp_mapping",
                "cfg.parallel.num_layers_in_first_pipeline_stage", "cfg.parallel.num_layers_in_last_pipeline_stage")
    SETTINGS = ("cfg.recompute.", "cfg.dispatcher.", "cfg.overlap.")

    def __init__(self, s: Search, candidates: list[Candidate]):
        import numpy as np

        from moe_hydra.core.columns import numpy_ops

        self.s, self.candidates, self.np, self.np_ops = s, candidates, np, numpy_ops()
        n = len(candidates)
        tp, cp, pp, vpp, ep, etp, mbs, split = zip(*candidates) if n else ((),) * len(Candidate._fields)
        self.tp, self.cp, self.pp, self.ep, self.etp, self.mbs = (np.array(x, dtype=np.int64).reshape(-1) for x in (
            tp, cp, pp, ep, etp, mbs))
        self.vpp = np.array([v or 1 for v in vpp], dtype=np.int64).reshape(-1)
        splits: dict[str, int] = {}
        self.split = np.array([splits.setdefault(x, len(splits)) for x in split], dtype=np.int64).reshape(-1)
        self.sp = (self.tp > 1).astype(np.int64)  # sequence parallelism whenever TP > 1
        self.virtual_stages, self.expert_parallel = (self.vpp > 1).astype(np.int64), (self.ep > 1).astype(np.int64)
        self.attention, self.expert = self.tp * self.cp * self.pp, self.ep * self.etp * self.pp  # model-parallel sizes
        self.dp, self.edp = s.world // self.attention, s.world // self.expert
        self.m = s.cfg.train.global_batch_size // (self.mbs * self.dp)
        self._traces: dict[Any, dict[frozenset, dict]] = {}  # rule -> paths it read -> their columns' values -> found
        self._found: list[list] = []  # the distinct answers of the rules (violation lists)
        self._found_index: dict[tuple, int] = {}
        self._parts: dict[tuple, tuple] = {}
        self._coded: dict[str, Any] = {}
        self._resolved = np.zeros(n, dtype=bool)  # the candidates whose plans the rules have read

    @functools.cached_property
    def tp_choices(self) -> Any:
        """Each row's TP sizes every TP rule takes (rules.base.tp_choices_at), numbered (``derived.tp_choices``)."""
        np, base = self.np, Ctx(self.s.base, self.s.mcore)
        lists: dict[tuple[int, ...], int] = {}

        def number(cp: int, pp: int, ep: int, etp: int, sp: int) -> int:
            return lists.setdefault(tp_choices_at(base, cp, pp, ep, etp, bool(sp)), len(lists))

        return self.np_ops.each(number, self.cp, self.pp, self.ep, self.etp, self.sp).astype(np.int64)

    def groups(self, names: tuple[str, ...], rows: Any) -> tuple[Any, Any]:
        """(the first of ``rows`` with each distinct value of the columns ``names``, each row's group)."""
        if not names:
            return rows[:1], self.np.zeros(len(rows), dtype=self.np.int64)
        first, inverse = self.np_ops.groups(*(self._codes(n)[rows] for n in names))
        return rows[first], inverse

    def _codes(self, name: str) -> Any:
        """Each row's value of a column as its index among the column's values (numbered once: small keys)."""
        if name not in self._coded:
            self._coded[name] = self.np.unique(getattr(self, name), return_inverse=True)[1].reshape(-1)
        return self._coded[name]

    def mesh(self, rows: Any) -> Mesh:
        """The layout and batch columns of ``rows`` (what the memory estimate and the step model read)."""
        return Mesh(*(getattr(self, f)[rows] for f in ("tp", "cp", "pp", "vpp", "ep", "etp", "sp", "mbs", "m")))

    def violations(self, rows: Any, which: list, level: str | None = None,
                   comm: Comm | None = None) -> tuple[Any, list[list]]:
        """(each row's combination, the combinations: the violations of the rules ``which``, in their order) at a
        recompute level and communication setting."""
        np = self.np
        if not which or not len(rows):
            return np.zeros(len(rows), dtype=np.int64), [[]]
        memo: dict[tuple, tuple] = {}  # the rows' groups by each set of columns (rules that read alike share them)
        ids = [self.rule_found(rows, rule, level, comm, memo) for rule in which]
        first, combo = self.np_ops.groups(*ids)
        combos = [[v for k in range(len(which)) for v in self._found[ids[k][i]]] for i in first.tolist()]
        return combo, combos

    def refused(self, rows: Any, level: str) -> Any:
        """Whether the rules refuse a rung of the recompute ladder above the configured one, per row."""
        if level == self.s.base_name:
            return self.np.zeros(len(rows), dtype=bool)
        return self._any(*self.violations(rows, self.s.recompute_rules, level))

    def comm_legal(self, rows: Any, level: str, comm: Comm) -> Any:
        """Whether the rules that read the dispatcher or EP overlap accept ``comm`` at ``level``, per row."""
        return ~self._any(*self.violations(rows, self.s.comm_rules, level, comm))

    def _any(self, combo: Any, combos: list[list]) -> Any:
        return self.np.array([bool(c) for c in combos], dtype=bool)[combo]

    def rule_found(self, rows: Any, rule: Any, level: str | None, comm: Comm | None, memo: dict) -> Any:
        """Each row's answer of one rule at a recompute level and communication setting, as an index into the
        distinct answers. A rule runs on a candidate's plan, recording the paths it read
        (:func:`~moe_hydra.planning.rules.base.check_reading`); any other candidate with the same values there gets
        the same answer (the values compared as the columns that decide them, :data:`PATH_COLUMNS`); the rows no
        recorded read decides run the rule again. ``memo``: the groups of all ``rows`` by a set of columns."""
        np, s = self.np, self.s
        level, comm = s._varied(level, comm)
        traces = self._traces.setdefault(rule, {})
        out = np.full(len(rows), -1, dtype=np.int64)
        todo = np.arange(len(rows))
        while len(todo):
            for paths, table in traces.items():
                cols, const = self._key_parts(paths, level, comm)
                if len(todo) == len(rows):
                    if cols not in memo:
                        memo[cols] = self.groups(cols, rows)
                    first, group = memo[cols]
                else:
                    first, group = self.groups(cols, rows[todo])
                values = np.stack([getattr(self, n)[first] for n in cols], axis=1).tolist() if cols else [[]]
                hit = np.array([table.get((*const, *v), -1) for v in values], dtype=np.int64)[group]
                out[todo] = np.where(hit >= 0, hit, out[todo])
            todo = todo[out[todo] < 0]
            if not len(todo):
                break
            # one row of each value no trace decides, by every column a recorded read depends on (the rule reads
            # alike there, or a new set of paths the next round keys by), one whose plan is resolved already where
            # there is one
            known = tuple(dict.fromkeys(c for paths in traces for c in self._key_parts(paths, level, comm)[0]))
            cand = rows[todo]
            _, group = self.groups(known, cand)
            order = np.lexsort((~self._resolved[cand], group))
            for i in cand[order[np.r_[True, group[order][1:] != group[order][:-1]]]].tolist():
                self._trace(rule, i, level, comm)
        return out

    def _trace(self, rule: Any, i: int, level: str | None, comm: Comm | None) -> None:
        """Run ``rule`` on candidate ``i``'s plan; record what it found under the values it read."""
        s = self.s
        found, read = check_reading(rule, s.resolved(self.candidates[i], level, comm), s.mcore)
        self._resolved[i] = True
        paths = frozenset(read)
        cols, const = self._key_parts(paths, level, comm)
        key = (*const, *(int(getattr(self, n)[i]) for n in cols))
        index = self._found_index.setdefault(tuple((v.rule, v.message) for v in found), len(self._found))
        if index == len(self._found):
            self._found.append(found)
        self._traces[rule].setdefault(paths, {})[key] = index

    def _key_parts(self, paths: frozenset[str], level: str | None, comm: Comm | None) -> tuple[tuple, tuple]:
        """(the columns that decide the values at ``paths``, the values of the settings' paths among them)."""
        key = (paths, level, comm)
        if key not in self._parts:
            cols, const = [], []
            at = self.s.base.with_settings(**self.s._settings(level, comm))
            for p in sorted(paths):
                if p in self.PATH_COLUMNS:
                    cols += self.PATH_COLUMNS[p]
                elif p.startswith(self.SETTINGS):
                    value = attrgetter(p)(at)
                    const.append(tuple(value) if isinstance(value, list) else value)
                elif p not in self.CONSTANT and (not p or p.startswith(VARIED)
                                                 or any(v.startswith(f"{p}.") for v in VARIED)):  # or a node above
                    raise RuntimeError(f"a rule read {p}, which the layout search varies and cannot key its answers by: "
                                       "name the columns that decide it in search._Columns.PATH_COLUMNS")
            self._parts[key] = (tuple(dict.fromkeys(cols)), tuple(const))
        return self._parts[key]

    def assess(self, rows: Any) -> list[Result]:
        """The legal candidates ``rows``: parameters, memory at each rung of the recompute ladder (the least that
        fits), the fastest communication setting that fits, the step-time terms."""
        np, s, xp = self.np, self.s, self.np_ops
        n = len(rows)
        # the stages: one row per pipeline rank of each candidate: what it holds (once per distinct PP, VPP and split:
        # rank_layers, as resolve derives it) and its parameters (params' own count on the columns, once per
        # distinct TP, ETP, EP)
        first, group = self.groups(("pp", "vpp", "split"), rows)
        splits = []
        for i in first.tolist():
            splits.append(np.array([(x.pp_rank, *dataclasses.astuple(params.StageLayers.of(s.arch, x)))
                                    for x in s._split(self.candidates[i])], dtype=np.int64).reshape(-1, 7))
        sizes = np.array([len(x) for x in splits])
        counts = sizes[group]
        owner = np.repeat(np.arange(n), counts)  # each stage row's candidate (index into rows)
        ends = np.cumsum(counts)
        # each stage row's row of its split's table: the split's offset + the rank's index within the candidate
        index = np.repeat(np.cumsum(sizes)[group] - sizes[group] - (ends - counts), counts) + np.arange(ends[-1])
        table = np.concatenate(splits)[index]
        held = params.StageLayers(*table[:, 1:6].T, table[:, 6].astype(bool))
        held = dataclasses.replace(held, embedding=held.embedding.astype(bool), loss=held.loss.astype(bool))
        at = rows[owner]  # the stage rows' candidates, as rows of the columns
        dense, expert = np.zeros(len(owner), dtype=np.int64), np.zeros(len(owner), dtype=np.int64)
        first_c, group_c = self.groups(("tp", "etp", "ep"), at)
        order, pp = np.argsort(group_c, kind="stable"), self.pp[at]
        for i, ours in zip(first_c.tolist(), np.split(order, np.flatnonzero(np.diff(group_c[order])) + 1)):
            counter = params.counter(s.arch, int(self.tp[i]), int(self.etp[i]), int(self.ep[i]), s.impl.te)
            sub = params.StageLayers(*(getattr(held, f.name)[ours] for f in dataclasses.fields(held)))
            dense[ours], expert[ours] = counter.counts(sub, pp[ours], xp)
        total = dense + expert
        # the ranks that can hold the peak: among ranks alike in layers and parameters, the lowest pipeline rank holds
        # the most micro-batches in flight
        is_peak = np.zeros(len(owner), dtype=bool)
        is_peak[self.np_ops.groups(owner, held.layers, held.moe, held.loss, held.mtp, total)[0]] = True
        # the most loaded rank (the first with the most parameters)
        most = np.zeros(n, dtype=np.int64)
        np.maximum.at(most, owner, total)
        heaviest = np.flatnonzero(total == most[owner])
        heaviest = heaviest[np.unique(owner[heaviest], return_index=True)[1]]
        worst_dense, worst_expert = dense[heaviest], expert[heaviest]

        # the memory estimate (its numbers columns): the states of every stage row; the activations, at each rung of
        # the recompute ladder, of the rows that can hold the peak
        peak_rows = np.flatnonzero(is_peak)
        stages = memory.Stages(table[peak_rows, 0], held.layers[peak_rows], held.moe[peak_rows], held.mtp[peak_rows],
                               held.loss[peak_rows])
        est = memory.Estimator(s.base, self.mesh(at[peak_rows]), xp)
        ws = memory.workspaces(s.base, self.mesh(rows))
        static = est.states(total, dense, expert, *est.shards(self.dp[at], self.cp[at], self.edp[at], xp),
                            ws[owner] if isinstance(ws, np.ndarray) else ws)
        states_alone = np.zeros(n)
        np.maximum.at(states_alone, owner, static[0] + static[1] + static[2] + static[4])
        static = tuple(x[peak_rows] if isinstance(x, np.ndarray) else x for x in static)
        starts = np.flatnonzero(np.r_[True, owner[peak_rows][1:] != owner[peak_rows][:-1]])
        peaks = {}
        for level, node in s.recompute.items():
            est.recompute(node)
            act, _, next_layer = est.activations(stages, False, xp)
            both = []
            for kept in (act, act + next_layer):
                e = memory._estimated(static, kept, xp)
                both.append(np.maximum.reduceat(e + est.allowance_total(e), starts) / memory.GIB)
            peaks[level] = both
        return self._choose(rows, peaks, states_alone, worst_dense, worst_expert)

    def _choose(self, rows: Any, peaks: dict, states_alone: Any, worst_dense: Any, worst_expert: Any) -> list[Result]:
        """The least recompute that fits with the primary setting; then the fastest setting that fits at that rung or
        above; the terms."""
        np, s = self.np, self.s
        n, cap, levels, primary = len(rows), s.cap, list(s.recompute), s.comms[0]
        level = np.zeros(n, dtype=np.int64)
        peak = np.zeros(n)
        fits = np.ones(n, dtype=bool)
        todo = np.ones(n, dtype=bool)
        for li, name in enumerate(levels):  # a refused rung (e.g. full recompute with EP overlap, L68) is skipped
            here = todo.copy()
            here[todo] = ~self.refused(rows[todo], name)
            level[here], peak[here] = li, peaks[name][primary.ep_overlap][here]
            if cap is None:
                todo[here] = False
                continue
            fits[here] = peak[here] <= cap
            todo[here & fits] = False
            todo[here & (states_alone / memory.GIB > cap)] = False  # the states alone: no recompute helps
        def step(k: int, li: int, idx: Any) -> tuple:
            """The terms of rows ``idx`` with setting ``k`` at rung ``li``."""
            c = s.comms[k]
            return s.model.columns(self.mesh(rows[idx]), worst_dense[idx], worst_expert[idx], s.recompute[levels[li]],
                                   c.flex, c.ep_overlap)

        comm, start = np.zeros(n, dtype=np.int64), level.copy()  # each setting climbs from the primary's rung
        if len(s.comms) > 1 and n:
            best_step = np.zeros(n)
            for li in np.unique(level).tolist():
                idx = np.flatnonzero(level == li)
                best_step[idx] = step(0, li, idx)[-1]
            open_ = fits if cap is not None else np.ones(n, dtype=bool)
            for k, c in enumerate(s.comms[1:], 1):
                # no all-to-all: the model gives a flex dispatcher the same time, a rule refuses overlap (L65)
                active = open_ & ~((self.ep[rows] == 1) & (c.flex or c.ep_overlap))
                for li, name in enumerate(levels):
                    here = np.flatnonzero(active & (start <= li))
                    if not len(here):
                        continue
                    st = step(k, li, here)[-1]
                    slower = st >= best_step[here]  # more recompute only adds time
                    active[here[slower]] = False
                    go, st = here[~slower], st[~slower]
                    if not len(go):
                        continue
                    ok = ~self.refused(rows[go], name) & self.comm_legal(rows[go], name, c)
                    go, st = go[ok], st[ok]
                    peak_c = peaks[name][c.ep_overlap][go] + s.flex_gib * (c.flex - primary.flex)
                    if cap is not None:
                        go, st, peak_c = go[peak_c <= cap], st[peak_c <= cap], peak_c[peak_c <= cap]
                    comm[go], level[go], peak[go], best_step[go] = k, li, peak_c, st
                    active[go] = False
        terms = np.zeros((n, len(TERMS) + 1))
        for k in np.unique(comm).tolist() if n else ():
            for li in np.unique(level[comm == k]).tolist():
                idx = np.flatnonzero((comm == k) & (level == li))
                terms[idx] = np.stack(step(k, li, idx), axis=1)
        fit = [None] * n if cap is None else fits.tolist()
        candidates, world, comms = self.candidates, s.world, s.comms
        return [Result(candidates[i], world, [], levels[li], p, f, Terms(t), comm=comms[k])
                for i, k, li, p, f, t in zip(rows.tolist(), comm.tolist(), level.tolist(), peak.tolist(), fit,
                                             terms.tolist())]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused: a search allocates some hundred thousand objects (candidates, results,
    their terms) that live until it ends and makes no cycles of its own; each collection on the way would walk them
    all (a fifth of DeepSeek-V3's search on 1024 GPUs). Collected as usual afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def tied_set(ranked: list[Result], width: float) -> list[Result]:
    """The leading ranked layouts the step model cannot tell from the best: predicted within ``width`` of its step
    time (:attr:`Search.tie_width`: :func:`moe_hydra.planning.step_model.tie_width`, the ratio the model orders two
    layouts right at with 95 % confidence; a calibration's held-out error with one), from the same source as the
    best's. What screening measures, rather than a fixed top-K."""
    if not ranked:
        return []
    bound = ranked[0].terms["step"] * width
    return list(itertools.takewhile(lambda r: r.terms["step"] <= bound and r.calibrated == ranked[0].calibrated,
                                    ranked))


def uncalibrated_ties(ranked: list[Result], width: float) -> int:
    """How many of the ranked layouts the step model alone could not tell from its own best (``width``: its tie
    ratio), with a calibration: by the step model's time where the calibration replaced it (``prior_step``)."""
    steps = [r.terms["step"] if r.prior_step is None else r.prior_step for r in ranked]
    return sum(s <= min(steps) * width for s in steps) if steps else 0


def rank(results: list[Result], domain: int, seq: int) -> None:
    """Rank the legal candidates that fit (or whose fit is unknown): with a calibration, those it predicts first
    (two sources' step times do not compare); CP only for long sequences and ETP 1 first (docs/workflow.md), then by
    step time (to the microsecond), then the fewest model-parallel ranks, EP x ETP within the NVLink domain, the
    fewest virtual stages, the largest micro-batch. Ties keep the results' order (a stable sort, on columns)."""
    import numpy as np

    ok = [r for r in results if r.legal and r.fits is not False]
    if not ok:
        return
    tp, cp, pp, vpp, ep, etp, mbs, _ = zip(*(r.candidate for r in ok))
    tp, cp, pp, ep, etp, mbs = (np.array(x, dtype=np.int64) for x in (tp, cp, pp, ep, etp, mbs))
    keys = ([r.calibrated is False for r in ok], (cp > 1) & (seq < CP_FROM_SEQ), etp > 1,
            [round(r.terms["step"], 6) for r in ok], tp * cp * pp, ep * etp > domain, [v or 1 for v in vpp], -mbs)
    for i, k in enumerate(np.lexsort(keys[::-1]).tolist(), 1):  # lexsort's last key sorts first
        ok[k].rank = i
