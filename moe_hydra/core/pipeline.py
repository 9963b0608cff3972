"""Which decoder layers, embedding, loss and MTP blocks each pipeline rank holds.

Follows Megatron-Core's three ways of splitting a model over PP (x VPP):
an explicit ``pipeline_model_parallel_layout`` string, uneven first/last stages
(``num_layers_in_first/last_pipeline_stage``), or an even split in which the embedding and the
loss may each count as one layer (``account_for_*_in_pipeline_split``). Virtual stage i lives on
pipeline rank i % PP. MTP blocks sit on the last stage unless a layout string places them.

Pure: standard library only. Callers check divisibility first (:mod:`moe_hydra.planning.rules`);
:func:`assign` raises ``ValueError`` on a split it cannot make.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_GROUP = re.compile(r"\(([^()]*)\)\s*\*\s*(\d+)")
_CHAR = re.compile(r"([EtmL])\s*\*\s*(\d+)")
_ALLOWED = set("EtmL|")


def expand_layout(layout: str) -> list[str]:
    """``"Et|(tt|)*30mL"`` -> ``["Et", "tt", ..., "mL"]`` (one string per virtual stage)."""
    return list(_expand(layout))


def stage_count(layout: str) -> int:
    """The number of virtual stages of a layout string."""
    return len(_expand(layout))


@lru_cache(maxsize=1024)
def _expand(layout: str) -> tuple[str, ...]:
    text = layout.replace(" ", "")
    while True:
        new = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), text)
        if new == text:
            break
        text = new
    text = _CHAR.sub(lambda m: m.group(1) * int(m.group(2)), text)
    bad = set(text) - _ALLOWED
    if bad:
        raise ValueError(
            f"pipeline layout {layout!r}: unknown symbols {sorted(bad)} "
            "(E embedding, t layer, m MTP, L loss, | stage boundary, (...)*n repeat)"
        )
    return tuple(text.split("|"))


@dataclass(frozen=True, slots=True)
class RankLayers:
    """What one pipeline rank holds, over all its virtual chunks."""

    pp_rank: int
    layers: tuple[int, ...]  # global decoder-layer indices
    embedding: bool
    loss: bool
    mtp: int
    mask: int = 0  # the layers as bits (bit i = layer i)


def _even(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what}: {total} is not divisible by {parts}")
    return total // parts


def virtual_stage_sizes(
    num_layers: int,
    pp: int,
    vpp: int,
    first: int | None = None,
    last: int | None = None,
    account_embedding: bool = False,
    account_loss: bool = False,
) -> list[int]:
    """Decoder layers in each of the PP x VPP virtual stages, in stage order."""
    stages = pp * vpp
    if first is not None or last is not None:
        middle_layers = num_layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        per_stage = [None] * pp
        if first is not None:
            per_stage[0] = first
        if last is not None:
            per_stage[-1] = last
        each = _even(middle_layers, middle_stages, "layers of the middle stages") if middle_stages else 0
        if not middle_stages and middle_layers:
            raise ValueError(f"{middle_layers} layers left over for no middle stage")
        per_rank = [each if n is None else n for n in per_stage]
        sizes = [0] * stages
        for r, n in enumerate(per_rank):
            chunk = _even(n, vpp, f"layers of pipeline stage {r} over VPP")
            for v in range(vpp):
                sizes[v * pp + r] = chunk
        return sizes
    slots = num_layers + account_embedding + account_loss
    each = _even(slots, stages, "layers (+ accounted embedding/loss) over PP x VPP")
    sizes = [each] * stages
    if account_embedding:
        sizes[0] -= 1
    if account_loss:
        sizes[-1] -= 1
    return sizes


@lru_cache(maxsize=4096)
def assign(
    num_layers: int,
    mtp: int,
    pp: int,
    vpp: int | None = None,
    layout: str | None = None,
    first: int | None = None,
    last: int | None = None,
    account_embedding: bool = False,
    account_loss: bool = False,
) -> tuple[RankLayers, ...]:
    """Per pipeline rank: its decoder layers, and whether it holds embedding, loss, MTP (cached: the layout
    search asks for the same splits many times; the result is immutable)."""
    if layout is not None:
        stages = expand_layout(layout)
        if len(stages) % pp:
            raise ValueError(f"pipeline layout has {len(stages)} stages, not a multiple of PP={pp}")
        counts = [s.count("t") for s in stages]
        if sum(counts) != num_layers:
            raise ValueError(f"pipeline layout places {sum(counts)} layers, the model has {num_layers}")
        flags = [("E" in s, "L" in s, s.count("m")) for s in stages]
    else:
        counts = virtual_stage_sizes(num_layers, pp, vpp or 1, first, last, account_embedding, account_loss)
        flags = [(i == 0, i == len(counts) - 1, mtp if i == len(counts) - 1 else 0) for i in range(len(counts))]
    ranks: list[dict] = [dict(layers=[], embedding=False, loss=False, mtp=0) for _ in range(pp)]
    start = 0
    for i, n in enumerate(counts):
        r = ranks[i % pp]
        r["layers"] += range(start, start + n)
        start += n
        emb, loss, m = flags[i]
        r["embedding"] |= emb
        r["loss"] |= loss
        r["mtp"] += m
    return tuple(RankLayers(i, tuple(r["layers"]), r["embedding"], r["loss"], r["mtp"], sum(1 << j for j in r["layers"]))
                 for i, r in enumerate(ranks))
