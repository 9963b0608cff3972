"""The vocabulary of the legality rules: the context a rule reads, the registry every rule joins with
``@rule`` (a violation and the error that carries them are the core's: :mod:`moe_hydra.core.violations`), and the
sizes that work, which the rules' fixes name (``tests/test_fixes.py`` applies every fix).
Pure: standard library only (the GPU presets a fix names are read from ``conf/hardware``).
"""

from __future__ import annotations

import functools
import math

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from moe_hydra.core import presets
from moe_hydra.core.arch import Arch
from moe_hydra.core.layout import Layout
from moe_hydra.core.overrides import text as _fmt  # noqa: F401 (the rules' vocabulary)
from moe_hydra.core.resolved import Batch, Resolved
from moe_hydra.core.versions import McoreFacts
from moe_hydra.core.violations import LayoutError, V, Violation  # noqa: F401


@dataclass(slots=True)
class Ctx:
    """What every rule reads: the resolved plan (the config, its layout, architecture and batch) and the
    megatron-core facts."""

    r: Resolved
    mcore: McoreFacts

    @property
    def cfg(self):
        return self.r.cfg

    @property
    def layout(self) -> Layout:
        return self.r.layout

    @property
    def arch(self) -> Arch | None:
        """None when moe_layer_freq itself is malformed (L13 reports it)."""
        return self.r.arch

    @property
    def batch(self) -> Batch:
        return self.r.batch

    @property
    def p(self):
        return self.cfg.parallel

    @property
    def m(self):
        return self.cfg.model

    @property
    def seq(self) -> int:
        return self.cfg.train.seq_length

    @property
    def fp8(self) -> bool:
        return self.cfg.precision.fp8 is not None

    @property
    def flex(self) -> bool:
        return self.cfg.dispatcher.moe_token_dispatcher_type == "flex"


Rule = Callable[[Ctx], Iterator[Violation]]
RULES: list[Rule] = []


# What each kind of rule may read of what the layout search varies, as paths into the resolved plan (the search
# runs the fixed kind once, the others per candidate, each rule cached by the values it read:
# :func:`check_reading`);
# tests/test_rules.py runs every rule under a :class:`Recorder` and fails when a rule reads a varied path its kind
# does not list.
_LAYOUT = ("layout.world_size", "layout.tp", "layout.cp", "layout.pp", "layout.ep", "layout.etp", "layout.sp",
           "layout.dp", "layout.edp", "layout.attention_model_size", "layout.expert_model_size")
_MESH = tuple(f"cfg.parallel.{f}" for f in (
    "tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
    "expert_tensor_parallel_size", "sequence_parallel", "cp_comm_type", "hierarchical_context_parallel_sizes",
    "use_tp_pp_dp_mapping"))
_SPLIT = ("layout.vpp", "layout.virtual_stages", *(f"cfg.parallel.{f}" for f in (
    "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout", "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split")))
_BATCH = ("batch.micro_batch_size", "batch.global_batch_size", "batch.micro_batches_per_step",
          "cfg.train.micro_batch_size", "cfg.train.global_batch_size")
_RECOMPUTE = tuple(f"cfg.recompute.{f}" for f in (
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"))
DISPATCHER_READS = ("cfg.dispatcher.name", "cfg.dispatcher.moe_token_dispatcher_type",
                    "cfg.dispatcher.moe_flex_dispatcher_backend", "cfg.dispatcher.num_sms")
COMM_READS = (*DISPATCHER_READS, "cfg.overlap.overlap_moe_expert_parallel_comm")
READS = {
    "fixed": (),
    "mesh": (*_LAYOUT, *_MESH, *_BATCH, "derived.tp_choices"),
    "pipeline": ("layout.world_size", "layout.pp", "layout.dp", *_SPLIT, *_BATCH),
    "recompute": ("layout.pp", "layout.ep", "layout.expert_parallel", *_SPLIT, *_RECOMPUTE),
}
# What the layout search varies between candidates: everything a candidate, its recompute level or its
# communication setting changes (the fixed kind reads none of it).
VARIED = ("layout.", "batch.", "split", "cfg.parallel.", "cfg.train.micro_batch_size", "cfg.train.global_batch_size",
          "cfg.recompute.", "cfg.dispatcher.", "cfg.overlap.overlap_moe_expert_parallel_comm", "derived.")


def comm_reads(kind: str) -> tuple[str, ...]:
    """The communication-setting paths the rules of a kind read (what their ``comm`` declares)."""
    return tuple(dict.fromkeys(p for r in RULES if r.reads == kind for p in r.comm))


class Recorder:
    """Stands in for a resolved plan (and any node below it): records the dotted path of every value read that is
    not itself a node, and of a node used whole (compared, hashed, formatted, iterated: it reads all of it), the
    node's own path (what :func:`check_reading` reports)."""

    def __init__(self, obj: object, path: str, seen: set[str]):
        self._obj, self._path, self._seen = obj, path, seen

    def __getattr__(self, name: str):
        value = getattr(self._obj, name)
        path = f"{self._path}.{name}" if self._path else name
        if hasattr(type(value), "__dataclass_fields__"):  # a node (the same Recorder each time)
            value = Recorder(value, path, self._seen)
        else:
            self._seen.add(path)
        self.__dict__[name] = value  # recorded once: the plan is not changed while a rule reads it
        return value

    def _whole(self) -> object:
        self._seen.add(self._path)
        return self._obj

    def __eq__(self, other: object) -> bool:
        return self._whole() == (other._whole() if isinstance(other, Recorder) else other)

    def __hash__(self) -> int:
        return hash(self._whole())

    def __str__(self) -> str:
        return str(self._whole())

    def __repr__(self) -> str:
        return repr(self._whole())

    def __format__(self, spec: str) -> str:
        return format(self._whole(), spec)

    def __iter__(self):
        return iter(self._whole())  # type: ignore[call-overload]


def check_reading(rule: Rule, r: Resolved, mcore: McoreFacts) -> tuple[list[Violation], set[str]]:
    """(``rule``'s violations of ``r``, the paths into ``r`` whose values it read): the rule gives the same answer for
    any plan with the same values there (it reads nothing else of the plan)."""
    seen: set[str] = set()
    return list(rule(Ctx(Recorder(r, "", seen), mcore))), seen  # type: ignore[arg-type]


def rule(fn: Rule | None = None, *, reads: str = "mesh", comm: tuple[str, ...] = ()):
    """Register a rule. ``reads``: the kind of rule, by what it reads of what the layout search varies
    (:data:`READS`), so the search checks each rule as rarely as it can:

    - ``fixed``: nothing the search varies (once per search);
    - ``mesh``: the parallel sizes and the batch (once per mesh);
    - ``pipeline``: PP, VPP, the pipeline split and the batch, nothing else of the mesh;
    - ``recompute``: PP, VPP, the split, EP and the recompute settings (once per recompute level the
      search tries).

    ``comm``: the paths of the communication setting the rule reads too (:data:`DISPATCHER_READS`,
    :data:`COMM_READS`): the search tries other dispatchers and EP overlap settings with every layout."""

    def register(f: Rule) -> Rule:
        if reads not in READS:
            raise ValueError(f"rule {f.__name__}: reads={reads!r} is not one of {sorted(READS)}")
        if not set(comm) <= set(COMM_READS):
            raise ValueError(f"rule {f.__name__}: comm={comm!r} names paths outside {COMM_READS}")
        f.reads, f.comm = reads, tuple(comm)
        RULES.append(f)
        return f

    return register(fn) if fn is not None else register


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, in sqrt(n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values)) if values else "none"


# --------------------------------------------------------------------------- sizes that work, for the fixes

def _v01(c: Ctx, tp: int, etp: int, ep: int) -> bool:
    """Whether these sizes fall into V01's trap on this megatron-core (EP 1, TP > 1, ETP != TP)."""
    return _v01_sizes(bool(c.m.num_moe_experts), tp, etp, ep, c.mcore.ep1_etp_wrong_expert_grads)


def _v01_sizes(moe: bool, tp: int, etp: int, ep: int, wrong_grads: bool) -> bool:
    return moe and ep == 1 and tp > 1 and etp != tp and wrong_grads


def _ep_choices(c: Ctx, above_one: bool = False) -> list[int]:
    """The EP sizes that divide the experts and the world; above 1 with the flex dispatcher (or ``above_one``),
    never 1 where V01 would fire."""
    lo, experts = c.layout, c.m.num_moe_experts or 1
    return [e for e in _divisors(experts) if lo.world_size % (lo.etp * e * lo.pp) == 0
            and not ((above_one or c.flex) and lo.etp * e <= 1) and not _v01(c, lo.tp, lo.etp, e)]


def _tp_choices(c: Ctx) -> list[int]:
    """The TP sizes every TP rule takes (the heads, the query groups, the widths, the sequence with SP, the world,
    ETP when it follows TP); 1 only without sequence parallelism, above 1 for MoE only with it. Read as one value,
    ``derived.tp_choices`` (:func:`derived`)."""
    return list(derived(c, "derived.tp_choices"))


def tp_choices_at(c: Ctx, cp: int, pp: int, ep: int, etp: int | None, sp: bool) -> tuple[int, ...]:
    """:func:`_tp_choices` of a layout of these sizes, the rest (world, sequence, model, megatron-core) ``c``'s
    (``etp`` None where ETP follows TP): what the layout search computes on its columns."""
    m = c.m
    return _tp_sizes(c.layout.world_size, cp, pp, ep, etp, sp, c.seq, m.num_attention_heads, m.num_query_groups,
                     m.multi_latent_attention, m.ffn_hidden_size, m.moe_shared_expert_intermediate_size,
                     m.moe_ffn_hidden_size, m.num_moe_experts, c.mcore.ep1_etp_wrong_expert_grads)


def _tp_choices_of(c: Ctx) -> tuple[int, ...]:
    lo = c.layout
    return tp_choices_at(c, lo.cp, lo.pp, lo.ep, None if c.p.expert_tensor_parallel_size is None else lo.etp, lo.sp)


# Values the fixes compute from many varied paths at once, each read by a rule as one path (:func:`derived`): what
# they are computed from varies together in a layout search while the values barely do (the TP sizes of DeepSeek-V3's
# 5,992 layouts with TP above its heads on 16,384 GPUs: 4 lists), so the search keys a rule's answer by the value,
# computed on its columns (search._Columns.PATH_COLUMNS), instead of running the rule once per layout.
DERIVED: dict[str, Callable[[Ctx], Any]] = {"derived.tp_choices": _tp_choices_of}


def derived(c: Ctx, path: str) -> Any:
    """:data:`DERIVED` ``path`` of ``c``'s plan; under a :class:`Recorder`, recorded as that one path (not the
    paths it is computed from)."""
    if isinstance(c.r, Recorder):
        c.r._seen.add(path)
        c = Ctx(c.r._obj, c.mcore)
    return DERIVED[path](c)


@functools.lru_cache(maxsize=4096)
def _tp_sizes(world: int, cp: int, pp: int, ep: int, etp: int | None, sp: bool, seq: int, heads: int,
              groups: int | None, mla: bool, ffn: int, shared: int | None, moe_ffn: int | None, experts: int | None,
              wrong_grads: bool) -> tuple[int, ...]:
    """:func:`_tp_choices` of these numbers (cached: a layout search asks for the sizes of many alike layouts);
    ``etp`` None where ETP follows TP."""
    groups = groups or heads
    widths = [ffn, shared or ffn]
    out = []
    for t in _divisors(heads):
        e = t if etp is None else etp
        if (t <= 64 and world % (t * cp * pp) == 0 and world % (e * ep * pp) == 0
                and (mla or groups % t == 0 or t % groups == 0) and all(w % t == 0 for w in widths)
                and (moe_ffn or ffn) % e == 0 and not (t == 1 and sp) and not (t > 1 and experts and not sp)
                and not (t > 1 and sp and (seq // cp) % t) and not _v01_sizes(bool(experts), t, e, ep, wrong_grads)):
            out.append(t)
    return tuple(out)


def _world(c: Ctx, size: int) -> str:
    """The override that makes the world a multiple of ``size``: more processes on this machine (the CPU preset),
    else more nodes."""
    hw = c.cfg.hardware
    if hw.arch == "cpu":
        step = size // math.gcd(size, hw.nodes)
        return f"hardware.devices_per_node={-(-hw.devices_per_node // step) * step}"
    step = size // math.gcd(size, hw.devices_per_node)
    return f"hardware.nodes={-(-hw.nodes // step) * step}"


def _here(c: Ctx) -> str:
    """What the CPU preset is, in a message: this machine's processes."""
    w = c.layout.world_size
    return f" ({c.cfg.hardware.name} runs {w} process{'es' if w > 1 else ''} on this machine)" if (
        c.cfg.hardware.arch == "cpu") else ""


@functools.cache
def gpu_presets() -> dict[str, int]:
    """The shipped GPU hardware presets, with their GPUs per node."""
    found = {o: presets.preset("hardware", o) for o in presets.options("hardware")}
    return {o: p["hardware.devices_per_node"] for o, p in found.items()
            if p.get("hardware.arch") != "cpu" and isinstance(p.get("hardware.devices_per_node"), int)}


def _on_gpus(c: Ctx, size: int, extra: str = "") -> str:
    """On the CPU preset, the alternative of a layout larger than this machine: planned as asked on the GPU
    presets whose world fits ``size`` GPUs in the fewest nodes, with stage=plan (no GPU is needed to plan, e.g. on
    a login node); empty on GPU hardware."""
    if c.cfg.hardware.arch != "cpu" or not gpu_presets():
        return ""
    nodes = {name: size // math.gcd(size, d) for name, d in gpu_presets().items()}
    n = min(nodes.values())
    names = [name for name, k in nodes.items() if k == n]
    return f", or hardware=<one of {_list(names)}>{f' hardware.nodes={n}' if n > 1 else ''}{extra} stage=plan"
