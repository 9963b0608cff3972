"""The one mapping table: a moe_hydra key <-> a Megatron-LM ``pretrain_gpt.py`` flag <-> a Megatron-Bridge key.

Export and ingest both read :data:`TABLE`, so the round trip holds by construction: every entry turns the values it
covers into flags (:meth:`Entry.mlm`) and reads the same values back from flags (:meth:`Entry.read_mlm`), and the same
for Bridge overrides. An entry says when it applies (a MoE field needs experts, a flex field the flex dispatcher); an
entry that does not apply writes no flag on export and no key on ingest, so the preset (or the ``# moe_hydra:`` line)
keeps the value.

Values come from the resolved plan where the plan derives them (the layout from :meth:`Layout.to_megatron`'s degrees,
the batch from :class:`~moe_hydra.core.resolved.Batch`), and from the typed config otherwise (moe_hydra's schema uses
Megatron-Core's names and sentinels already: ``null`` = Megatron's default). Version-dependent names (the flex
dispatcher's SM field, the CUDA-graph scope field) come from :mod:`moe_hydra.core.versions`.

Megatron-LM's flag names and value choices are those of its argument parser at ``core_v0.16.1``
(``tests/data/megatron_lm_arguments.txt`` holds them, and the tests check every flag and value written against it).
Bridge's ``model.*``, ``optimizer.*`` and ``ddp.*`` keys are fields of megatron-core's ``TransformerConfig``
(``MLATransformerConfig``), ``OptimizerConfig`` and ``DistributedDataParallelConfig``; the other sections (``train``,
``dataset``, ``tokenizer``, ``rng``, ``scheduler``, ``dist``, ``mixed_precision``) are Megatron-Bridge's own
``ConfigContainer`` (v0.3.1, the release for megatron-core < 0.17).

Pure: standard library and moe_hydra.core.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moe_hydra.core.arch import activation_func
from moe_hydra.core.errors import Refused
from moe_hydra.core.pipeline import stage_count
from moe_hydra.core.resolved import ATTENTION_BACKENDS

MEGATRON_LM = "Megatron-LM core_v0.16.1"


class Unmapped(Exception):
    """A value that has no flag (or no Bridge key) at the pinned version: export reports it and leaves the key to
    the ``# moe_hydra:`` line."""


@dataclass(frozen=True)
class Source:
    """What export reads: the typed config, its resolved plan and the megatron-core facts."""

    cfg: Any
    r: Any
    mcore: Any

    @property
    def moe(self) -> bool:
        return bool(self.cfg.model.num_moe_experts)

    @property
    def flex(self) -> bool:
        return self.moe and self.cfg.dispatcher.moe_token_dispatcher_type == "flex"


class Flags:
    """Megatron-LM flags as given: ``{flag: [values]}`` (the last occurrence wins, as in argparse)."""

    def __init__(self, parsed: dict[str, list[str]]):
        self.d = parsed

    def has(self, flag: str) -> bool:
        return flag in self.d

    def vals(self, flag: str) -> list[str]:
        return self.d[flag]

    def one(self, flag: str) -> str:
        v = self.d[flag]
        if len(v) != 1:
            raise Refused(f"{flag} takes one value here, got {len(v)}: {' '.join(v) or '(none)'}")
        return v[0]

    def switch(self, flag: str) -> bool:
        if self.d.get(flag):
            raise Refused(f"{flag} takes no value, got {' '.join(self.d[flag])}")
        return flag in self.d

    def get(self, flag: str, default: str | None = None) -> str | None:
        return self.one(flag) if flag in self.d else default

    @property
    def moe(self) -> bool:
        return self.has("--num-experts")

    @property
    def flex(self) -> bool:
        return self.moe and self.get("--moe-token-dispatcher-type", "allgather") == "flex"


# ----------------------------------------------------------------------------- value text


def fmt(v: Any) -> str:
    """A value as a Megatron-LM flag value: floats in their shortest exact form, bools as Python writes them."""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise Refused(f"expected an integer, got {s!r}") from None


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        raise Refused(f"expected a number, got {s!r}") from None


PARSE = {int: _int, float: _float, str: str}


# ----------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    """One mapping. ``keys``: the moe_hydra keys it writes on ingest; ``flags``: the Megatron-LM flags it reads
    (every spelling); ``bkeys``: the Bridge keys it reads; ``group``: where it sits in the output; ``launcher``:
    the flags belong to torchrun, not pretrain_gpt.py."""

    keys: tuple[str, ...]
    flags: tuple[str, ...]
    bkeys: tuple[str, ...]
    group: str
    doc: str = ""
    launcher: bool = False
    # export side: {key: value}, or None where the entry does not apply
    values: Callable[[Source], dict | None] = field(repr=False, default=None)
    # {key: value} -> [[flag, value, ...], ...]; raises Unmapped
    to_mlm: Callable[[dict, Source], list[list[str]]] = field(repr=False, default=None)
    # Flags -> {key: value}, or None where the entry does not apply
    from_mlm: Callable[[Flags], dict | None] = field(repr=False, default=None)
    # {key: value} -> [(bridge key, value)]; raises Unmapped; None: no Bridge form
    to_bridge: Callable[[dict, Source], list[tuple[str, Any]]] | None = field(repr=False, default=None)
    # {bridge key: value} -> {key: value} (only the keys given), or None where it does not apply
    from_bridge: Callable[[dict], dict | None] | None = field(repr=False, default=None)
    # value() entries: "value" or "switch", and what an absent flag reads as (Megatron-LM's parser default)
    kind: str = "custom"
    absent: Any = field(repr=False, default=None)


def _attr(key: str) -> Callable[[Source], Any]:
    section, name = key.split(".", 1) if "." in key else (None, key)

    def get(s: Source) -> Any:
        node = getattr(s.cfg, section) if section else s.cfg
        return getattr(node, name)

    return get


def _always(_: Any) -> bool:
    return True


def _flag_of(key: str) -> str:
    return "--" + key.rsplit(".", 1)[-1].replace("_", "-")


def value(key: str, flag: str | None = None, bridge: str | None = "model", *, type: type = int, listed: bool = False,
          get: Callable[[Source], Any] | None = None, when: Callable[[Source], bool] = _always,
          gwhen: Callable[[Flags], bool] = _always, absent: Any = None, required: bool = False,
          choices: tuple | None = None, group: str = "", doc: str = "") -> Entry:
    """A flag that takes a value (``listed``: several, nargs='+'). Absent on ingest: ``absent`` (Megatron-LM's
    parser default in moe_hydra's terms, or a function of the other flags where Megatron-LM derives it), or a
    refusal when Megatron-LM needs the flag (``required``)."""
    flag = flag or _flag_of(key)
    get = get or _attr(key)
    name = key.rsplit(".", 1)[-1]
    bkey = None if bridge is None else (bridge if "." in bridge else f"{bridge}.{name}")

    def values(s: Source) -> dict | None:
        return {key: get(s)} if when(s) else None

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        x = v[key]
        if x is None or (listed and not x):
            if x == ([] if listed and absent == [] else None) and not required and not callable(absent):
                return []  # absent means the same
            raise Unmapped(f"{key}={x}: {flag} cannot say it at {MEGATRON_LM}")
        items = list(x) if listed else [x]
        if choices is not None:
            bad = [i for i in items if i not in choices]
            if bad:
                raise Unmapped(f"{key}={x}: {flag} takes {', '.join(map(str, choices))} at {MEGATRON_LM}")
        return [[flag, *(fmt(i) for i in items)]]

    def from_mlm(g: Flags) -> dict | None:
        if not gwhen(g):
            return None
        if not g.has(flag):
            if required:
                raise Refused(f"no {flag}: Megatron-LM needs it")
            x = absent(g) if callable(absent) else absent
            return {key: list(x) if isinstance(x, (list, tuple)) else x}
        parse = PARSE[type]
        try:
            x = [parse(i) for i in g.vals(flag)] if listed else parse(g.one(flag))
        except Refused as e:
            raise Refused(f"{flag}: {e}") from None
        if listed and not x:
            raise Refused(f"{flag} needs at least one value")
        return {key: x}

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        return [(bkey, v[key])]

    def from_bridge(b: dict) -> dict | None:
        return {key: b[bkey]} if bkey in b else None

    return Entry((key,), (flag,), (bkey,) if bkey else (), group, doc, values=values, to_mlm=to_mlm,
                 from_mlm=from_mlm, to_bridge=to_bridge if bkey else None, from_bridge=from_bridge if bkey else None,
                 kind="value" if not (required or callable(absent)) else "custom", absent=absent)


def switch(key: str, flag: str | None = None, bridge: str | None = "model", *, on: bool = True,
           get: Callable[[Source], Any] | None = None, when: Callable[[Source], bool] = _always,
           gwhen: Callable[[Flags], bool] = _always, group: str = "", doc: str = "") -> Entry:
    """A flag without a value: ``store_true`` (present = True, ``on=True``) or ``store_false`` (present = False)."""
    flag = flag or _flag_of(key)
    get = get or _attr(key)
    name = key.rsplit(".", 1)[-1]
    bkey = None if bridge is None else (bridge if "." in bridge else f"{bridge}.{name}")

    def values(s: Source) -> dict | None:
        return {key: bool(get(s))} if when(s) else None

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        return [[flag]] if v[key] == on else []

    def from_mlm(g: Flags) -> dict | None:
        if not gwhen(g):
            return None
        return {key: on if g.switch(flag) else not on}

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        return [(bkey, v[key])]

    def from_bridge(b: dict) -> dict | None:
        return {key: b[bkey]} if bkey in b else None

    return Entry((key,), (flag,), (bkey,) if bkey else (), group, doc, values=values, to_mlm=to_mlm,
                 from_mlm=from_mlm, to_bridge=to_bridge if bkey else None, from_bridge=from_bridge if bkey else None,
                 kind="switch", absent=not on)


def custom(keys: tuple[str, ...], flags: tuple[str, ...], bkeys: tuple[str, ...], group: str, doc: str, *,
           values, to_mlm, from_mlm, to_bridge=None, from_bridge=None, launcher: bool = False) -> Entry:
    return Entry(keys, flags, bkeys, group, doc, launcher, values, to_mlm, from_mlm, to_bridge, from_bridge)


def _bridge_keys(b: dict, *pairs: tuple[str, str]) -> dict | None:
    """{moe_hydra key: value} for the Bridge keys present."""
    out = {key: b[bkey] for bkey, key in pairs if bkey in b}
    return out or None


# ----------------------------------------------------------------------------- conditions


def _moe(s: Source) -> bool:
    return s.moe


def _gmoe(g: Flags) -> bool:
    return g.moe


def _mla(s: Source) -> bool:
    return s.cfg.model.multi_latent_attention


def _gmla(g: Flags) -> bool:
    return g.switch("--multi-latent-attention")


def _flex(s: Source) -> bool:
    return s.flex


def _gflex(g: Flags) -> bool:
    return g.flex


def _rope(s: Source) -> bool:
    return s.cfg.model.position_embedding_type == "rope"


def _grope(g: Flags) -> bool:
    return g.get("--position-embedding-type", "learned_absolute") == "rope"


def _cp(s: Source) -> bool:
    return s.r.layout.cp > 1


def _gcp(g: Flags) -> bool:
    return _int(g.get("--context-parallel-size", "1")) > 1


def _pao(s: Source) -> bool:
    return s.cfg.optimizer.use_precision_aware_optimizer


def _gpao(g: Flags) -> bool:
    return g.switch("--use-precision-aware-optimizer")


def _offload(s: Source) -> bool:
    return s.cfg.offload.optimizer_cpu_offload


def _goffload(g: Flags) -> bool:
    return g.switch("--optimizer-cpu-offload")


def _fp8(s: Source) -> bool:
    return s.cfg.precision.fp8 is not None


def _gfp8(g: Flags) -> bool:
    return g.has("--fp8-format")


def _fp4(s: Source) -> bool:
    return s.cfg.precision.fp4 is not None


def _gfp4(g: Flags) -> bool:
    return g.has("--fp4-format")


def _graphs(s: Source) -> bool:
    return s.cfg.kernels.cuda_graph_impl != "none"


def _ggraphs(g: Flags) -> bool:
    return g.get("--cuda-graph-impl", "none") != "none"


def _default_ffn(g: Flags) -> int:
    """Megatron-LM's dense MLP width when --ffn-hidden-size is absent (validate_args)."""
    h = _int(g.get("--hidden-size", "0"))
    return int((4 * h * 2 / 3) / 64) * 64 if g.switch("--swiglu") else 4 * h


# ----------------------------------------------------------------------------- custom entries


def _launcher() -> list[Entry]:
    def values(s: Source) -> dict:
        return {"hardware.nodes": s.cfg.hardware.nodes, "hardware.devices_per_node": s.cfg.hardware.devices_per_node}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        return [["--nnodes", str(v["hardware.nodes"])], ["--nproc-per-node", str(v["hardware.devices_per_node"])]]

    def from_mlm(g: Flags) -> dict | None:
        out = {}
        if g.has("--nnodes"):
            n = g.one("--nnodes")
            if not n.isdigit():
                raise Refused(f"torchrun --nnodes={n}: moe_hydra plans a fixed node count (an elastic range is not "
                              "one)")
            out["hardware.nodes"] = int(n)
        if g.has("--nproc-per-node"):
            p = g.one("--nproc-per-node")
            if not p.isdigit():
                raise Refused(f"torchrun --nproc-per-node={p}: give the number of GPUs per node")
            out["hardware.devices_per_node"] = int(p)
        return out or None

    return [custom(("hardware.nodes", "hardware.devices_per_node"), ("--nnodes", "--nproc-per-node"), (), "launcher",
                   "torchrun's node count and processes per node: the world size", values=values, to_mlm=to_mlm,
                   from_mlm=from_mlm, to_bridge=None, from_bridge=None, launcher=True)]


def _transformer_impl() -> Entry:
    key = "hardware.transformer_engine"

    def values(s: Source) -> dict:
        return {key: s.cfg.hardware.transformer_engine}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        return [["--transformer-impl", "transformer_engine" if v[key] else "local"]]

    def from_mlm(g: Flags) -> dict:
        impl = g.get("--transformer-impl", "transformer_engine")
        if impl not in ("transformer_engine", "local"):
            raise Refused(f"--transformer-impl {impl}: moe_hydra plans transformer_engine or local layers")
        return {key: impl == "transformer_engine"}

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        if not v[key]:
            raise Unmapped(f"{key}=false: Megatron-Bridge's GPT providers build Transformer Engine layers; the local "
                           "spec has no override")
        return []

    return custom((key,), ("--transformer-impl",), (), "model", "the layer spec the plan assumes (Transformer Engine "
                  "or local)", values=values, to_mlm=to_mlm, from_mlm=from_mlm, to_bridge=to_bridge,
                  from_bridge=lambda b: None)


def _precision() -> Entry:
    key = "precision.params_dtype"

    def values(s: Source) -> dict:
        return {key: s.cfg.precision.params_dtype}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        return {"bf16": [["--bf16"]], "fp16": [["--fp16"]], "fp32": []}[v[key]]

    def from_mlm(g: Flags) -> dict:
        bf16, fp16 = g.switch("--bf16"), g.switch("--fp16")
        if bf16 and fp16:
            raise Refused("--bf16 and --fp16 together: Megatron-LM refuses them, so does moe_hydra")
        return {key: "bf16" if bf16 else "fp16" if fp16 else "fp32"}

    return custom((key,), ("--bf16", "--fp16"), (), "precision", "weights and compute dtype: --bf16 | --fp16 | "
                  "neither (fp32); Bridge: part of mixed_precision", values=values, to_mlm=to_mlm, from_mlm=from_mlm)


# Megatron-Bridge's registered mixed-precision recipes that equal a moe_hydra precision exactly (v0.3.1,
# src/megatron/bridge/training/mixed_precision.py): (params_dtype, fp8, fp8_recipe, fp4, fp4_recipe, fp8_param_gather,
# grad_reduce_in_fp32). The fp8 recipes there also keep FP8 weights, the first and last layers in bf16 or a long
# amax history, which no moe_hydra precision preset does: those are reported, not approximated.
BRIDGE_PRECISION = {
    "bf16_mixed": ("bf16", None, None, None, None, False, True),
    "fp16_mixed": ("fp16", None, None, None, None, False, True),
    "bf16_with_nvfp4_mixed": ("bf16", None, None, "e2m1", "nvfp4", False, True),
}
_PRECISION_KEYS = ("precision.params_dtype", "precision.fp8", "precision.fp8_recipe", "precision.fp4",
                   "precision.fp4_recipe", "precision.fp8_param_gather", "optimizer.grad_reduce_in_fp32")


def _bridge_precision() -> Entry:
    def values(s: Source) -> dict:
        p = s.cfg.precision
        return dict(zip(_PRECISION_KEYS, (p.params_dtype, p.fp8, p.fp8_recipe if p.fp8 else None, p.fp4,
                                          p.fp4_recipe if p.fp4 else None, p.fp8_param_gather,
                                          s.cfg.optimizer.grad_reduce_in_fp32)))

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        want = tuple(v[k] for k in _PRECISION_KEYS)
        if want[0] == "fp32" and not any(want[1:6]):
            return [("mixed_precision", None), ("ddp.grad_reduce_in_fp32", want[6])]
        for name, fields in BRIDGE_PRECISION.items():
            if fields == want:
                return [("mixed_precision", name)]
        shown = " ".join(f"{k}={v[k]}" for k in _PRECISION_KEYS if v[k] not in (None, False))
        raise Unmapped(f"no Megatron-Bridge mixed-precision recipe equals precision={s.cfg.precision.name} "
                       f"({shown}); set cfg.mixed_precision in the recipe (registered: "
                       f"{', '.join(BRIDGE_PRECISION)}, and fp8 recipes that also keep FP8 weights)")

    def from_bridge(b: dict) -> dict | None:
        if "mixed_precision" not in b:
            return None
        name = b["mixed_precision"]
        if name is None:
            out = dict(zip(_PRECISION_KEYS, ("fp32", None, None, None, None, False, True)))
            if "ddp.grad_reduce_in_fp32" in b:
                out["optimizer.grad_reduce_in_fp32"] = b["ddp.grad_reduce_in_fp32"]
            return out
        if name not in BRIDGE_PRECISION:
            raise Refused(f"mixed_precision={name}: not a recipe moe_hydra maps (it maps {', '.join(BRIDGE_PRECISION)} "
                          "and null)")
        return dict(zip(_PRECISION_KEYS, BRIDGE_PRECISION[name]))

    # Megatron-LM side: none (the fields have their own entries)
    return custom(_PRECISION_KEYS, (), ("mixed_precision",), "precision", "Bridge: the mixed-precision recipe that "
                  "equals the precision preset", values=values, to_mlm=lambda v, s: [], from_mlm=lambda g: None,
                  to_bridge=to_bridge, from_bridge=from_bridge)


def _grad_reduce() -> Entry:
    key = "optimizer.grad_reduce_in_fp32"

    def values(s: Source) -> dict:
        return {key: s.cfg.optimizer.grad_reduce_in_fp32}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        # Megatron-LM (validate_args): bf16 reduces in fp32 unless --grad-reduce-in-bf16; fp16/fp32 only with
        # --accumulate-allreduce-grads-in-fp32
        if v[key]:
            return [["--accumulate-allreduce-grads-in-fp32"]]
        if s.cfg.precision.params_dtype == "bf16":
            return [["--grad-reduce-in-bf16"]]
        return []

    def from_mlm(g: Flags) -> dict:
        fp32, bf16 = g.switch("--accumulate-allreduce-grads-in-fp32"), g.switch("--grad-reduce-in-bf16")
        if fp32 and bf16:
            raise Refused("--accumulate-allreduce-grads-in-fp32 and --grad-reduce-in-bf16 together")
        if fp32 or bf16:
            return {key: fp32}
        main_grads = g.get("--main-grads-dtype", "fp32")
        return {key: g.switch("--bf16") and main_grads == "fp32"}

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        return [("ddp.grad_reduce_in_fp32", v[key])]

    return custom((key,), ("--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16"),
                  ("ddp.grad_reduce_in_fp32",), "optimizer", "the DDP gradient buffer in fp32", values=values,
                  to_mlm=to_mlm, from_mlm=from_mlm, to_bridge=to_bridge,
                  from_bridge=lambda b: _bridge_keys(b, ("ddp.grad_reduce_in_fp32", key)))


def _gqa() -> Entry:
    key = "model.num_query_groups"

    def values(s: Source) -> dict:
        return {key: s.cfg.model.num_query_groups}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        return [] if v[key] is None else [["--group-query-attention"], ["--num-query-groups", str(v[key])]]

    def from_mlm(g: Flags) -> dict:
        if not g.switch("--group-query-attention"):
            return {key: None}
        return {key: _int(g.get("--num-query-groups", "1"))}

    return custom((key,), ("--group-query-attention", "--num-query-groups"), ("model.num_query_groups",), "model",
                  "GQA groups (null = MHA)", values=values, to_mlm=to_mlm, from_mlm=from_mlm,
                  to_bridge=lambda v, s: [("model.num_query_groups", v[key])],
                  from_bridge=lambda b: _bridge_keys(b, ("model.num_query_groups", key)))


def _vocab() -> Entry:
    key = "model.vocab_size"

    def values(s: Source) -> dict:
        return {key: s.cfg.model.vocab_size}

    # NullTokenizer(vocab_size=n) adds the end-of-document token: n + 1 entries. --vocab-size V-1 gives V.
    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        return [["--tokenizer-type", "NullTokenizer"], ["--vocab-size", str(v[key] - 1)]]

    def from_mlm(g: Flags) -> dict | None:
        if g.get("--tokenizer-type") != "NullTokenizer":
            return None  # the vocabulary comes from a tokenizer file: the preset's stays (ingest says so)
        if not g.has("--vocab-size"):
            raise Refused("--tokenizer-type NullTokenizer needs --vocab-size")
        return {key: _int(g.one("--vocab-size")) + 1}

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        return [("tokenizer.tokenizer_type", "NullTokenizer"), ("tokenizer.vocab_size", v[key] - 1)]

    def from_bridge(b: dict) -> dict | None:
        if b.get("tokenizer.tokenizer_type") != "NullTokenizer" or "tokenizer.vocab_size" not in b:
            return None
        return {key: b["tokenizer.vocab_size"] + 1}

    return custom((key,), ("--tokenizer-type", "--vocab-size"), ("tokenizer.tokenizer_type", "tokenizer.vocab_size"),
                  "model", "vocabulary before padding: NullTokenizer with V-1 (it adds the end-of-document token)",
                  values=values, to_mlm=to_mlm, from_mlm=from_mlm, to_bridge=to_bridge, from_bridge=from_bridge)


_FREQ_LIST = re.compile(r"^\[\s*[01](\s*,\s*[01])*\s*\]$")


def _moe_layer_freq() -> Entry:
    key = "model.moe_layer_freq"

    def values(s: Source) -> dict | None:
        return {key: s.cfg.model.moe_layer_freq} if s.moe else None

    def text(x: Any) -> str:
        return "[" + ",".join(str(int(i)) for i in x) + "]" if isinstance(x, (list, tuple)) else str(x)

    def read(x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return [int(i) for i in x]
        x = str(x).strip()
        if x.isdigit():
            return int(x)
        if _FREQ_LIST.match(x):
            return [int(i) for i in x.strip("[]").split(",")]
        return x

    def from_mlm(g: Flags) -> dict | None:
        if not g.moe:
            return None
        return {key: read(g.one("--moe-layer-freq")) if g.has("--moe-layer-freq") else 1}

    return custom((key,), ("--moe-layer-freq",), ("model.moe_layer_freq",), "moe",
                  "which layers are MoE: N, a 0/1 list, or a pattern such as [0]*3+[1]*58", values=values,
                  to_mlm=lambda v, s: [["--moe-layer-freq", text(v[key])]], from_mlm=from_mlm,
                  to_bridge=lambda v, s: [("model.moe_layer_freq", v[key])],
                  from_bridge=lambda b: {key: read(b["model.moe_layer_freq"])} if "model.moe_layer_freq" in b else None)


def _activation() -> tuple[Entry, Entry]:
    """The gated linear unit and the activation. Megatron-LM says both with one flag: ``--swiglu`` (silu),
    ``--quick-geglu`` (quick_gelu), neither (gelu, ungated). Bridge takes ``gated_linear_unit``; its
    ``activation_func`` is a function (its GPT-OSS provider sets quick_gelu), which no override can name."""
    glu, act = "model.gated_linear_unit", "model.activation_func"

    def act_to_mlm(v: dict, s: Source) -> list[list[str]]:
        pair = (s.cfg.model.gated_linear_unit, activation_func(s.cfg.model))
        if pair == (True, "quick_gelu"):
            return [["--quick-geglu"]]
        if pair in ((True, "silu"), (False, "gelu")):
            return []  # --swiglu or its absence says it
        raise Unmapped(f"{act}={pair[1]} with {glu}={pair[0]}: {MEGATRON_LM} gates silu (--swiglu) or quick_gelu "
                       "(--quick-geglu), and otherwise runs gelu")

    def act_to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        if v[act] is None:
            return []
        raise Unmapped(f"{act}={v[act]}: Bridge's activation_func is a function (the model provider's)")

    gate = custom((glu,), ("--swiglu",), ("model.gated_linear_unit",), "model",
                  "gated linear unit (SwiGLU with silu); else GELU",
                  values=lambda s: {glu: s.cfg.model.gated_linear_unit},
                  to_mlm=lambda v, s: [["--swiglu"]] if v[glu] and activation_func(s.cfg.model) != "quick_gelu" else [],
                  from_mlm=lambda g: {glu: g.switch("--swiglu") or g.switch("--quick-geglu")},
                  to_bridge=lambda v, s: [("model.gated_linear_unit", v[glu])],
                  from_bridge=lambda b: _bridge_keys(b, ("model.gated_linear_unit", glu)))
    func = custom((act,), ("--quick-geglu",), (), "model", "activation: silu | gelu | quick_gelu (null: silu gated)",
                  values=lambda s: {act: s.cfg.model.activation_func}, to_mlm=act_to_mlm,
                  from_mlm=lambda g: {act: "quick_gelu" if g.switch("--quick-geglu") else None},
                  to_bridge=act_to_bridge, from_bridge=lambda b: None)
    return gate, func


def _bias_activation_fusion() -> Entry:
    """Megatron-LM fuses by default and turns it off with the flag of its activation: ``--no-bias-swiglu-fusion``
    with ``--swiglu``, else ``--no-bias-gelu-fusion`` (its core_transformer_config_from_args); Bridge takes the
    TransformerConfig field."""
    key, swiglu, gelu = "kernels.bias_activation_fusion", "--no-bias-swiglu-fusion", "--no-bias-gelu-fusion"

    def flag(runs_swiglu: bool) -> str:
        return swiglu if runs_swiglu else gelu

    return custom((key,), (swiglu, gelu), ("model.bias_activation_fusion",), "kernels",
                  "bias add and activation in one kernel",
                  values=lambda s: {key: s.cfg.kernels.bias_activation_fusion},
                  to_mlm=lambda v, s: [] if v[key] else [[flag(
                      s.cfg.model.gated_linear_unit and activation_func(s.cfg.model) == "silu")]],
                  from_mlm=lambda g: {key: not g.switch(flag(g.switch("--swiglu")))},
                  to_bridge=lambda v, s: [("model.bias_activation_fusion", v[key])],
                  from_bridge=lambda b: _bridge_keys(b, ("model.bias_activation_fusion", key)))


def _window() -> Entry:
    key = "model.window_size"

    def values(s: Source) -> dict:
        return {key: s.cfg.model.window_size}

    def from_mlm(g: Flags) -> dict:
        if not g.has("--window-size"):
            return {key: None}
        try:
            return {key: [int(i) for i in g.one("--window-size").strip("()").split(",")]}
        except ValueError:
            raise Refused(f"--window-size {g.one('--window-size')}: expected LEFT,RIGHT") from None

    return custom((key,), ("--window-size",), ("model.window_size",), "model", "sliding window [left, right]",
                  values=values,
                  to_mlm=lambda v, s: [] if v[key] is None else [["--window-size", ",".join(map(str, v[key]))]],
                  from_mlm=from_mlm, to_bridge=lambda v, s: [("model.window_size", v[key])],
                  from_bridge=lambda b: _bridge_keys(b, ("model.window_size", key)))


def _vpp() -> Entry:
    key = "parallel.virtual_pipeline_model_parallel_size"

    def values(s: Source) -> dict:
        return {key: s.r.layout.vpp}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        if v[key] is None or s.cfg.parallel.pipeline_model_parallel_layout is not None:
            return []  # a layout string implies VPP; Megatron-LM refuses both (L16)
        return [["--num-virtual-stages-per-pipeline-rank", str(v[key])]]

    def from_mlm(g: Flags) -> dict:
        pp = _int(g.get("--pipeline-model-parallel-size", "1"))
        given = [f for f in ("--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
                             "--pipeline-model-parallel-layout") if g.has(f)]
        if len(given) > 1:
            raise Refused(f"{' and '.join(given)} together: Megatron-LM takes one of them")
        if g.has("--num-virtual-stages-per-pipeline-rank"):
            return {key: _int(g.one("--num-virtual-stages-per-pipeline-rank"))}
        if g.has("--num-layers-per-virtual-pipeline-stage"):
            per, layers = _int(g.one("--num-layers-per-virtual-pipeline-stage")), _int(g.get("--num-layers", "0"))
            if per < 1 or layers % (pp * per):
                raise Refused(f"--num-layers-per-virtual-pipeline-stage {per}: --num-layers {layers} is not a "
                              f"multiple of PP {pp} x {per}")
            return {key: layers // pp // per}
        if g.has("--pipeline-model-parallel-layout"):
            try:
                stages = stage_count(g.one("--pipeline-model-parallel-layout"))
            except ValueError as e:
                raise Refused(f"--pipeline-model-parallel-layout: {e}") from None
            return {key: stages // pp if stages > pp and stages % pp == 0 else None}
        return {key: None}

    return custom((key,), ("--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage"),
                  ("model.virtual_pipeline_model_parallel_size",), "parallel",
                  "VPP: model chunks per pipeline rank (implied by a layout string)", values=values, to_mlm=to_mlm,
                  from_mlm=from_mlm, to_bridge=lambda v, s: [("model.virtual_pipeline_model_parallel_size", v[key])],
                  from_bridge=lambda b: _bridge_keys(b, ("model.virtual_pipeline_model_parallel_size", key)))


def _num_sms() -> Entry:
    key = "dispatcher.num_sms"
    names = ("--moe-deepep-num-sms", "--moe-hybridep-num-sms", "--moe-flex-dispatcher-num-sms")

    def field_of(s: Source) -> str:
        return s.mcore.flex_num_sms_field(s.cfg.dispatcher.moe_flex_dispatcher_backend)

    def values(s: Source) -> dict | None:
        return {key: s.cfg.dispatcher.num_sms} if s.flex else None

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        if v[key] is None:
            return []
        return [["--" + field_of(s).replace("_", "-"), str(v[key])]]

    def from_mlm(g: Flags) -> dict | None:
        if not g.flex:
            return None
        backend = g.get("--moe-flex-dispatcher-backend", "deepep")
        for flag in (f"--moe-{backend}-num-sms", "--moe-flex-dispatcher-num-sms"):
            if g.has(flag):
                return {key: _int(g.one(flag))}
        return {key: None}

    def bkey(s: Source) -> str:
        return "model." + field_of(s)

    def from_bridge(b: dict) -> dict | None:
        for name in ("moe_deepep_num_sms", "moe_hybridep_num_sms", "moe_flex_dispatcher_num_sms"):
            if f"model.{name}" in b:
                return {key: b[f"model.{name}"]}
        return None

    return custom((key,), names, tuple("model." + n[2:].replace("-", "_") for n in names), "moe",
                  "SMs of the flex dispatcher's kernels (the installed release's field)", values=values,
                  to_mlm=to_mlm, from_mlm=from_mlm, to_bridge=lambda v, s: [(bkey(s), v[key])],
                  from_bridge=from_bridge)


def _cuda_graph_scope() -> Entry:
    key = "kernels.cuda_graph_scope"
    choices = ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full")

    def name(s: Source) -> str:
        return s.mcore.cuda_graph_scope_field

    def values(s: Source) -> dict | None:
        return {key: list(s.cfg.kernels.cuda_graph_scope)} if _graphs(s) else None

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        bad = [x for x in v[key] if x not in choices]
        if bad:
            raise Unmapped(f"{key}={v[key]}: --cuda-graph-scope takes {', '.join(choices)} at {MEGATRON_LM}")
        return [["--" + name(s).replace("_", "-"), *v[key]]] if v[key] else []

    def from_mlm(g: Flags) -> dict | None:
        if not _ggraphs(g):
            return None
        for flag in ("--cuda-graph-scope", "--cuda-graph-modules"):
            if g.has(flag):
                return {key: list(g.vals(flag))}
        return {key: []}

    def from_bridge(b: dict) -> dict | None:
        for bk in ("model.cuda_graph_scope", "model.cuda_graph_modules"):
            if bk in b:
                return {key: list(b[bk] or [])}
        return None

    return custom((key,), ("--cuda-graph-scope", "--cuda-graph-modules"),
                  ("model.cuda_graph_scope", "model.cuda_graph_modules"), "kernels",
                  "what CUDA graphs capture (the installed release's field name)", values=values, to_mlm=to_mlm,
                  from_mlm=from_mlm, to_bridge=lambda v, s: [("model." + name(s), v[key])], from_bridge=from_bridge)


def _paths(x: Any) -> list[str]:
    return [str(i) for i in (x if isinstance(x, (list, tuple)) else [x])]


def _data() -> Entry:
    keys = ("data.kind", "data.path")

    def values(s: Source) -> dict:
        return {"data.kind": s.cfg.data.kind, "data.path": s.cfg.data.path}

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        if v["data.kind"] == "mock":
            if v["data.path"]:
                raise Unmapped(f"data.path={v['data.path']} with data.kind=mock: --mock-data reads no path")
            return [["--mock-data"]]
        if v["data.kind"] == "megatron" and v["data.path"]:
            return [["--data-path", *_paths(v["data.path"])]]
        raise Unmapped(f"data.kind={v['data.kind']}: no Megatron-LM data flag for it")

    def from_mlm(g: Flags) -> dict:
        mock, paths = g.switch("--mock-data"), g.vals("--data-path") if g.has("--data-path") else []
        if mock and paths:
            raise Refused("--mock-data and --data-path together")
        if paths:
            return {"data.kind": "megatron", "data.path": list(paths)}
        if mock:
            return {"data.kind": "mock", "data.path": None}
        raise Refused("no --mock-data and no --data-path: say which data the run reads")

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        if v["data.kind"] == "mock":
            return [("dataset.blend", None)]
        if v["data.kind"] == "megatron" and v["data.path"]:
            return [("dataset.blend", [_paths(v["data.path"]), None])]
        raise Unmapped(f"data.kind={v['data.kind']}: no Megatron-Bridge dataset override for it")

    def from_bridge(b: dict) -> dict | None:
        if "dataset.blend" not in b:
            return None
        blend = b["dataset.blend"]
        if blend is None:
            return {"data.kind": "mock", "data.path": None}
        if blend[1]:
            raise Refused("dataset.blend with weights: give data.path as Megatron's [w, prefix, ...] instead")
        return {"data.kind": "megatron", "data.path": _paths(blend[0])}

    return custom(keys, ("--mock-data", "--data-path"), ("dataset.blend",), "data",
                  "mock tokens, or a Megatron indexed dataset's --data-path (prefixes, or weights and prefixes)",
                  values=values, to_mlm=to_mlm, from_mlm=from_mlm, to_bridge=to_bridge, from_bridge=from_bridge)


def _real(s: Source) -> bool:
    return s.cfg.data.kind == "megatron"


def _greal(g: Flags) -> bool:
    return g.has("--data-path")


def _lr() -> Entry:
    key = "optimizer.lr"

    def to_mlm(v: dict, s: Source) -> list[list[str]]:
        # moe_hydra trains at a constant learning rate
        return [["--lr", fmt(v[key])], ["--min-lr", fmt(v[key])], ["--lr-decay-style", "constant"]]

    def from_mlm(g: Flags) -> dict:
        if not g.has("--lr"):
            raise Refused("no --lr: Megatron-LM needs a learning rate")
        return {key: _float(g.one("--lr"))}

    return custom((key,), ("--lr", "--min-lr", "--lr-decay-style"), ("optimizer.lr", "optimizer.min_lr",
                                                                     "scheduler.lr_decay_style"), "optimizer",
                  "a constant learning rate (--min-lr = --lr, --lr-decay-style constant)",
                  values=lambda s: {key: s.cfg.optimizer.lr}, to_mlm=to_mlm, from_mlm=from_mlm,
                  to_bridge=lambda v, s: [("optimizer.lr", v[key]), ("optimizer.min_lr", v[key]),
                                          ("scheduler.lr_decay_style", "constant")],
                  from_bridge=lambda b: _bridge_keys(b, ("optimizer.lr", key)))


def _distributed_optimizer() -> Entry:
    key = "optimizer.use_distributed_optimizer"

    def from_bridge(b: dict) -> dict | None:
        given = {b[k] for k in ("optimizer.use_distributed_optimizer", "ddp.use_distributed_optimizer") if k in b}
        if len(given) > 1:
            raise Refused("optimizer.use_distributed_optimizer and ddp.use_distributed_optimizer differ")
        return {key: given.pop()} if given else None

    e = switch(key, "--use-distributed-optimizer", None, group="optimizer", doc="shard the optimizer state")
    return custom(e.keys, e.flags, ("optimizer.use_distributed_optimizer", "ddp.use_distributed_optimizer"),
                  "optimizer", e.doc, values=e.values, to_mlm=e.to_mlm, from_mlm=e.from_mlm,
                  to_bridge=lambda v, s: [("optimizer.use_distributed_optimizer", v[key]),
                                          ("ddp.use_distributed_optimizer", v[key])],
                  from_bridge=from_bridge)


def _overlap_p2p() -> Entry:
    """Megatron-LM's flag keeps the setting (its validate_args applies it to interleaved schedules only); Bridge's
    model fields take what Megatron-Core runs, as the job passes them (moe_hydra.job.mcore_args)."""
    key = "overlap.overlap_p2p_comm"
    e = switch(key, "--no-overlap-p2p-communication", None, on=False, group="overlap",
               doc="interleaved-PP p2p overlap (batched p2p is its negation)")

    def to_bridge(v: dict, s: Source) -> list[tuple[str, Any]]:
        run = v[key] and s.r.layout.vpp is not None
        return [("model.overlap_p2p_comm", run), ("model.batch_p2p_comm", not run)]

    def from_bridge(b: dict) -> dict | None:
        if b.get("model.virtual_pipeline_model_parallel_size") is None or "model.overlap_p2p_comm" not in b:
            return None  # outside the interleaved schedule the setting does not run: the preset's stays
        return {key: b["model.overlap_p2p_comm"]}

    return custom(e.keys, e.flags, ("model.overlap_p2p_comm", "model.batch_p2p_comm"), "overlap", e.doc,
                  values=e.values, to_mlm=e.to_mlm, from_mlm=e.from_mlm, to_bridge=to_bridge, from_bridge=from_bridge)


def _train_iters() -> Entry:
    key = "train.train_iters"
    return value(key, bridge="train", required=True, group="train", doc="steps to run")


def _layout(name: str, attr: str, doc: str, absent: Any = 1) -> Entry:
    key = f"parallel.{name}"
    return value(key, get=lambda s: getattr(s.r.layout, attr), absent=absent, group="parallel", doc=doc)


def _batch(name: str, attr: str, flag: str, bridge: str, doc: str) -> Entry:
    return value(f"train.{name}", flag, bridge, get=lambda s: getattr(s.r.batch, attr), required=True, group="train",
                 doc=doc)


# ----------------------------------------------------------------------------- flags written with one value

# (flag, the value export writes, what ingest does with another value: "refuse" or "note", why)
FIXED = (
    ("--hidden-dropout", "0.0", "refuse", "moe_hydra's job runs without dropout"),
    ("--attention-dropout", "0.0", "refuse", "moe_hydra's job runs without dropout"),
    ("--eval-iters", "0", "note", "moe_hydra's job does not evaluate"),
)
# Flags export never writes whose values ingest checks against what moe_hydra plans: (flag, accepted values, why)
CHECKED: tuple[tuple[str, tuple[str, ...], str], ...] = ()
# Bridge keys export writes with one value (the job's), and what ingest does with another
BRIDGE_FIXED = (("model.hidden_dropout", 0.0, "refuse"), ("model.attention_dropout", 0.0, "refuse"),
                ("train.eval_iters", 0, "note"))


# ----------------------------------------------------------------------------- the table

TABLE: tuple[Entry, ...] = (
    *_launcher(),
    # --- both meshes (the resolved layout)
    _layout("tensor_model_parallel_size", "tp", "TP"),
    _layout("pipeline_model_parallel_size", "pp", "PP"),
    _vpp(),
    value("parallel.pipeline_model_parallel_layout", bridge="model", type=str, group="parallel",
          doc="the stage string (E embedding, t layer, m MTP, L loss)"),
    value("parallel.num_layers_in_first_pipeline_stage", "--decoder-first-pipeline-num-layers", group="parallel",
          doc="uneven first stage"),
    value("parallel.num_layers_in_last_pipeline_stage", "--decoder-last-pipeline-num-layers", group="parallel",
          doc="uneven last stage"),
    switch("parallel.account_for_embedding_in_pipeline_split", group="parallel", doc="embedding counted as a layer"),
    switch("parallel.account_for_loss_in_pipeline_split", group="parallel", doc="loss counted as a layer"),
    _layout("context_parallel_size", "cp", "CP"),
    value("parallel.cp_comm_type", type=str, listed=False, when=_cp, gwhen=_gcp, absent="p2p",
          choices=("p2p", "a2a", "all_gather", "a2a+p2p"), group="parallel", doc="CP communication (CP > 1)"),
    value("parallel.hierarchical_context_parallel_sizes", listed=True, group="parallel",
          doc="hierarchical CP sizes"),
    switch("parallel.sequence_parallel", get=lambda s: s.r.layout.sp, group="parallel", doc="SP"),
    _layout("expert_model_parallel_size", "ep", "EP"),
    _layout("expert_tensor_parallel_size", "etp", "ETP (as resolved: null = TP)", absent=None),
    switch("parallel.use_tp_pp_dp_mapping", bridge="dist", group="parallel", doc="rank order tp-cp-ep-pp-dp"),
    # --- model shape
    _transformer_impl(),
    value("model.num_layers", required=True, group="model", doc="transformer layers"),
    value("model.hidden_size", required=True, group="model", doc="hidden width"),
    value("model.ffn_hidden_size", absent=_default_ffn, group="model", doc="dense MLP width"),
    value("model.num_attention_heads", required=True, group="model", doc="attention heads"),
    _gqa(),
    value("model.kv_channels", group="model", doc="per-head dimension (null = hidden / heads)"),
    _vocab(),
    value("model.make_vocab_size_divisible_by", bridge=None, absent=128, group="model",
          doc="vocabulary padding multiple (Bridge: the provider's)"),
    value("model.max_position_embeddings", bridge=None, absent=lambda g: _int(g.get("--seq-length", "0")) or None,
          group="model", doc="position table size (Bridge: the provider's)"),
    value("model.normalization", type=str, absent="LayerNorm", choices=("LayerNorm", "RMSNorm"), group="model",
          doc="RMSNorm | LayerNorm"),
    *_activation(),
    value("model.activation_func_clamp_value", type=float, when=lambda s: s.cfg.model.activation_func_clamp_value
          is not None, group="model", doc="clamped GLU: the gate's maximum, the linear half's +-bound"),
    value("model.glu_linear_offset", type=float, when=lambda s: s.cfg.model.glu_linear_offset != 0.0, absent=0.0,
          group="model", doc="added to the GLU's linear half"),
    switch("model.add_bias_linear", "--disable-bias-linear", on=False, group="model", doc="linear biases"),
    switch("model.add_qkv_bias", group="model", doc="QKV bias"),
    switch("model.qk_layernorm", group="model", doc="QK layernorm"),
    switch("model.untie_embeddings_and_output_weights", bridge=None, group="model",
           doc="untied output layer (Bridge: the provider's share_embeddings_and_output_weights)"),
    value("model.position_embedding_type", type=str, bridge=None, absent="learned_absolute",
          choices=("learned_absolute", "rope", "mrope", "relative", "none"), group="model",
          doc="position embedding (Bridge: the provider's)"),
    value("model.rotary_base", bridge=None, when=_rope, gwhen=_grope, absent=10000, group="model",
          doc="RoPE base (rope only; Bridge: the provider's)"),
    _window(),
    value("model.window_attn_skip_freq", group="model", doc="full-attention layer frequency under a window"),
    value("model.mtp_num_layers", group="model", doc="multi-token-prediction blocks"),
    # --- multi-latent attention
    switch("model.multi_latent_attention", group="mla", doc="MLA"),
    value("model.q_lora_rank", when=_mla, gwhen=_gmla, group="mla", doc="query latent (null = none)"),
    value("model.kv_lora_rank", when=_mla, gwhen=_gmla, absent=32, group="mla", doc="key/value latent"),
    value("model.qk_head_dim", when=_mla, gwhen=_gmla, absent=128, group="mla", doc="q/k head dim without RoPE"),
    value("model.qk_pos_emb_head_dim", when=_mla, gwhen=_gmla, absent=64, group="mla", doc="RoPE part"),
    value("model.v_head_dim", when=_mla, gwhen=_gmla, absent=128, group="mla", doc="value head dim"),
    # --- MoE
    value("model.num_moe_experts", "--num-experts", when=_moe, gwhen=_gmoe, group="moe", doc="routed experts"),
    value("model.moe_ffn_hidden_size", when=_moe, gwhen=_gmoe, group="moe", doc="per-expert width (null = ffn)"),
    value("model.moe_router_topk", when=_moe, gwhen=_gmoe, absent=2, group="moe", doc="experts per token"),
    value("model.moe_shared_expert_intermediate_size", when=_moe, gwhen=_gmoe, group="moe",
          doc="shared experts' total width"),
    switch("model.moe_shared_expert_gate", when=_moe, gwhen=_gmoe, group="moe", doc="shared-expert gate"),
    _moe_layer_freq(),
    value("model.moe_router_score_function", type=str, when=_moe, gwhen=_gmoe, absent="softmax",
          choices=("softmax", "sigmoid"), group="moe", doc="router score"),
    switch("model.moe_router_pre_softmax", when=_moe, gwhen=_gmoe, group="moe", doc="softmax before top-k"),
    value("model.moe_router_num_groups", when=_moe, gwhen=_gmoe, group="moe", doc="routing groups"),
    value("model.moe_router_group_topk", when=_moe, gwhen=_gmoe, group="moe", doc="groups per token"),
    value("model.moe_router_topk_scaling_factor", type=float, when=_moe, gwhen=_gmoe, group="moe",
          doc="routed-weight scale"),
    switch("model.moe_router_enable_expert_bias", when=_moe, gwhen=_gmoe, group="moe", doc="aux-loss-free bias"),
    value("model.moe_router_load_balancing_type", type=str, when=_moe, gwhen=_gmoe, absent="aux_loss",
          choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"), group="moe",
          doc="balancing"),
    value("model.moe_aux_loss_coeff", type=float, when=_moe, gwhen=_gmoe, absent=0.0, group="moe",
          doc="balancing-loss weight"),
    value("dispatcher.moe_token_dispatcher_type", type=str, when=_moe, gwhen=_gmoe, absent="allgather",
          choices=("allgather", "alltoall", "flex"), group="moe", doc="token dispatcher"),
    value("dispatcher.moe_flex_dispatcher_backend", type=str, when=_flex, gwhen=_gflex, absent="deepep",
          choices=("deepep", "hybridep"), group="moe", doc="flex backend"),
    _num_sms(),
    switch("routing.moe_router_force_load_balancing", when=_moe, gwhen=_gmoe, group="moe",
           doc="forced balance (benchmark-only)"),
    value("routing.moe_expert_capacity_factor", type=float, when=_moe, gwhen=_gmoe, group="moe",
          doc="token drop capacity (null = dropless)"),
    switch("routing.moe_pad_expert_input_to_capacity", when=_moe, gwhen=_gmoe, group="moe", doc="drop-and-pad"),
    value("routing.moe_token_drop_policy", type=str, when=_moe, gwhen=_gmoe, absent="probs",
          choices=("probs", "position"), group="moe", doc="which tokens drop"),
    value("routing.moe_router_dtype", type=str, when=_moe, gwhen=_gmoe, choices=("fp32", "fp64"), group="moe",
          doc="router precision"),
    switch("routing.moe_router_padding_for_quantization", when=_moe, gwhen=_gmoe, group="moe",
           doc="routing maps padded for fp8/fp4"),
    switch("kernels.moe_grouped_gemm", when=_moe, gwhen=_gmoe, group="moe", doc="grouped-GEMM experts"),
    switch("kernels.moe_permute_fusion", when=_moe, gwhen=_gmoe, group="moe", doc="fused permutation"),
    switch("kernels.moe_router_fusion", when=_moe, gwhen=_gmoe, group="moe", doc="fused router"),
    switch("overlap.moe_shared_expert_overlap", when=_moe, gwhen=_gmoe, group="moe",
           doc="shared experts under the dispatch"),
    # --- precision
    _precision(),
    value("precision.fp8", "--fp8-format", bridge=None, type=str, choices=("e4m3", "hybrid"), group="precision",
          doc="fp8 format"),
    value("precision.fp8_recipe", bridge=None, type=str, when=_fp8, gwhen=_gfp8, absent="delayed",
          choices=("tensorwise", "delayed", "mxfp8", "blockwise"), group="precision", doc="fp8 scaling recipe"),
    value("precision.fp4", "--fp4-format", bridge=None, type=str, choices=("e2m1",), group="precision",
          doc="fp4 format"),
    value("precision.fp4_recipe", bridge=None, type=str, when=_fp4, gwhen=_gfp4, absent="nvfp4",
          choices=("nvfp4",), group="precision", doc="fp4 recipe"),
    switch("precision.fp8_param_gather", bridge=None, group="precision", doc="FP8 weights (Megatron-Core fp8_param)"),
    _bridge_precision(),
    # --- recompute, offload
    value("recompute.recompute_granularity", type=str, choices=("full", "selective"), group="recompute",
          doc="null | selective | full"),
    value("recompute.recompute_method", type=str, choices=("uniform", "block"), group="recompute",
          doc="full recompute's method"),
    value("recompute.recompute_num_layers", group="recompute", doc="layers per recompute group"),
    value("recompute.recompute_modules", type=str, listed=True, group="recompute", doc="selective modules"),
    switch("offload.fine_grained_activation_offloading", group="offload", doc="activation offloading"),
    value("offload.offload_modules", type=str, listed=True, absent=[], group="offload", doc="offloaded modules"),
    switch("offload.optimizer_cpu_offload", bridge="optimizer", group="offload", doc="optimizer state on the host"),
    value("offload.optimizer_offload_fraction", bridge="optimizer", type=float, when=_offload, gwhen=_goffload,
          absent=1.0, group="offload", doc="fraction on the host (with the optimizer offload)"),
    # --- kernels, overlap
    value("kernels.cuda_graph_impl", type=str, absent="none", choices=("none", "local", "transformer_engine"),
          group="kernels", doc="CUDA graphs (full_iteration: no such choice at core_v0.16.1)"),
    _cuda_graph_scope(),
    value("kernels.attention_backend", type=str, absent="auto", choices=ATTENTION_BACKENDS,
          group="kernels", doc="attention kernels: TE's fused (auto, flash, fused) or unfused, or Megatron-Core's local"),
    _bias_activation_fusion(),
    switch("overlap.overlap_grad_reduce", bridge="ddp", group="overlap", doc="DP gradient reduce overlap"),
    value("overlap.bucket_size", "--ddp-bucket-size", bridge="ddp", group="overlap",
          doc="elements per DP gradient bucket (with the reduce overlap)"),
    switch("overlap.overlap_param_gather", bridge="ddp", group="overlap", doc="parameter all-gather overlap"),
    switch("overlap.tp_comm_overlap", group="overlap", doc="TP communication overlap"),
    _overlap_p2p(),
    switch("overlap.overlap_moe_expert_parallel_comm", group="overlap", doc="EP all-to-all overlap"),
    switch("overlap.delay_wgrad_compute", group="overlap", doc="weight-gradient split"),
    # --- optimizer
    value("optimizer.optimizer", bridge="optimizer", type=str, absent="adam",
          choices=("adam", "sgd", "muon", "dist_muon"), group="optimizer", doc="optimizer"),
    _lr(),
    value("optimizer.weight_decay", bridge="optimizer", type=float, absent=0.01, group="optimizer", doc="decay"),
    value("optimizer.clip_grad", bridge="optimizer", type=float, absent=1.0, group="optimizer", doc="clip norm"),
    _distributed_optimizer(),
    value("optimizer.num_distributed_optimizer_instances", bridge="ddp", absent=1, group="optimizer",
          doc="partial DistOpt shard factor"),
    switch("optimizer.use_precision_aware_optimizer", bridge="optimizer", group="optimizer",
           doc="precision-aware optimizer"),
    value("optimizer.main_grads_dtype", bridge=None, type=str, when=_pao, gwhen=_gpao, absent="fp32",
          choices=("fp32", "bf16"), group="optimizer", doc="main grads (precision-aware)"),
    value("optimizer.main_params_dtype", bridge=None, type=str, when=_pao, gwhen=_gpao, absent="fp32",
          choices=("fp32", "fp16"), group="optimizer", doc="main params (precision-aware)"),
    value("optimizer.exp_avg_dtype", bridge=None, type=str, when=_pao, gwhen=_gpao, absent="fp32",
          choices=("fp32", "fp16", "bf16", "fp8"), group="optimizer", doc="Adam m (precision-aware)"),
    value("optimizer.exp_avg_sq_dtype", bridge=None, type=str, when=_pao, gwhen=_gpao, absent="fp32",
          choices=("fp32", "fp16", "bf16", "fp8"), group="optimizer", doc="Adam v (precision-aware)"),
    _grad_reduce(),
    # --- batch, sequence, steps, seed, data
    _batch("micro_batch_size", "micro_batch_size", "--micro-batch-size", "train", "sequences per micro-batch"),
    _batch("global_batch_size", "global_batch_size", "--global-batch-size", "train", "sequences per step"),
    _batch("seq_length", "seq_length", "--seq-length", "dataset.sequence_length", "tokens per sequence"),
    _train_iters(),
    value("train.log_interval", bridge="logger", absent=100, group="train", doc="metrics line every N steps"),
    # --seed is Megatron-LM's one seed, the data order's too (GPTDatasetConfig.random_seed = args.seed); data.seed
    # has no flag of its own: the comment line keeps it, and a command without one reads it as --seed (ingest)
    value("seed", bridge="rng.seed", absent=1234, group="train", doc="the run's seed (also the data order's)"),
    custom(("data.seed",), (), ("dataset.random_seed",), "data", "the data order's seed (Bridge)",
           values=lambda s: {"data.seed": s.cfg.data.seed}, to_mlm=lambda v, s: [], from_mlm=lambda g: None,
           to_bridge=lambda v, s: [("dataset.random_seed", v["data.seed"])],
           from_bridge=lambda b: _bridge_keys(b, ("dataset.random_seed", "data.seed"))),
    _data(),
    # absent: validate_args' legacy default, "969, 30, 1" (the same shares as moe_hydra's default)
    value("data.split", bridge="dataset", type=str, when=_real, gwhen=_greal, absent=lambda g: "969,30,1",
          group="data", doc="train,valid,test shares (real data)"),
    value("data.path_to_cache", "--data-cache-path", bridge="dataset", type=str, when=_real, gwhen=_greal,
          group="data", doc="the sample-index cache (real data)"),
    switch("data.mmap_bin_files", "--no-mmap-bin-files", bridge="dataset", on=False, when=_real, gwhen=_greal,
           group="data", doc="read the .bin through mmap (real data)"),
)

# What a Megatron-LM command may carry that changes nothing moe_hydra plans or measures: accepted by ingest and
# listed on stderr, never mapped. Everything else the table does not read is refused.
NOTED_PREFIXES = ("--log-", "--tensorboard-", "--wandb-", "--lr-warmup-", "--lr-wsd-", "--lr-decay-", "--ckpt-",
                  "--profile", "--one-logger", "--save-", "--load-", "--exit-", "--timing-log-",
                  "--non-persistent-")
NOTED = frozenset({
    # checkpoints
    "--save", "--load", "--no-save-optim", "--no-save-rng", "--no-load-optim", "--no-load-rng", "--finetune",
    "--pretrained-checkpoint", "--async-save", "--dist-ckpt-strictness", "--auto-detect-ckpt-format",
    "--use-dist-ckpt", "--use-checkpoint-args", "--no-ckpt-fully-parallel-save",
    # logging, profiling, evaluation
    "--tensorboard-dir", "--no-one-logger", "--record-memory-history", "--memory-snapshot-path",
    "--use-pytorch-profiler", "--eval-interval", "--logging-level",
    # the learning-rate schedule and optimizer constants (moe_hydra trains at a constant rate)
    "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std", "--start-weight-decay",
    "--end-weight-decay", "--weight-decay-incr-style", "--override-opt_param-scheduler",
    "--use-checkpoint-opt_param-scheduler",
    # data plumbing
    "--num-workers", "--dataloader-type", "--tokenizer-model", "--vocab-file", "--merge-file",
    "--no-create-attention-mask-in-dataloader",
    # runtime
    "--distributed-timeout-minutes", "--distributed-backend", "--use-mcore-models", "--use-cpu-initialization",
})
# torchrun options besides --nnodes and --nproc-per-node (rendezvous and supervision): noted
TORCHRUN_NOTED = ("--node-rank", "--master-addr", "--master-port", "--rdzv-", "--max-restarts", "--standalone",
                  "--redirects", "--tee", "--log-dir", "--monitor-interval", "--role", "--start-method", "--local-addr",
                  "--local-ranks-filter", "--no-python", "--run-path", "--module")


def noted(flag: str) -> bool:
    return flag in NOTED or flag.startswith(NOTED_PREFIXES)


def torchrun_noted(flag: str) -> bool:
    return flag.startswith(TORCHRUN_NOTED)


@functools.lru_cache(maxsize=1)
def entry_flags() -> frozenset[str]:
    """Every Megatron-LM flag the table reads (launcher options excluded), and the fixed ones."""
    return frozenset({f for e in TABLE if not e.launcher for f in e.flags} | {f for f, _, _, _ in FIXED}
                     | {f for f, _, _ in CHECKED})


@functools.lru_cache(maxsize=1)
def bridge_keys() -> frozenset[str]:
    return frozenset({k for e in TABLE for k in e.bkeys} | {k for k, _, _ in BRIDGE_FIXED})


def _check() -> None:
    """The table's own consistency: no key written by two entries, no flag read by two (done at import)."""
    seen: dict[str, str] = {}
    for e in TABLE:
        if e.keys == _PRECISION_KEYS:
            continue  # Bridge's recipe covers the precision fields the Megatron-LM entries map one by one
        for k in e.keys:
            assert k not in seen, f"{k} is mapped twice"
            seen[k] = e.group
    flags = [f for e in TABLE for f in e.flags]
    assert len(flags) == len(set(flags)), sorted({f for f in flags if flags.count(f) > 1})


_check()
