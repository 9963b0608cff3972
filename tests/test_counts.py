"""FLOPs and parameter counts against the test vectors of flops-memory.md / models-hardware.md, and
per-rank parameter counts against Megatron-Core builds (docs/cpu.md)."""

from __future__ import annotations

import pytest

from moe_hydra.core.arch import Arch, padded_vocab_size, parse_moe_layer_freq
from moe_hydra.core.flops import flops_per_token
from moe_hydra.core.params import active_params, params_per_rank, total_params
from moe_hydra.core.resolved import resolve
from tests.conftest import compose_config


def arch(model: str, **changes) -> Arch:
    cfg = compose_config(f"model={model}", *(f"model.{k}={'null' if v is None else v}" for k, v in changes.items()))
    return Arch.from_model(cfg.model)


# GFLOP per token from Megatron-Core's counter (docs/flops-memory.md)
FLOPS = [
    ("deepseek_v3", {}, 4096, 260.0), ("deepseek_v3", {}, 8192, 291.2),
    ("deepseek_v3", {"mtp_num_layers": None}, 4096, 249.8),
    ("qwen3_30b_a3b", {}, 4096, 23.0), ("qwen3_30b_a3b", {}, 8192, 27.8),
    ("gpt_oss_120b", {}, 4096, 34.3), ("gpt_oss_120b", {}, 8192, 38.0),
    ("mixtral_8x7b", {}, 4096, 79.7), ("mixtral_8x7b", {}, 8192, 82.9),
    ("mixtral_8x22b", {}, 4096, 242.2),
]


@pytest.mark.parametrize("model,changes,seq,gflops", FLOPS)
def test_flops_per_token_matches_megatron_counter(model, changes, seq, gflops):
    assert round(flops_per_token(arch(model, **changes), seq).total / 1e9, 1) == gflops


# (derived total, derived active) in billions, rounded as published (the model cards; docs/configuration.md); without MTP
PARAMS = {
    "deepseek_v3": (671.0, 37.5), "deepseek_v2_lite": (15.7, 2.66), "moonlight_16b_a3b": (16.0, 2.9),
    "kimi_k2": (1026, 32.9), "qwen3_30b_a3b": (30.5, 3.35), "qwen3_235b_a22b": (235.1, 22.2),
    "mixtral_8x7b": (46.7, 12.9), "mixtral_8x22b": (140.6, 39.2), "gpt_oss_120b": (116.8, 5.7),
    "gpt_oss_20b": (20.9, 4.2), "olmoe_1b_7b": (6.9, 1.28),
}


def _matches(x: float, published: float) -> bool:
    """Equal to the published figure within one unit of its last digit."""
    text = repr(published)
    unit = 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)
    return abs(x - published) <= unit


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_total_and_active_parameters_match_published_counts(model):
    a = arch(model, mtp_num_layers=None)
    total, active = PARAMS[model]
    assert _matches(total_params(a) / 1e9, total), total_params(a)
    assert _matches(active_params(a) / 1e9, active), active_params(a)


def test_dsv3_with_mtp_is_about_682_5b():
    # 671.0B + one MoE layer (~11.5B) + the MTP projection and norms
    assert 682.5e9 < total_params(arch("deepseek_v3")) < 682.7e9


def _per_rank(model, *overrides, **changes):
    cfg = compose_config(f"model={model}", "hardware=h100_sxm", *overrides,
                         *(f"model.{k}={v}" for k, v in changes.items()))
    r = resolve(cfg)
    return [(x.total, x.expert) for x in params_per_rank(r.arch, r.layout, r.split, te_spec=True)]


def test_per_rank_counts_equal_a_megatron_build():
    # Mixtral-8x7B shape, W=64, TP2 PP2 EP8, built on the meta device by Megatron-Core (docs/cpu.md).
    # That build used GPTModel's default learned absolute position embedding (4096 positions).
    mesh = ["hardware.nodes=8", "parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
            "parallel.pipeline_model_parallel_size=2", "parallel.expert_model_parallel_size=8"]
    etp2 = _per_rank("mixtral_8x7b", *mesh, "parallel.expert_tensor_parallel_size=2",
                     position_embedding_type="learned_absolute", max_position_embeddings=4096)
    assert etp2 == [(1_827_799_040, 1_409_286_144), (1_811_025_920, 1_409_286_144)]
    etp1 = _per_rank("mixtral_8x7b", *mesh, "parallel.expert_tensor_parallel_size=1",
                     position_embedding_type="learned_absolute", max_position_embeddings=4096)
    assert etp1[0][0] == 3_237_085_184


def test_per_rank_follows_the_pipeline_layout():
    ranks = _per_rank("deepseek_v3", "hardware.nodes=128", "mesh=dsv3_h100_1024")
    assert len(ranks) == 8
    # rank r holds virtual stages r, r+8, r+16, r+24. Rank 0: layer 0 (dense) + 6 MoE layers;
    # rank 1: layers 1-2 (dense) + 6 MoE; rank 2: 8 MoE; rank 7: 6 MoE + the MTP block's MoE layer.
    experts_per_moe_layer = 4 * 3 * 7168 * 2048  # 4 local experts, SwiGLU fc1 (2x) + fc2
    assert [r[1] // experts_per_moe_layer for r in ranks] == [6, 6, 8, 8, 8, 8, 8, 7]
    assert ranks[7][1] == 7 * experts_per_moe_layer  # 6 layers + the MTP block's MoE layer


def test_moe_layer_freq_forms():
    assert parse_moe_layer_freq(2, 4) == [True, False, True, False]
    assert parse_moe_layer_freq("([0]*3+[1]*2)", 5) == [False] * 3 + [True] * 2
    assert parse_moe_layer_freq([0, 1], 2) == [False, True]
    with pytest.raises(ValueError, match="lists 3 layers but num_layers is 2"):
        parse_moe_layer_freq("[0]*1+[1]*2", 2)
    with pytest.raises(ValueError, match="cannot read term"):
        parse_moe_layer_freq("[2]*3", 3)


def test_vocab_padding_follows_tp():
    assert padded_vocab_size(32000, 128, 1) == 32000
    assert padded_vocab_size(151936, 128, 8) == 152576  # next multiple of 1024


@pytest.mark.parametrize("model", ["gpt_oss_120b", "gpt_oss_20b"])
def test_sliding_window_counter_discounts_the_windowed_layers_only(model):
    from megatron.core.transformer.utils import is_layer_window_attention

    from moe_hydra.core.flops import swa_discounted

    m = compose_config(f"model={model}").model
    a = Arch.from_model(m)
    # the layers Megatron-Core builds with the window
    assert a.windowed_layers == sum(is_layer_window_attention(tuple(m.window_size), m.window_attn_skip_freq, n)
                                    for n in range(1, m.num_layers + 1)) == m.num_layers // 2
    full, swa = flops_per_token(a, 4096), swa_discounted(a, 4096)
    assert swa.total - swa.attention_core == pytest.approx(full.total - full.attention_core)  # only the core changes
    # a windowed query sees window + 1 keys (after the first ones), a causal one (s + 1) / 2 on average
    per_layer = full.attention_core / a.num_layers
    seen = (127 * 128 / 2 + (4096 - 127) * 128) / 4096
    assert swa.attention_core == pytest.approx(full.attention_core - a.windowed_layers * per_layer * (1 - seen / 2048.5))
    # a sequence inside the window: nothing to discount; a model without a window: the same counter
    assert swa_discounted(a, 128).total == pytest.approx(flops_per_token(a, 128).total)
    qwen = Arch.from_model(compose_config("model=qwen3_30b_a3b").model)
    assert swa_discounted(qwen, 4096) == flops_per_token(qwen, 4096)
