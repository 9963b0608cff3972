"""The composed config as Megatron-Core ``TransformerConfig`` keyword arguments.

One mapping, field by field, from moe_hydra's schema (which already uses Megatron's names) to the
installed release's names (:mod:`moe_hydra.core.versions`). Dtypes, the activation and the attention backend are
returned as names (``"bf16"``, ``"silu"``, ``"auto"``) so this module stays pure; the job turns them into torch and
Megatron objects.

Pure: standard library only.
"""

from __future__ import annotations

from typing import Any

from moe_hydra.core.arch import activation_func, parse_moe_layer_freq
from moe_hydra.core.resolved import Resolved
from moe_hydra.core.versions import McoreFacts

# Switched off where Transformer Engine / Apex kernels are missing (CPU, or a GPU without TE).
FUSIONS = ("bias_dropout_fusion", "bias_activation_fusion", "apply_rope_fusion", "masked_softmax_fusion",
           "persist_layer_norm", "gradient_accumulation_fusion")


def transformer_config_kwargs(resolved: Resolved, mcore: McoreFacts, *, on_gpu: bool) -> dict[str, Any]:
    """Keyword arguments for ``TransformerConfig`` (or ``MLATransformerConfig`` with MLA): the parallel sizes
    from the resolved layout (the same object ``initialize_model_parallel`` reads), the fused kernels from the
    resolved implementation."""
    cfg, lo, with_te = resolved.cfg, resolved.layout, resolved.impl.te
    m, p, pr, d, r = cfg.model, cfg.parallel, cfg.precision, cfg.dispatcher, cfg.routing
    interleaved = lo.vpp is not None
    # Megatron overlaps p2p only in the interleaved schedule (it refuses it otherwise). On gloo, batched
    # p2p between two stages that are each other's both neighbours swaps equal-shaped activations and
    # gradients (silently wrong, docs/cpu.md): without a GPU, p2p is never batched.
    overlap_p2p = cfg.overlap.overlap_p2p_comm and interleaved
    batch_p2p = (not overlap_p2p) if on_gpu else False
    kw: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        normalization=m.normalization,
        gated_linear_unit=m.gated_linear_unit,
        activation_func=activation_func(m),
        activation_func_clamp_value=m.activation_func_clamp_value,
        glu_linear_offset=m.glu_linear_offset,
        add_bias_linear=m.add_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        qk_layernorm=m.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=m.mtp_num_layers,
        # parallelism (both meshes)
        **{k: v for k, v in lo.to_megatron().items() if k not in ("data_parallel_size", "expert_data_parallel_size")},
        cp_comm_type=p.cp_comm_type,
        hierarchical_context_parallel_sizes=p.hierarchical_context_parallel_sizes,
        pipeline_model_parallel_layout=p.pipeline_model_parallel_layout,
        num_layers_in_first_pipeline_stage=p.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=p.num_layers_in_last_pipeline_stage,
        account_for_embedding_in_pipeline_split=p.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=p.account_for_loss_in_pipeline_split,
        # precision
        params_dtype=pr.params_dtype,
        pipeline_dtype=pr.params_dtype,
        bf16=pr.params_dtype == "bf16",
        fp16=pr.params_dtype == "fp16",
        fp8=pr.fp8,
        fp8_recipe=pr.fp8_recipe if pr.fp8 else "delayed",
        fp8_param=pr.fp8_param_gather,
        fp8_dot_product_attention=pr.fp8_dot_product_attention,
        fp4=pr.fp4,
        fp4_recipe=pr.fp4_recipe if pr.fp4 else "nvfp4",
        # recompute / offload
        recompute_granularity=cfg.recompute.recompute_granularity,
        recompute_method=cfg.recompute.recompute_method,
        recompute_num_layers=cfg.recompute.recompute_num_layers,
        recompute_modules=list(cfg.recompute.recompute_modules) if cfg.recompute.recompute_modules else None,
        fine_grained_activation_offloading=cfg.offload.fine_grained_activation_offloading,
        offload_modules=list(cfg.offload.offload_modules) or None,
        # kernels, overlap
        moe_grouped_gemm=cfg.kernels.moe_grouped_gemm,
        moe_permute_fusion=cfg.kernels.moe_permute_fusion,
        moe_router_fusion=cfg.kernels.moe_router_fusion,
        cuda_graph_impl=cfg.kernels.cuda_graph_impl,
        tp_comm_overlap=cfg.overlap.tp_comm_overlap,
        overlap_p2p_comm=overlap_p2p,
        batch_p2p_comm=batch_p2p,
        overlap_moe_expert_parallel_comm=cfg.overlap.overlap_moe_expert_parallel_comm,
        delay_wgrad_compute=cfg.overlap.delay_wgrad_compute,
        moe_shared_expert_overlap=cfg.overlap.moe_shared_expert_overlap,
        # weights are allocated on the host first when there is no GPU
        use_cpu_initialization=not on_gpu,
    )
    if cfg.kernels.cuda_graph_scope:
        kw[mcore.cuda_graph_scope_field] = list(cfg.kernels.cuda_graph_scope)
    if with_te:  # TE's attention kernels (a name; the job makes it an AttnBackend). The local spec has one kind,
        # and a non-default backend would set TE's NVTE_*_ATTN variables in the process for nothing
        kw["attention_backend"] = cfg.kernels.attention_backend
    if m.window_size is not None:
        kw.update(window_size=tuple(m.window_size), window_attn_skip_freq=m.window_attn_skip_freq)
    if m.num_moe_experts:
        kw.update(
            num_moe_experts=m.num_moe_experts,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size or m.ffn_hidden_size,
            moe_router_topk=m.moe_router_topk,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_shared_expert_gate=m.moe_shared_expert_gate,
            moe_layer_freq=[int(x) for x in parse_moe_layer_freq(m.moe_layer_freq, m.num_layers)],
            moe_router_score_function=m.moe_router_score_function,
            moe_router_pre_softmax=m.moe_router_pre_softmax,
            moe_router_num_groups=m.moe_router_num_groups,
            moe_router_group_topk=m.moe_router_group_topk,
            moe_router_topk_scaling_factor=m.moe_router_topk_scaling_factor,
            moe_router_enable_expert_bias=m.moe_router_enable_expert_bias,
            moe_router_load_balancing_type=m.moe_router_load_balancing_type,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_token_dispatcher_type=d.moe_token_dispatcher_type,
            moe_router_force_load_balancing=r.moe_router_force_load_balancing,
            moe_expert_capacity_factor=r.moe_expert_capacity_factor,
            moe_pad_expert_input_to_capacity=r.moe_pad_expert_input_to_capacity,
            moe_token_drop_policy=r.moe_token_drop_policy,
            moe_router_dtype=r.moe_router_dtype,
            moe_router_padding_for_quantization=r.moe_router_padding_for_quantization,
        )
        if d.moe_token_dispatcher_type == "flex":
            kw["moe_flex_dispatcher_backend"] = d.moe_flex_dispatcher_backend
            if d.num_sms is not None:
                kw[mcore.flex_num_sms_field(d.moe_flex_dispatcher_backend)] = d.num_sms
    if m.multi_latent_attention:
        kw.update(
            multi_latent_attention=True,
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_head_dim=m.qk_head_dim,
            qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
            v_head_dim=m.v_head_dim,
        )
    if not (on_gpu and with_te):
        kw.update({name: False for name in FUSIONS})
    else:  # what the plan says runs (kernels.bias_activation_fusion where Megatron-Core fuses the activation)
        kw["bias_activation_fusion"] = resolved.impl.activation == "fused"
    return kw
