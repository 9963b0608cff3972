"""Facts derived from a model's architecture: layer types, attention widths, padded vocabulary.

Shared by the FLOPs counter, the parameter counter and the legality rules, so each reads the
architecture the same way Megatron-Core does. Pure: standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

_FREQ_TERM = re.compile(r"\[\s*([01](?:\s*,\s*[01])*)\s*\]\s*(?:\*\s*(\d+))?")


def parse_moe_layer_freq(freq: Any, num_layers: int) -> list[bool]:
    """Megatron's ``moe_layer_freq`` as one bool per layer (True = MoE layer).

    Accepts an int N (layer i is MoE when i % N == 0), a 0/1 sequence of length ``num_layers``, or
    the compact string form ``"[0]*3+[1]*58"`` (optionally parenthesised) that Megatron's CLI takes.

    Raises:
        ValueError: for any other form, or a pattern whose length is not ``num_layers``.
    """
    if isinstance(freq, bool):
        raise ValueError(f"moe_layer_freq must be an int, a 0/1 list or a pattern, not {freq!r}")
    if isinstance(freq, int):
        if freq < 1:
            raise ValueError(f"moe_layer_freq must be >= 1, got {freq}")
        return [i % freq == 0 for i in range(num_layers)]
    if isinstance(freq, str):
        text = freq.strip()
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        pattern: list[int] = []
        for term in text.split("+"):
            m = _FREQ_TERM.fullmatch(term.strip())
            if not m:
                raise ValueError(f"moe_layer_freq {freq!r}: cannot read term {term.strip()!r}")
            block = [int(x) for x in m.group(1).split(",")]
            pattern += block * int(m.group(2) or 1)
        freq = pattern
    if isinstance(freq, Sequence):
        if len(freq) != num_layers:
            raise ValueError(f"moe_layer_freq lists {len(freq)} layers but num_layers is {num_layers}")
        if any(int(x) not in (0, 1) for x in freq):
            raise ValueError(f"moe_layer_freq entries must be 0 or 1, got {list(freq)}")
        return [bool(int(x)) for x in freq]
    raise ValueError(f"moe_layer_freq must be an int, a 0/1 list or a pattern, not {freq!r}")


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * TP``."""
    multiple = divisible_by * tp
    return math.ceil(vocab_size / multiple) * multiple


def activation_func(m: Any) -> str:
    """The MLPs' activation a model config runs (``model.activation_func``; null: silu with a gated linear unit,
    gelu without): what the job gives Megatron-Core and the hand-off spells as flags."""
    return m.activation_func or ("silu" if m.gated_linear_unit else "gelu")


def activation_fusable(m: Any) -> bool:
    """Whether Megatron-Core can fuse the bias add and the activation (``bias_activation_fusion``) for model config
    ``m``: TransformerConfig accepts gelu, swiglu or quick_geglu (gelu without a GLU only with a bias, quick_gelu only
    with one, ``glu_linear_offset`` only with quick_gelu), and routed experts fuse only swiglu and quick_geglu."""
    act, glu = activation_func(m), m.gated_linear_unit
    if act not in ("silu", "gelu", "quick_gelu") or (m.glu_linear_offset and act != "quick_gelu"):
        return False
    if not glu and (act == "quick_gelu" or (act == "gelu" and not m.add_bias_linear)):
        return False
    return not m.num_moe_experts or (glu and act in ("silu", "quick_gelu"))


def _left_window(window_size: Any) -> int:
    """The keys before the query a window admits (``window_size`` [left, right]; -1 or none: unbounded -> 0)."""
    return int(window_size[0]) if window_size and window_size[0] >= 0 else 0


def _windowed(window_size: Any, skip_freq: Any, layer_number: int) -> bool:
    """Whether layer ``layer_number`` (1-based) uses the window, as Megatron-Core's is_layer_window_attention
    decides: every layer without ``window_attn_skip_freq``; with an int N, all but every N-th; with a 0/1 list,
    the 1s."""
    if not window_size:
        return False
    if skip_freq is None:
        return True
    if isinstance(skip_freq, int):
        return layer_number % skip_freq != 0
    return bool(list(skip_freq)[layer_number - 1])


@dataclass(frozen=True, slots=True)
class Arch:
    """The numbers every counter needs, read once from a :class:`~moe_hydra.core.schema.ModelConfig`."""

    h: int
    num_layers: int
    ffn: int  # dense MLP width
    moe_ffn: int  # routed expert width
    shared_ffn: int  # shared experts' total width (0 = none)
    experts: int  # 0 = dense model
    topk: int
    is_moe: tuple[bool, ...]
    moe_mask: int  # bit i set when layer i is MoE (``(mask & moe_mask).bit_count()`` counts a stage's MoE layers)
    mtp: int
    heads: int
    groups: int
    head_dim: int
    vocab: int  # unpadded
    vocab_divisible_by: int
    glu: bool
    glu_clamp: bool  # a clamped GLU (activation_func_clamp_value): its clamps copy the GLU's input
    rmsnorm: bool
    bias: bool
    qkv_bias: bool
    qk_norm: bool
    untied: bool
    mla: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    shared_gate: bool
    learned_positions: int  # rows of a learned absolute position embedding (0 with RoPE)
    window: int = 0  # sliding-window attention: keys before the query each windowed layer sees (0 = none)
    windowed_layers: int = 0  # decoder layers with the window (Megatron-Core's is_layer_window_attention)

    @classmethod
    def from_model(cls, m: Any) -> "Arch":
        experts = m.num_moe_experts or 0
        is_moe = parse_moe_layer_freq(m.moe_layer_freq, m.num_layers) if experts else [False] * m.num_layers
        return cls(
            h=m.hidden_size,
            num_layers=m.num_layers,
            ffn=m.ffn_hidden_size,
            moe_ffn=m.moe_ffn_hidden_size or m.ffn_hidden_size,
            shared_ffn=m.moe_shared_expert_intermediate_size or 0,
            experts=experts,
            topk=m.moe_router_topk,
            is_moe=tuple(is_moe),
            moe_mask=sum(1 << i for i, moe in enumerate(is_moe) if moe),
            mtp=m.mtp_num_layers or 0,
            heads=m.num_attention_heads,
            groups=m.num_query_groups or m.num_attention_heads,
            head_dim=m.kv_channels or m.hidden_size // m.num_attention_heads,
            vocab=m.vocab_size,
            vocab_divisible_by=m.make_vocab_size_divisible_by,
            glu=m.gated_linear_unit,
            glu_clamp=m.gated_linear_unit and m.activation_func_clamp_value is not None,
            rmsnorm=m.normalization == "RMSNorm",
            bias=m.add_bias_linear,
            qkv_bias=m.add_qkv_bias or m.add_bias_linear,
            qk_norm=m.qk_layernorm,
            untied=m.untie_embeddings_and_output_weights,
            mla=m.multi_latent_attention,
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_head_dim=m.qk_head_dim,
            qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
            v_head_dim=m.v_head_dim,
            shared_gate=m.moe_shared_expert_gate,
            learned_positions=m.max_position_embeddings if m.position_embedding_type == "learned_absolute" else 0,
            window=_left_window(m.window_size),
            windowed_layers=sum(_windowed(m.window_size, m.window_attn_skip_freq, n)
                                for n in range(1, m.num_layers + 1)) if _left_window(m.window_size) else 0,
        )

    @property
    def n_moe(self) -> int:
        return sum(self.is_moe)

    @property
    def n_dense(self) -> int:
        return self.num_layers - self.n_moe

    @property
    def mtp_is_moe(self) -> bool:
        """MTP blocks take the type of the last decoder layer."""
        return bool(self.is_moe) and self.is_moe[-1]

    @property
    def blocks(self) -> int:
        """Transformer blocks: the decoder layers and the MTP blocks."""
        return self.num_layers + self.mtp

    @property
    def moe_blocks(self) -> int:
        """The blocks with a MoE layer, MTP blocks included when they are MoE."""
        return self.n_moe + (self.mtp if self.mtp_is_moe else 0)

    @property
    def dense_blocks(self) -> int:
        """The blocks with a dense MLP, MTP blocks included when they are dense."""
        return self.blocks - self.moe_blocks

    @property
    def q_width(self) -> int:
        return self.head_dim * self.heads

    @property
    def kv_width(self) -> int:
        return self.head_dim * self.groups

    def padded_vocab(self, tp: int = 1) -> int:
        return padded_vocab_size(self.vocab, self.vocab_divisible_by, tp)
