"""The config -> TransformerConfig mapping against the installed megatron-core (schema drift)."""

from __future__ import annotations

import dataclasses

import pytest

from moe_hydra.core.resolved import Implementation, resolve
from moe_hydra.core.versions import mcore_facts
from moe_hydra.job.mcore_args import FUSIONS, transformer_config_kwargs
from moe_hydra.job.train import live_transformer_config
from tests.conftest import compose_config

PRESETS = [["model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128", "mesh=dsv3_h100_1024"],
           ["model=gpt_oss_20b", "hardware=h100_sxm", "mesh=ep8", "dispatcher=deepep"],
           ["model=qwen3_30b_a3b", "hardware=b200", "precision=mxfp8", "recompute=selective"],
           []]


def _with_te(cfg):
    """The resolved plan as a GPU node with Transformer Engine would build it."""
    return resolve(cfg, Implementation.of(cfg, gpu=True, te=True, grouped_gemm=False, apex=True, source="test"))


@pytest.mark.parametrize("overrides", PRESETS)
def test_every_key_is_a_field_of_the_installed_transformer_config(overrides):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kw = transformer_config_kwargs(_with_te(compose_config(*overrides)), mcore_facts(), on_gpu=True)
    cls = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    assert set(kw) - {f.name for f in dataclasses.fields(cls)} == set()


def test_cpu_mapping_turns_off_fusions_and_batched_p2p():
    cfg = compose_config("hardware.devices_per_node=4", "model.num_layers=8", "attention_mesh=pp4_vpp2")
    kw = transformer_config_kwargs(resolve(cfg), mcore_facts(), on_gpu=False)
    assert kw["use_cpu_initialization"] and all(kw[f] is False for f in FUSIONS)
    assert kw["batch_p2p_comm"] is False and kw["overlap_p2p_comm"] is True
    gpu = transformer_config_kwargs(_with_te(cfg), mcore_facts(), on_gpu=True)
    assert [f for f in FUSIONS if f in gpu] == ["bias_activation_fusion"] and gpu["bias_activation_fusion"] is True
    assert gpu["batch_p2p_comm"] is False
    no_vpp = transformer_config_kwargs(_with_te(compose_config("hardware=h100_sxm", "attention_mesh=pp2")), mcore_facts(),
                                       on_gpu=True)
    assert no_vpp["overlap_p2p_comm"] is False and no_vpp["batch_p2p_comm"] is True  # Megatron's non-interleaved rule


def test_flex_sms_use_the_release_field_name():
    cfg = compose_config("hardware=h100_sxm", "mesh=ep8", "dispatcher=hybridep")
    old = transformer_config_kwargs(_with_te(cfg), mcore_facts("0.16.1"), on_gpu=True)
    new = transformer_config_kwargs(_with_te(cfg), mcore_facts("0.19.2"), on_gpu=True)
    assert old["moe_hybridep_num_sms"] == 32 and new["moe_flex_dispatcher_num_sms"] == 32
    assert old["moe_token_dispatcher_type"] == "flex" and old["moe_flex_dispatcher_backend"] == "hybridep"


def test_the_attention_backend_reaches_transformer_engine_only():
    """With TE the backend picks TE's kernels (Megatron sets NVTE_*_ATTN from it); the local spec has one attention,
    so the CPU mapping leaves Megatron's default and the process environment alone."""
    cfg = compose_config("hardware=h100_sxm", "kernels.attention_backend=unfused")
    assert transformer_config_kwargs(_with_te(cfg), mcore_facts(), on_gpu=True)["attention_backend"] == "unfused"
    assert "attention_backend" not in transformer_config_kwargs(resolve(compose_config("kernels.attention_backend=unfused")),
                                                                mcore_facts(), on_gpu=False)


def test_gpt_oss_runs_its_clamped_quick_geglu():
    """GPT-OSS's preset carries Bridge's provider activation (quick_gelu, clamp 7, offset 1); the default is SwiGLU."""
    gpt_oss = transformer_config_kwargs(_with_te(compose_config("model=gpt_oss_20b", "hardware=h100_sxm", "mesh=ep8")),
                                        mcore_facts(), on_gpu=True)
    assert (gpt_oss["activation_func"], gpt_oss["activation_func_clamp_value"], gpt_oss["glu_linear_offset"]) == (
        "quick_gelu", 7.0, 1.0)
    plain = transformer_config_kwargs(resolve(compose_config()), mcore_facts(), on_gpu=False)
    assert (plain["activation_func"], plain["activation_func_clamp_value"], plain["glu_linear_offset"]) == (
        "silu", None, 0.0)


@pytest.mark.parametrize("overrides,fused", [
    (["model=qwen3_30b_a3b"], True), (["model=gpt_oss_20b"], True), (["model=gpt3_175b"], True),  # gelu with bias
    (["model=gpt3_175b", "model.add_bias_linear=false"], False),  # Megatron fuses gelu only with its bias
    (["model=qwen3_30b_a3b", "model.activation_func=gelu"], False),  # routed experts fuse swiglu / quick_geglu only
    (["model=qwen3_30b_a3b", "kernels.bias_activation_fusion=false"], False)])
def test_the_activation_is_fused_where_megatron_core_fuses_it_and_its_config_accepts_that(overrides, fused):
    cfg = compose_config("hardware=h100_sxm", "model.num_layers=4", "model.moe_layer_freq=1", *overrides)
    r = _with_te(cfg)
    assert r.impl.activation == ("fused" if fused else "unfused")
    kw = transformer_config_kwargs(r, mcore_facts(), on_gpu=True)
    assert kw["bias_activation_fusion"] is fused
    assert live_transformer_config(kw).bias_activation_fusion is fused  # the job's build: Megatron-Core's checks pass
    assert resolve(cfg).impl.activation == r.impl.activation  # the plan: hardware=h100_sxm declares TE
    cpu = resolve(compose_config(*overrides))  # hardware=local_cpu: no TE, torch ops
    assert cpu.impl.activation == "unfused"
    assert transformer_config_kwargs(cpu, mcore_facts(), on_gpu=False)["bias_activation_fusion"] is False
