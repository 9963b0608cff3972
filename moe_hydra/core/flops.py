"""Model FLOPs per token, as Megatron-Core's ``num_floating_point_operations`` counts them.

The counter (``megatron/training/training.py``, standard transformer path) charges 6 FLOPs per
multiply-add of every GEMM weight (forward, data-grad, weight-grad), halves causal attention, counts
MTP blocks and their logits, and leaves out the router GEMM, norms, activations and recompute.
Sliding-window attention is not discounted in that counter. :func:`swa_discounted` is the second, labelled one
(:data:`SWA_COUNTER`): each windowed layer's attention core charged for the keys its window admits (on average
over the sequence) instead of the causal half, what the kernels compute; Megatron-Bridge's reports discount SWA too.

For BSHD batches of sequence length s, the per-iteration total divided by the tokens it processed
(GBS x s) is independent of the batch, so this module returns FLOPs per token.

Pure: standard library only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moe_hydra.core.arch import Arch

COUNTER = "megatron-core num_floating_point_operations (MTP counted, SWA not discounted)"
SWA_COUNTER = ("megatron-core num_floating_point_operations with each sliding-window layer's attention core "
               "charged for the keys its window admits (moe_hydra.core.flops.swa_discounted)")

# 3 passes (forward, data-grad, weight-grad) x 2 FLOPs per multiply-add.
_C = 6


@dataclass(frozen=True, slots=True)
class FlopsBreakdown:
    """FLOPs per token, by component; ``total`` is what the counter reports."""

    dense_mlp: float
    routed_experts: float
    shared_experts: float
    attention_linear: float
    attention_core: float
    mtp_projection: float
    logits: float

    @property
    def total(self) -> float:
        return (
            self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.attention_linear
            + self.attention_core
            + self.mtp_projection
            + self.logits
        )


def _attention(a: Arch) -> tuple[float, float]:
    """(token-linear cost, per (token x context position) cost) of one attention layer."""
    h = a.h
    if a.mla:
        n, qk, pe, v = a.heads, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim
        if a.q_lora_rank is None:
            q_in = h * n * (qk + pe)
        else:
            q_in = a.q_lora_rank * (h + n * (qk + pe) + 1)
        lin = _C * (q_in + a.kv_lora_rank * (h + n * (qk + v) + 1) + h * pe + n * v * h)
        core = _C * (n * (qk + pe) / 2 + n * v / 2)
        return lin, core
    q, k = a.q_width, a.kv_width
    return _C * (h * (q + 2 * k) + q * h), _C * q


def flops_per_token(a: Arch, seq_length: int, tp: int = 1) -> FlopsBreakdown:
    """Model FLOPs per token at ``seq_length`` (BSHD), with the vocabulary padded for ``tp``."""
    h, e = a.h, (3 if a.glu else 2)
    n_moe, n_dense = a.moe_blocks, a.dense_blocks
    layers = a.blocks  # every layer, MTP included, carries standard attention
    lin, core = _attention(a)
    return FlopsBreakdown(
        dense_mlp=_C * h * a.ffn * e * n_dense,
        routed_experts=_C * h * a.moe_ffn * a.topk * e * n_moe,
        shared_experts=_C * h * a.shared_ffn * e * n_moe,
        attention_linear=lin * layers,
        attention_core=core * seq_length * layers,
        mtp_projection=_C * a.mtp * (3 * h + 2 * h * h),
        logits=_C * h * a.padded_vocab(tp) * (a.mtp + 1),
    )


def swa_discounted(a: Arch, seq_length: int, tp: int = 1) -> FlopsBreakdown:
    """:func:`flops_per_token` with the sliding window's discount: a windowed layer's query at position i sees
    min(i, window) + 1 keys, not the i + 1 of causal attention; the core's FLOPs scale by the averages' ratio.
    The same breakdown when the model has no window."""
    fl = flops_per_token(a, seq_length, tp)
    if not a.window or not a.windowed_layers:
        return fl
    s, w = seq_length, a.window
    causal = (s + 1) / 2
    seen = causal if s <= w + 1 else (w * (w + 1) / 2 + (s - w) * (w + 1)) / s
    per_layer = fl.attention_core / a.blocks
    core = fl.attention_core - a.windowed_layers * per_layer * (1 - seen / causal)
    return dataclasses.replace(fl, attention_core=core)
