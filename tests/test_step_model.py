"""The step-time model's terms: what each implementation fact and recompute setting costs, and what stage=plan states.
How well it predicts measured runs is tests/test_calibration.py's (held out)."""

from __future__ import annotations

import itertools
import math

import pytest

from moe_hydra.core import flops, metrics
from moe_hydra.core.resolved import resolve
from moe_hydra.planning import plan, search, step_model
from moe_hydra.planning.step_model import StepModel
from tests.conftest import compose_config

H100 = "hardware=h100_sxm"
ENV = {"versions": {}, "env": {}}
# NVIDIA's Qwen3-235B-A22B layout on 256 H100 with DeepEP and EP overlap (Megatron-MoE-ModelZoo: 17.6 s a step)
QWEN3_235B_EP32 = ("model=qwen3_235b_a22b", H100, "hardware.nodes=32", "train.global_batch_size=2048",
                   "dispatcher=deepep", "overlap.overlap_moe_expert_parallel_comm=true", "recompute=selective",
                   "recompute.recompute_modules=[layernorm,moe_act]", "parallel.tensor_model_parallel_size=2",
                   "parallel.sequence_parallel=true", "parallel.pipeline_model_parallel_size=8",
                   "parallel.virtual_pipeline_model_parallel_size=4", "parallel.expert_model_parallel_size=32",
                   "parallel.expert_tensor_parallel_size=1",
                   "parallel.account_for_embedding_in_pipeline_split=true",
                   "parallel.account_for_loss_in_pipeline_split=true")


def _terms(*overrides: str) -> dict[str, float]:
    r = resolve(compose_config("stage=plan", *overrides))
    worst = max(plan.assess(r).ranks, key=lambda x: x.total)
    return StepModel(r).terms(r, worst.dense, worst.expert, r.cfg.recompute,
                              r.cfg.dispatcher.moe_token_dispatcher_type == "flex",
                              r.cfg.overlap.overlap_moe_expert_parallel_comm)


def test_the_plan_states_its_prediction_with_the_held_out_range_on_gpus_and_none_on_the_cpu():
    p = plan.make_plan(resolve(compose_config("stage=plan", *QWEN3_235B_EP32)), [], ENV)
    st = p["step_time"]
    assert st["seconds"] == pytest.approx(sum(st["terms"].values()))  # the terms add up to the step
    lo, hi = st["interval_s"]
    spread = math.exp(step_model.HELD_OUT["interval"]["moe"]["log_width"])  # the MoE sources' 90 % range
    assert st["interval_of"] == "moe" and st["coverage"] == 0.9 and 0 < st["held_out_coverage"] <= 1
    assert lo == pytest.approx(st["seconds"] / spread) and hi == pytest.approx(st["seconds"] * spread)
    assert lo <= 17.6 <= hi and st["held_out"]["scheme"] == "leave one source out"
    dense = plan.make_plan(resolve(compose_config("stage=plan", "model=gpt3_175b", "hardware=a100_sxm",
                                                  "hardware.nodes=8", "parallel.tensor_model_parallel_size=8",
                                                  "parallel.pipeline_model_parallel_size=8")), [], ENV)["step_time"]
    spread = math.exp(step_model.HELD_OUT["interval"]["dense"]["log_width"])
    assert dense["interval_of"] == "dense"
    assert dense["interval_s"] == pytest.approx([dense["seconds"] / spread, dense["seconds"] * spread])
    assert "measured_runs.yaml" in st["calibration"]
    world, tokens = p["world_size"], p["batch"]["tokens_per_step"]
    assert st["tokens_per_s_per_gpu"] == pytest.approx(tokens / (st["seconds"] * world))
    assert st["mfu"] == pytest.approx(st["tflops_per_gpu"] / 989)  # H100 SXM dense BF16 peak
    assert plan.make_plan(resolve(compose_config("stage=plan")), [], ENV)["step_time"] is None  # no CPU rates


def test_recompute_costs_the_forward_megatron_re_runs_per_module():
    qwen = StepModel(resolve(compose_config("stage=plan", "model=qwen3_235b_a22b", H100)))
    dsv3 = StepModel(resolve(compose_config("stage=plan", "model=deepseek_v3", H100)))
    # (dense GEMMs, core attention, experts, all-to-all, TP, MoE host, dense host)
    assert qwen.recompute_factors(("none",)) == (1.0,) * 7
    assert qwen.recompute_factors(("selective", "layernorm", "moe_act")) == (1.0,) * 7  # element-wise kernels only
    assert qwen.recompute_factors(("selective", "core_attn")) == (1.0, 4 / 3, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert qwen.recompute_factors(("selective", "moe")) == (1.0, 1.0, 4 / 3, 1.5, 1.0, 4 / 3, 1.0)
    # MLA's up-projections exist in DeepSeek-V3 only; full recompute re-runs every layer's forward
    assert qwen.recompute_factors(("selective", "mla_up_proj"))[0] == 1.0 < dsv3.recompute_factors(
        ("selective", "mla_up_proj"))[0]
    full = qwen.recompute_factors(("full",))
    # every block's dense GEMMs re-run (the logits, apart, are not); DeepSeek-V3's MTP projection is not either
    assert full == pytest.approx((4 / 3, 4 / 3, 4 / 3, 1.5, 1.5, 4 / 3, 4 / 3))
    assert 1 < dsv3.recompute_factors(("full",))[0] < 4 / 3
    # the search's rungs and the plan's node agree: a node and its key give the same factors
    s = search.Search(compose_config("stage=plan", "model=qwen3_235b_a22b", H100))
    for node in s.recompute.values():
        assert s.model.recompute_factors(node) == s.model.recompute_factors(step_model.recompute_key(node))


def test_gemms_run_at_the_measured_matmul_rate_of_their_precision_and_attention_stays_bf16():
    """The fractions are of the best-shape matmul the preset declares (mamf-finder: H100 794.5 bf16 and 1402.6 FP8
    TFLOP/s of 989 and 1979), so one fraction carries across GPUs that reach different shares of their peak."""
    k = compose_config("stage=plan").step_model
    bf16 = StepModel(resolve(compose_config("stage=plan", "model=qwen3_30b_a3b", H100)))
    fp8 = StepModel(resolve(compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "precision=fp8_tensorwise")))
    assert bf16.gemm_s == pytest.approx(1 / (k.gemm_efficiency * 794.5e12))
    assert fp8.gemm_s == pytest.approx(1 / (k.low_precision_gemm_efficiency * 1402.6e12))
    assert fp8.attention_s == bf16.attention_s
    # the logits stay bf16 (Megatron-Core's output layer is outside the FP8 context)
    assert fp8.logits_s == bf16.logits_s == pytest.approx(bf16.flops.logits * bf16.gemm_s)
    assert fp8.dense_flops == bf16.dense_flops == pytest.approx(bf16.flops.total - bf16.flops.logits
                                                                - bf16.flops.routed_experts - bf16.flops.attention_core)
    # fp8_dot_product_attention: TE's fused attention on the FP8 tensor cores, faster by what FP8 GEMMs gain
    fp8_dpa = StepModel(resolve(compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "precision=fp8_tensorwise",
                                               "precision.fp8_dot_product_attention=true")))
    gain = k.low_precision_gemm_efficiency * 1402.6 / (k.gemm_efficiency * 794.5)
    assert bf16.attention_s / fp8_dpa.attention_s == pytest.approx(gain) and gain > 1
    # not measured: the share NVIDIA's GPUs typically reach; FP4 at the FP8 measurement's share of its peak
    peak = StepModel(resolve(compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "hardware.matmul_tflops_bf16=null")))
    assert peak.gemm_s == pytest.approx(1 / (k.gemm_efficiency * 989e12 * metrics.UNMEASURED_MATMUL_SHARE))
    fp4 = compose_config("stage=plan", "hardware=b200", "precision=nvfp4")
    assert metrics.matmul_tflops(fp4.hardware, fp4.precision) == pytest.approx(9000 * 3432.5 / 4500)
    # an A100's GEMMs reach 86.9 % of its peak, a GB200's 72.9 %: the same model runs them at those shares
    a100 = compose_config("stage=plan", "hardware=a100_sxm")
    gb200 = compose_config("stage=plan", "hardware=gb200_nvl72")
    assert metrics.matmul_tflops(a100.hardware, a100.precision) / 312 == pytest.approx(0.869, abs=0.001)
    assert metrics.matmul_tflops(gb200.hardware, gb200.precision) / 2500 == pytest.approx(0.729, abs=0.001)
    # no declared rates (the CPU preset): every GEMM, the logits too, at one nominal rate, so a ranking still exists
    nominal = StepModel(resolve(compose_config("stage=plan", "model=qwen3_30b_a3b")))
    assert nominal.logits_s == pytest.approx(nominal.flops.logits * nominal.gemm_s)


def test_the_attention_backend_decides_flash_or_unfused_attention_and_what_it_costs():
    """kernels.attention_backend is Megatron-Core's: with TE, auto / flash / fused run a fused kernel; unfused (and,
    without TE, every value) keeps the score matrix: its time at the unfused rate, its memory in the estimate."""
    base = ("model=qwen3_30b_a3b", H100, "parallel.expert_model_parallel_size=8")
    k = compose_config("stage=plan").step_model
    r = {b: resolve(compose_config("stage=plan", *base, f"kernels.attention_backend={b}"))
         for b in ("auto", "flash", "fused", "unfused")}
    assert [r[b].impl.attention for b in r] == ["flash", "flash", "flash", "unfused"]
    no_te = resolve(compose_config("stage=plan", *base, "hardware.transformer_engine=false"))
    assert no_te.impl.attention == "unfused"
    flash, unfused = StepModel(r["auto"]), StepModel(r["unfused"])
    assert flash.attention_s == pytest.approx(flops.flops_per_token(flash.arch, flash.seq).attention_core
                                              / (k.attention_efficiency * 989e12))
    # unfused: the whole matrix (twice the causal FLOPs) at the bf16 GEMM rate, and each score's bytes through HBM
    a, s, hw = unfused.arch, unfused.seq, r["unfused"].cfg.hardware
    gemms = 2 * 6 * a.q_width * s * a.blocks / (k.gemm_efficiency * 794.5e12)
    streamed = a.heads * s * a.blocks * k.unfused_attention_bytes_per_score / (hw.hbm_bandwidth_tb_s * 1e12
                                                                              * k.hbm_efficiency)
    assert unfused.attention_s == pytest.approx(gemms + streamed) and streamed > gemms
    assert _terms(*base, "kernels.attention_backend=unfused")["compute"] > _terms(*base)["compute"]
    held = [plan.assess(x).peak.activations for x in (r["auto"], r["unfused"], no_te)]
    assert held[0] < held[1] < held[2]  # the probabilities kept for the backward pass (+ torch's fp32 softmax)
    p = plan.make_plan(r["unfused"], [], ENV)
    assert p["implementation"]["attention"] == "unfused"


def test_cuda_graphs_take_the_host_time_they_capture():
    base = ("model=qwen3_30b_a3b", H100, "hardware.nodes=2", "parallel.expert_model_parallel_size=16",
            "train.micro_batch_size=1")
    k = compose_config("stage=plan").step_model
    model = {impl: StepModel(resolve(compose_config("stage=plan", *base, *impl))) for impl in (
        (), ("kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[attn,moe_router]"),
        ("kernels.cuda_graph_impl=full_iteration",))}
    none, partial, whole = model.values()
    assert none.host_moe == pytest.approx(k.host_ms_per_moe_layer * 1e-3)
    assert partial.host_moe == pytest.approx(none.host_moe * k.cuda_graph_host_fraction)
    assert whole.host_moe == 0.0 and whole.host_dense == 0.0


def test_sequential_experts_pay_each_local_experts_launches():
    """One H200 without Transformer Engine: SequentialMLP loops over the 128 local experts of each MoE layer."""
    slice_ = ("model=qwen3_30b_a3b", "model.num_layers=4", "model.seq_length=1024", "train.global_batch_size=8",
              "hardware=h200_sxm", "hardware.devices_per_node=1", "kernels.moe_grouped_gemm=false")
    k = compose_config("stage=plan").step_model
    local = _terms(*slice_, "hardware.transformer_engine=false")
    te = _terms(*slice_)
    # 4 MoE layers x 8 micro-batches: the host waits on 128 experts' launches, and unfused attention is slower
    host = (k.host_ms_per_moe_layer + k.host_ms_per_local_expert * 128) * 1e-3 * 4 * 8
    assert local["host"] == pytest.approx(host - (local["compute"] + local["ep"]))
    assert local["compute"] > te["compute"]


def test_the_sliding_window_discounts_the_attention_time_not_the_counter():
    r = resolve(compose_config("stage=plan", "model=gpt_oss_120b", H100))
    model = StepModel(r)
    assert model.flops.attention_core == pytest.approx(flops.swa_discounted(r.arch, 4096).attention_core)
    assert model.flops.attention_core < flops.flops_per_token(r.arch, 4096).attention_core
    p = plan.make_plan(resolve(compose_config("stage=plan", "model=gpt_oss_120b", H100, "hardware.nodes=8",
                                              "parallel.expert_model_parallel_size=64")), [], ENV)
    assert p["flops_per_token_swa"] < p["flops_per_token"] and "sliding-window" in p["flops_counter_swa"]
    assert p["flops_per_token"] == pytest.approx(flops.flops_per_token(r.arch, 4096).total)


def test_the_kernels_between_the_gemms_weigh_on_a_narrow_top8_moe_layer_not_on_a_wide_dense_one():
    """Their bytes grow with the hidden size, GEMM FLOPs with its square: on an H100 they are a fifth of
    Qwen3-30B-A3B's per-token time at the fitted rates and a few percent of GPT-3 175B's."""
    def share(model):
        m = StepModel(resolve(compose_config("stage=plan", f"model={model}", H100)))
        between = sum(m.elementwise_s)
        return between / (between + (m.dense_flops + m.expert_flops) * m.gemm_s + m.logits_s + m.attention_s)

    assert share("qwen3_30b_a3b") > 0.15 > share("deepseek_v3") > share("gpt3_175b") and share("gpt3_175b") < 0.05
    dense_bytes, moe_bytes = step_model.elementwise_bytes(resolve(compose_config("stage=plan", "model=gpt3_175b")).arch)
    assert moe_bytes == 0 and dense_bytes > 0


def test_an_unfused_activation_moves_more_through_hbm_and_keeps_more_in_memory():
    """Without bias_activation_fusion a routed GLU runs five torch ops (activation, product, probabilities' weighting,
    and the chunk's gradient concatenated): (7 + 15) / 3 forward-equivalent elements of the width against the fused
    kernel's 3; the gate's activation and the product stay in memory."""
    fused = resolve(compose_config("stage=plan", "model=qwen3_30b_a3b", H100))
    unfused = resolve(compose_config("stage=plan", "model=qwen3_30b_a3b", H100, "kernels.bias_activation_fusion=false"))
    assert (fused.impl.activation, unfused.impl.activation) == ("fused", "unfused")
    a = fused.arch
    (dense_f, moe_f), (dense_u, moe_u) = (step_model.elementwise_bytes(a, f) for f in (True, False))
    assert dense_f == dense_u  # every Qwen3-30B-A3B MLP is a MoE layer: the attention blocks alone
    assert moe_u - moe_f == pytest.approx(step_model._STREAMED * (22 / 3 - 3) * a.topk * a.moe_ffn * a.moe_blocks)
    assert _terms("model=qwen3_30b_a3b", H100, "kernels.bias_activation_fusion=false")["compute"] > _terms(
        "model=qwen3_30b_a3b", H100)["compute"]
    from moe_hydra.planning import memory

    terms_f, terms_u = memory.layer_terms(fused, True), memory.layer_terms(unfused, True)
    assert set(terms_u) - set(terms_f) == {"moe_act_unfused"} and terms_u["moe_act_unfused"] == 2 * terms_f["moe_act"]


def test_a_clamped_glu_moves_its_clamped_copy_through_hbm():
    """GPT-OSS's clamp (Megatron-Core's chunk, two clamps and cat before the fused quick-GEGLU, and their backward):
    6 forward-equivalent elements of the expert width per routed copy, beside the fused kernel's 3."""
    clamped = resolve(compose_config("stage=plan", "model=gpt_oss_120b")).arch
    plain = resolve(compose_config("stage=plan", "model=gpt_oss_120b", "model.activation_func_clamp_value=null")).arch
    assert clamped.glu_clamp and not plain.glu_clamp
    (dense_c, moe_c), (dense_p, moe_p) = step_model.elementwise_bytes(clamped), step_model.elementwise_bytes(plain)
    a = clamped
    assert dense_c == dense_p
    assert moe_c - moe_p == pytest.approx(step_model._STREAMED * 6 * a.topk * a.moe_ffn * a.moe_blocks)
    assert _terms("model=gpt_oss_120b", H100)["compute"] > _terms(
        "model=gpt_oss_120b", H100, "model.activation_func_clamp_value=null")["compute"]


def test_a_moe_layers_small_kernels_cost_their_time_per_layer_and_micro_batch():
    qwen = ("model=qwen3_30b_a3b", H100, "recompute=none")
    r = resolve(compose_config("stage=plan", *qwen))
    k = r.cfg.step_model
    with_, without = _terms(*qwen)["compute"], _terms(*qwen, "step_model.gpu_ms_per_moe_layer=0")["compute"]
    moe_layers_per_stage = r.arch.n_moe / r.layout.pp
    assert with_ - without == pytest.approx(
        k.gpu_ms_per_moe_layer * 1e-3 * moe_layers_per_stage * r.batch.micro_batches_per_step)
    assert _terms("model=gpt3_175b", H100)["compute"] == pytest.approx(
        _terms("model=gpt3_175b", H100, "step_model.gpu_ms_per_moe_layer=0")["compute"])  # no MoE layer


def test_a_flex_dispatcher_sends_a_token_once_per_rank_the_alltoall_dispatcher_once_per_expert():
    """Inside one node: every top-k choice of tiny_moe's 8 experts (2 a rank over EP 4) counted from rank 0."""
    r = resolve(compose_config("stage=plan", "model=tiny_moe", H100, "parallel.expert_model_parallel_size=4"))
    a, model, lo = r.arch, StepModel(r), r.layout
    local = a.experts // lo.ep
    choices = list(itertools.combinations(range(a.experts), a.topk))
    per_rank = sum(len({e // local for e in c} - {0}) for c in choices) / len(choices)
    per_expert = sum(sum(e // local != 0 for e in c) for c in choices) / len(choices)
    assert (model.nvlink_copies(lo.ep, lo.etp, True), model.nvlink_copies(lo.ep, lo.etp, False)) == pytest.approx(
        (per_rank, per_expert))
    assert per_rank < per_expert  # two experts on one other rank: one copy, not two
    worst = max(plan.assess(r).ranks, key=lambda x: x.total)
    flex, alltoall = (model.terms(r, worst.dense, worst.expert, r.cfg.recompute, f)["ep"] for f in (True, False))
    assert flex / alltoall == pytest.approx(per_rank / per_expert)


def test_without_sequence_parallelism_every_tp_rank_runs_the_norms_and_adds_on_every_token():
    """Megatron without sequence parallelism (vTrain's Megatron-DeepSpeed runs) repeats each block's norm and
    residual add on all TP ranks: (TP - 1) x their share more streaming time."""
    for tp in (2, 8):
        gpt = ("model=gpt3_175b", H100, "hardware.nodes=4", "recompute=none",
               f"parallel.tensor_model_parallel_size={tp}")
        r = resolve(compose_config("stage=plan", *gpt, "parallel.sequence_parallel=false"))
        tokens = r.batch.tokens_per_step / r.layout.world_size
        sp, no_sp = (_terms(*gpt, f"parallel.sequence_parallel={on}")["compute"] for on in ("true", "false"))
        assert no_sp - sp == pytest.approx(tokens * StepModel(r).replicated_s * (tp - 1))
    assert 0 < step_model.replicated_bytes(r.arch) < sum(step_model.elementwise_bytes(r.arch))


def test_data_parallel_traffic_is_the_bytes_megatron_moves_per_parameter():
    """With the distributed optimizer: the gradient reduce-scatter (fp32 with grad_reduce_in_fp32, else bf16) and
    the bf16 parameter all-gather, 4 + 2 or 2 + 2 bytes; without it the gradient all-reduce, 2 x the gradient's."""
    dense = ("model=qwen3_235b_a22b", H100, "hardware.nodes=32", "overlap.overlap_grad_reduce=false")
    dp = {(dist, fp32): _terms(*dense, f"optimizer.use_distributed_optimizer={dist}",
                               f"optimizer.grad_reduce_in_fp32={fp32}")["dp"]
          for dist in ("true", "false") for fp32 in ("true", "false")}
    assert dp[("true", "false")] == pytest.approx(dp[("true", "true")] * 4 / 6)
    assert dp[("false", "true")] == pytest.approx(dp[("true", "true")] * 8 / 6)
    assert dp[("false", "false")] == pytest.approx(dp[("true", "true")] * 4 / 6)


def test_interleaved_p2p_overlap_leaves_the_fill_and_drain_and_each_chunk_its_fixed_cost():
    """With overlap_p2p_comm (the interleaved schedule) the activations' bytes wait only in the fill and the drain,
    (PP - 1) / (VPP x M) of them; every chunk's send / receive pair costs pipeline_ms_per_chunk either way."""
    layout = ("model=qwen3_30b_a3b", H100, "hardware.nodes=4", "parallel.pipeline_model_parallel_size=4",
              "parallel.expert_model_parallel_size=8", "step_model.pipeline_ms_per_chunk=0")
    bytes_only = {vpp: {o: _terms(*layout, f"parallel.virtual_pipeline_model_parallel_size={vpp}",
                                  f"overlap.overlap_p2p_comm={o}") for o in ("true", "false")} for vpp in (2, 4)}
    m = resolve(compose_config("stage=plan", *layout)).batch.micro_batches_per_step
    for vpp, t in bytes_only.items():
        assert t["true"]["p2p"] == pytest.approx(t["false"]["p2p"] * 3 / (vpp * m))
    assert bytes_only[4]["false"]["p2p"] == pytest.approx(2 * bytes_only[2]["false"]["p2p"])  # twice the boundaries
    chunked = _terms(*layout[:-1], "step_model.pipeline_ms_per_chunk=0.5",
                     "parallel.virtual_pipeline_model_parallel_size=4")
    assert chunked["p2p"] == pytest.approx(bytes_only[4]["true"]["p2p"] + 4 * m * 0.5e-3)
    no_pp = _terms("model=qwen3_30b_a3b", H100, "hardware.nodes=4", "parallel.expert_model_parallel_size=8",
                   "step_model.pipeline_ms_per_chunk=0.5")
    assert no_pp["p2p"] == 0
