"""Parameter counts: total, active per token, and per rank for a layout.

Counts what Megatron-Core's ``GPTModel`` allocates: per layer the attention projections (GQA or
MLA), two norms, a dense MLP or a MoE block (router, routed experts, shared experts), then the
embedding (plus a learned position embedding, if any), the final norm and the output layer, and each MTP block (two norms, the 2h -> h
projection, one layer of the last layer's type, its own final norm). A pipeline stage holding MTP
blocks holds its own copy of the embedding; with MTP the final norm sits with the last decoder layer.

Per rank, Megatron's sharding applies: attention, dense MLP, shared experts, embedding and output
layer over TP (the vocabulary padded to a multiple of 128 x TP); routed experts over EP (whole
experts) and ETP (within an expert); norms, router and MLA down-projections replicated (Transformer
Engine spec); layers over the pipeline ranks as :mod:`moe_hydra.core.pipeline` assigns them. With tied
embeddings and PP > 1 the last stage holds its own copy of the output weight.

Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from moe_hydra.core.arch import Arch
from moe_hydra.core.columns import SCALARS
from moe_hydra.core.layout import Layout
from moe_hydra.core.pipeline import RankLayers, assign


@dataclass(frozen=True, slots=True)
class RankParams:
    """Parameters held by one rank of one pipeline stage."""

    pp_rank: int
    layers: int
    dense: int  # everything but routed experts (TP-sharded or replicated)
    expert: int  # routed experts on this rank

    @property
    def total(self) -> int:
        return self.dense + self.expert


class _Counter:
    """Per-rank parameter arithmetic for one architecture and one (TP, ETP, local experts)."""

    def __init__(self, a: Arch, tp: int, etp: int, local_experts: int, te_spec: bool = True):
        self.a, self.tp, self.etp, self.local_experts = a, tp, etp, local_experts
        self.down = 1 if te_spec else tp  # MLA down-projection shards
        self._layers: dict[bool, tuple[int, int]] = {}
        self.norm = 1 if a.rmsnorm else 2  # RMSNorm: weight; LayerNorm: weight + bias

    def attention(self) -> int:
        a, tp, nrm = self.a, self.tp, self.norm
        h = a.h
        if a.mla:
            n, qk, pe, v, down = a.heads, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim, self.down
            latent_norm = nrm if a.qk_norm else 0
            if a.q_lora_rank is None:
                q = h * n * (qk + pe) // tp
            else:
                ql = a.q_lora_rank
                q = h * ql // down + ql * latent_norm + ql * n * (qk + pe) // tp
            kvl = a.kv_lora_rank
            kv = h * (kvl + pe) // down + kvl * latent_norm + kvl * n * (qk + v) // tp
            return q + kv + n * v * h // tp + (h if a.bias else 0)
        qkv = a.q_width + 2 * a.kv_width
        p = h * qkv // tp + a.q_width * h // tp
        if a.qkv_bias:
            p += qkv // tp
        if a.bias:
            p += h  # the row-parallel output bias is not sharded
        if a.qk_norm:
            p += 2 * a.head_dim * nrm
        return p

    def mlp(self, width: int, shards: int) -> int:
        """One MLP of ``width`` split ``shards`` ways (fc1 column-, fc2 row-parallel)."""
        a = self.a
        fc1_out = width * (2 if a.glu else 1)
        p = a.h * fc1_out // shards + width * a.h // shards
        if a.bias:
            p += fc1_out // shards + a.h
        return p

    def layer(self, moe: bool) -> tuple[int, int]:
        """(dense, expert) parameters of one decoder layer on this rank."""
        if moe not in self._layers:
            self._layers[moe] = self._layer(moe)
        return self._layers[moe]

    def _layer(self, moe: bool) -> tuple[int, int]:
        a = self.a
        dense = self.attention() + 2 * a.h * self.norm
        if not moe:
            return dense + self.mlp(a.ffn, self.tp), 0
        dense += a.h * a.experts + (a.experts if a.bias else 0)  # router
        if a.shared_ffn:
            dense += self.mlp(a.shared_ffn, self.tp) + (a.h if a.shared_gate else 0)
        return dense, self.local_experts * self.mlp(a.moe_ffn, self.etp)

    def mtp_block(self) -> tuple[int, int]:
        a = self.a
        dense, expert = self.layer(a.mtp_is_moe)
        # enorm + hnorm, the eh projection (column-parallel 2h -> h), the block's final norm.
        return dense + 3 * a.h * self.norm + 2 * a.h * a.h // self.tp, expert

    def rank(self, r: RankLayers, pp: int) -> RankParams:
        a = self.a
        dense, expert = self.counts(StageLayers.of(a, r), pp)
        return RankParams(r.pp_rank, len(r.layers), dense, expert)

    def counts(self, r: "StageLayers", pp: Any, xp: Any = SCALARS) -> tuple[Any, Any]:
        """(dense, expert) parameters of a pipeline rank holding ``r``: one rank's numbers, or numpy columns of many
        (``pp`` then a column too; this counter's (TP, ETP, local experts) the same for every row)."""
        a = self.a
        dd, de = self.layer(False)
        md, me = self.layer(True) if a.experts else (0, 0)
        n_dense = r.layers - r.moe
        d, e = self.mtp_block() if a.mtp else (0, 0)
        dense, expert = n_dense * dd + r.moe * md + r.mtp * d, n_dense * de + r.moe * me + r.mtp * e
        vocab_shard = a.padded_vocab(self.tp) * a.h // self.tp
        # MTP embeds the shifted tokens with its own copy of the embedding
        dense = dense + xp.where(xp.or_(r.embedding, r.mtp > 0), vocab_shard + a.learned_positions * a.h, 0)
        # The final norm sits with the loss; with MTP, with the last decoder layer instead.
        dense = dense + xp.where(r.last if a.mtp else r.loss, a.h * self.norm, 0)
        return dense + xp.where(xp.and_(r.loss, a.untied or pp > 1), vocab_shard, 0), expert


@dataclass(frozen=True, slots=True)
class StageLayers:
    """What the parameter count reads of a pipeline rank (:class:`~moe_hydra.core.pipeline.RankLayers`): its numbers,
    or columns of many ranks'."""

    layers: Any  # decoder layers held, over all its chunks
    moe: Any  # of them MoE layers
    mtp: Any  # MTP blocks
    embedding: Any
    loss: Any
    last: Any  # whether it holds the last decoder layer

    @classmethod
    def of(cls, a: Arch, r: RankLayers) -> "StageLayers":
        return cls(len(r.layers), (r.mask & a.moe_mask).bit_count(), r.mtp, r.embedding, r.loss,
                   a.num_layers - 1 in r.layers)


def _whole_model(a: Arch, local_experts: int) -> int:
    (stage,) = assign(a.num_layers, a.mtp, pp=1)
    return _Counter(a, tp=1, etp=1, local_experts=local_experts).rank(stage, pp=1).total


def total_params(a: Arch) -> int:
    """Every parameter of the model (MTP included), unsharded."""
    return _whole_model(a, a.experts)


def routed_expert_params(a: Arch) -> int:
    """Every routed expert's parameters (MTP's included), unsharded."""
    return total_params(a) - _whole_model(a, 0) if a.experts else 0


def active_params(a: Arch) -> int:
    """Parameters one token passes through: top-k routed experts instead of all (both embeddings)."""
    return _whole_model(a, a.topk if a.experts else 0)


def params_per_rank(a: Arch, layout: Layout, split: tuple[RankLayers, ...], *, te_spec: bool) -> list[RankParams]:
    """Parameters on one rank of each pipeline stage (all TP/EP ranks of a stage hold the same).

    ``split``: what each pipeline rank holds (``Resolved.split``); ``te_spec``: the layer spec the job builds
    (see the module doc).
    """
    counter = _counter(a, layout.tp, layout.etp, a.experts // layout.ep if a.experts else 0, te_spec)
    return [counter.rank(s, layout.pp) for s in split]


def counter(a: Arch, tp: int, etp: int, ep: int, te_spec: bool) -> _Counter:
    """The parameter count of one rank of a (TP, ETP, EP) layout (:meth:`_Counter.counts` over its stages)."""
    return _counter(a, tp, etp, a.experts // ep if a.experts else 0, te_spec)


@lru_cache(maxsize=1024)
def _counter(a: Arch, tp: int, etp: int, local_experts: int, te_spec: bool) -> _Counter:
    return _Counter(a, tp, etp, local_experts, te_spec)
