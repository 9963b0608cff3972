"""The memory estimate: Megatron's bytes per parameter and shards, the schedule's micro-batches in
flight, what recompute and offload remove, the verdict in plan.json, and stage=run's refusal."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from moe_hydra.core.resolved import resolve
from moe_hydra.planning import memory, plan
from tests.conftest import compose_config

H100 = "hardware=h100_sxm"
DSV3 = ("model=deepseek_v3", H100, "hardware.nodes=128", "mesh=dsv3_h100_1024")
QWEN30_EP16 = ("model=qwen3_30b_a3b", H100, "hardware.nodes=2", "expert_mesh=ep16")


def _assess(*overrides: str):
    cfg = compose_config("stage=plan", *overrides)
    return cfg, plan.assess(resolve(cfg))


@pytest.mark.parametrize("overrides,per_param,shard_bytes", [
    # bf16 weights, fp32 grads, distributed optimizer: 2 + 4 bytes here, 12 bytes sharded (Megatron's 6 + 12/d)
    ((), 6, 12),
    # fp32 weights: no separate master copy, 4 + 4 here, Adam's 8 sharded
    (("precision=fp32",), 8, 8),
    # precision-aware optimizer with bf16 moments: master 4 + m 2 + v 2
    (("optimizer.use_precision_aware_optimizer=true", "optimizer.exp_avg_dtype=bf16",
      "optimizer.exp_avg_sq_dtype=bf16"), 6, 8),
    # the bf16 gradient buffer of Megatron-Core's DDP default and Bridge's benchmark mode
    (("optimizer.grad_reduce_in_fp32=false",), 4, 12),
])
def test_static_memory_is_megatrons_bytes_per_parameter(overrides, per_param, shard_bytes):
    cfg, a = _assess(*QWEN30_EP16, *overrides)
    (rank,), (stage,) = a.ranks, a.stages
    lo = a.r.layout
    assert (lo.dp, lo.edp) == (16, 1)
    assert stage.weights + stage.gradients == rank.total * per_param
    # dense state sharded over DP x CP = 16, expert state over EDP = 1
    assert stage.optimizer == pytest.approx(shard_bytes * (rank.dense / 16 + rank.expert / 1))


def test_expert_state_shards_over_expert_data_parallel():
    _, ep16 = _assess(*QWEN30_EP16)
    _, ep8 = _assess("model=qwen3_30b_a3b", H100, "hardware.nodes=2", "expert_mesh=ep8")
    assert ep8.r.layout.edp == 2 and ep8.ranks[0].expert == 2 * ep16.ranks[0].expert
    # twice the experts per rank, over twice the shards: the same expert optimizer state
    expert_state = [s.optimizer - 12 * r.dense / 16 for s, r in ((ep16.stages[0], ep16.ranks[0]), (ep8.stages[0], ep8.ranks[0]))]
    assert expert_state[0] == pytest.approx(expert_state[1])


def test_no_distributed_optimizer_keeps_the_whole_state():
    _, a = _assess(*QWEN30_EP16, "optimizer.use_distributed_optimizer=false")
    assert a.stages[0].optimizer == 12 * a.ranks[0].total


def _megatron_in_flight(pp: int, vpp: int | None, rank: int, m: int) -> int:
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    comm = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)
    total, _, warmup, _ = get_pp_rank_microbatches(m, vpp or 1, pp, p2p_communicator=comm)[:4]
    return min(warmup + 1, total)


@pytest.mark.parametrize("pp,vpp", [(2, None), (4, None), (8, None), (2, 2), (4, 2), (8, 4)])
def test_micro_batches_in_flight_follow_megatrons_schedule(pp, vpp):
    for m in (pp, 2 * pp, 4 * pp) if vpp else (1, pp - 1, pp, 3 * pp):
        for rank in range(pp):
            chunks, _ = memory.in_flight_chunks(pp, vpp, rank, m)
            assert chunks == _megatron_in_flight(pp, vpp, rank, m), (pp, vpp, m, rank)


def test_recompute_and_offload_remove_activations_in_the_workflows_order():
    act = {}
    for name, extra in {"none": (), "selective": ("recompute=selective",), "full": ("recompute=full",),
                        "offload": ("offload=fine_grained",)}.items():
        _, a = _assess(*DSV3, *extra)
        act[name] = a.peak.activations
    assert act["none"] > act["selective"] > act["full"]
    assert act["offload"] < act["none"]


def test_full_recompute_keeps_one_hidden_state_per_layer_and_micro_batch():
    cfg, a = _assess(*DSV3, "recompute=full")
    est = memory.Estimator(a.r)
    stage2 = a.stages[2]  # 8 MoE layers, no embedding, loss or MTP; 35 model-chunk micro-batches in flight
    assert stage2.in_flight == 35 / 4
    assert stage2.activations == pytest.approx(8 * est.hidden * 35 / 4 + est.full_moe)  # + one layer recomputed live


def test_selective_recompute_drops_exactly_its_terms():
    cfg, _ = _assess(*DSV3, "recompute=selective")
    lo_cfg, a = _assess(*DSV3)
    terms = memory.layer_terms(a.r, True)
    dropped = {t for m in cfg.recompute.recompute_modules for t in memory.RECOMPUTE_DROPS[m]}
    est_none = memory.Estimator(a.r)
    est_sel = memory.Estimator(resolve(cfg))
    assert est_none.moe_layer - est_sel.moe_layer == pytest.approx(sum(terms[t] for t in dropped if t in terms))


def test_a_clamped_glu_keeps_its_clamped_copy_until_moe_act_recompute_drops_it():
    """GPT-OSS: the fused activation keeps the clamped copy of fc1's output (2 x the expert width per routed row,
    bf16) while the clamps keep fc1's output itself; recomputing moe_act drops the copy with the output."""
    oss = ("model=gpt_oss_120b", H100, "hardware.nodes=8", "parallel.expert_model_parallel_size=8")
    clamped = memory.layer_terms(_assess(*oss)[1].r, True)
    plain = memory.layer_terms(_assess(*oss, "model.activation_func_clamp_value=null")[1].r, True)
    assert "moe_act_clamped" not in plain and {k: v for k, v in clamped.items() if k != "moe_act_clamped"} == plain
    assert clamped["moe_act_clamped"] == pytest.approx(plain["expert_act_in"])  # the same 2 x width, bf16
    _, recomputed = _assess(*oss, "recompute=selective", "recompute.recompute_modules=[moe_act]")
    assert memory.Estimator(_assess(*oss)[1].r).moe_layer - memory.Estimator(recomputed.r).moe_layer == (
        pytest.approx(clamped["moe_act_clamped"] + clamped["moe_act"]))


def test_mla_attention_holds_q_k_v_once_and_its_output_once():
    """Megatron-Core's MLA feeds the up-projections' outputs only to RoPE, whose kernels keep cos and sin, so what
    the attention holds of them is q, k (after RoPE) and v, which ``mla_up_proj`` discards. The attention output
    is kept once, by the attention, in bf16: the projection saves the same tensor (FP8 recipes too, except
    delayed scaling, whose projection also keeps the quantized copy)."""
    _, a = _assess(*DSV3)  # TP 2: the core attention sees all 4096 tokens, half the heads
    terms, m = memory.layer_terms(a.r, True), a.r.arch
    tokens, heads = 4096, m.heads / 2
    qkv = tokens * heads * (2 * (m.qk_head_dim + m.qk_pos_emb_head_dim) + m.v_head_dim) * 2
    held = sum(v for k, v in terms.items() if k not in ("attn_norm", "qkv_linear", "mla_down", "core_attn_internal",
                                                         "attn_proj", "mlp_norm", "mlp_input", "router", "expert_fc1",
                                                         "expert_act_in", "moe_act", "expert_probs", "shared_experts"))
    assert held == pytest.approx(qkv)  # nothing but q, k, v between the latents and the core attention
    cfg, _ = _assess(*DSV3, "recompute=selective", "recompute.recompute_modules=[mla_up_proj]")
    assert memory.Estimator(a.r).moe_layer - memory.Estimator(resolve(cfg)).moe_layer == pytest.approx(qkv)
    output = tokens * heads * m.v_head_dim
    for precision, per_element in (("bf16", 2), ("fp8_blockwise", 2), ("fp8_tensorwise", 2), ("fp8_delayed", 3)):
        _, p = _assess(*DSV3, f"precision={precision}")
        assert memory.layer_terms(p.r, True)["attn_proj"] == pytest.approx(output * per_element), precision


def test_tensor_parallel_with_sequence_parallel_halves_every_activation():
    cfg1, tp1 = _assess("model=qwen3_30b_a3b", H100, "expert_mesh=ep8")
    cfg2, tp2 = _assess("model=qwen3_30b_a3b", H100, "expert_mesh=ep4", "attention_mesh=tp2",
                        "parallel.sequence_parallel=true", "parallel.expert_tensor_parallel_size=1")
    one = memory.layer_terms(tp1.r, True)
    two = memory.layer_terms(tp2.r, True)
    assert one.keys() == two.keys()
    for term in one:
        assert two[term] == pytest.approx(one[term] / 2), term
    # without sequence parallelism the hidden-state rows are not split
    cfg3 = dataclasses.replace(cfg2, parallel=dataclasses.replace(cfg2.parallel, sequence_parallel=False))
    three = memory.layer_terms(resolve(cfg3), True)
    assert three["attn_norm"] == one["attn_norm"] and three["core_attn"] == two["core_attn"]


def test_activations_grow_with_micro_batch_and_top_k():
    _, b1 = _assess(*QWEN30_EP16)
    _, b2 = _assess(*QWEN30_EP16, "train.micro_batch_size=2")
    assert b2.stages[0].activations == pytest.approx(2 * b1.stages[0].activations)
    cfg, a = _assess(*QWEN30_EP16)
    k8 = memory.layer_terms(a.r, True)
    cfg4 = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, moe_router_topk=4))
    k4 = memory.layer_terms(resolve(cfg4), True)
    for term in ("expert_fc1", "expert_act_in", "moe_act", "expert_probs"):
        assert k8[term] == pytest.approx(2 * k4[term])
    assert k8["attn_norm"] == k4["attn_norm"]


# Measured on one H200 without Transformer Engine (issue 14: torch 2.11+cu130, megatron-core 0.16.1 and 0.19.2;
# the local spec, sequential experts, unfused attention, torch's Adam), torch.cuda.max_memory_allocated. Not used
# to fit anything: the optimizer step's temporary is 4 bytes per parameter of the stepped shard.
H200_LOCAL = ("model=qwen3_30b_a3b", "model.num_layers=4", "model.seq_length=1024", "train.global_batch_size=8",
              "hardware=h200_sxm", "hardware.devices_per_node=1", "kernels.moe_grouped_gemm=false")


@pytest.mark.parametrize("mbs,measured_gib", [(1, 63.96), (4, 64.15)])
def test_torch_adams_fp32_temporary_is_the_peak_measured_without_transformer_engine(mbs, measured_gib):
    _, local = _assess(*H200_LOCAL, "hardware.transformer_engine=false", f"train.micro_batch_size={mbs}")
    peak = local.peak
    assert local.r.impl.optimizer == "torch" and peak.optimizer_step > peak.activations  # the step is the peak
    assert peak.optimizer_step == pytest.approx(4 * local.ranks[0].total)  # DP 1: the shard is every parameter
    assert (peak.total - peak.allowance) / memory.GIB == pytest.approx(measured_gib, rel=0.05)
    # Transformer Engine's fused Adam holds no such temporary: the backward pass is the peak again
    _, te = _assess(*H200_LOCAL, f"train.micro_batch_size={mbs}")
    assert te.r.impl.optimizer == "fused" and te.peak.optimizer_step == 0 and te.peak.total < peak.total


@pytest.mark.parametrize("mbs,measured_gib", [(1, 2.36), (4, 9.39)])
def test_forward_backward_activations_are_within_15_percent_of_the_h200_measurement(mbs, measured_gib):
    """The same runs, the forward/backward peak above what the rank holds after its first step (states,
    workspaces, the score buffer): the estimate was 1.12 and 4.46 GiB before the unfused attention's fp32
    softmax and the logits beside the cross-entropy's fp32 copy were counted. What is left out: the backward
    pass's other transients (each layer's gradients as they are made)."""
    _, local = _assess(*H200_LOCAL, "hardware.transformer_engine=false", f"train.micro_batch_size={mbs}")
    assert local.peak.activations / memory.GIB == pytest.approx(measured_gib, rel=0.15)


def test_unfused_attention_keeps_the_fp32_softmax_and_the_bf16_probabilities_and_one_score_buffer():
    """Megatron's local DotProductAttention with bf16 scores: the softmax runs in fp32 and keeps its output for
    its backward, the bmm with v keeps the bf16 probabilities (4 + 2 bytes an element, per layer); the raw
    scores go to one global buffer that every layer reuses."""
    _, local = _assess(*H200_LOCAL, "hardware.transformer_engine=false", "train.micro_batch_size=2")
    _, te = _assess(*H200_LOCAL, "train.micro_batch_size=2")
    assert (local.r.impl.attention, te.r.impl.attention) == ("unfused", "flash")
    elements = 2 * 32 * 1024 * 1024  # b x heads x s x s
    internal = memory.layer_terms(local.r, True)["core_attn_internal"]
    assert internal == pytest.approx(elements * (4 + 2))
    buffer = memory.score_buffer_bytes(local.r)
    assert buffer == pytest.approx(elements * 2) and memory.score_buffer_bytes(te.r) == 0
    assert local.peak.workspaces == pytest.approx(memory.workspace_bytes("hopper", local.r.impl) + buffer)


def test_cublas_workspaces_follow_the_implementation():
    """torch keeps two (forward thread, autograd thread), Transformer Engine one more plus four for grouped GEMM's
    streams: 32 MiB each from Hopper on; none on the CPU."""
    mib = 2**20
    _, local = _assess(*H200_LOCAL, "hardware.transformer_engine=false")
    _, te = _assess(*H200_LOCAL)
    _, te_grouped = _assess(*H200_LOCAL, "kernels.moe_grouped_gemm=true")
    assert local.r.impl.te is False and local.peak.workspaces == 2 * 32 * mib + memory.score_buffer_bytes(local.r)
    assert te.r.impl.experts == "sequential" and te.peak.workspaces == 3 * 32 * mib
    assert te_grouped.r.impl.experts == "grouped" and te_grouped.peak.workspaces == 7 * 32 * mib
    _, cpu = _assess()
    assert cpu.peak.workspaces == 0
    a100 = memory.workspace_bytes("ampere", local.r.impl)
    assert a100 == 2 * (8 * mib + 128 * 2**10)
    assert te.peak.total - te.peak.allowance == pytest.approx(
        te.peak.weights + te.peak.gradients + te.peak.optimizer + te.peak.activations + te.peak.workspaces)


def test_allowance_is_declared_and_conditional():
    cfg, a = _assess(*QWEN30_EP16)
    flex, fa = _assess(*QWEN30_EP16, "dispatcher=deepep")
    gib = memory.GIB
    assert memory.allowance(cfg)["flex_dispatcher"] == 0 and memory.allowance(flex)["flex_dispatcher"] == 2 * gib
    est = a.stages[0].total - a.stages[0].allowance
    assert a.stages[0].allowance == pytest.approx((0.75 + 1.5) * gib + 0.05 * est)
    cpu, c = _assess()
    assert c.stages[0].allowance == 0


# ----------------------------------------------------------------------------- plan.json and the CLI

@pytest.mark.slow
def test_plan_reports_memory_and_fits(cli, tmp_path):
    r = cli("stage=plan", *QWEN30_EP16)
    assert r.returncode == 0, r.stderr
    p = json.loads((tmp_path / "run" / "plan.json").read_text())
    m = p["memory"]
    assert p["fits"] is True and m["capacity"] == 80 and m["margin"] == pytest.approx(80 - m["total"], abs=1e-3)
    parts = (m["weights"] + m["gradients"] + m["optimizer"] + max(m["activations"], m["optimizer_step"])
             + m["workspaces"] + m["allowance"])
    assert m["total"] == pytest.approx(parts, abs=1e-4)
    assert set(m["breakdown"]["allowance"]) == {"cuda_context", "nccl", "flex_dispatcher", "cuda_graphs", "fragmentation"}
    assert "memory / rank" in r.stdout and "fits" in r.stdout


@pytest.mark.slow
def test_a_layout_that_does_not_fit_is_information_for_plan(cli, tmp_path):
    r = cli("stage=plan", *DSV3)
    assert r.returncode == 0, r.stderr
    p = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert p["fits"] is False and p["memory"]["margin"] < 0
    steps = [" ".join(s["overrides"]) for s in p["memory_suggestions"]]
    # the workflow's order: selective -> full recompute -> offload -> more model parallelism
    assert steps[0].startswith("recompute=selective recompute.recompute_modules=[") and "mla_up_proj" in steps[0]
    assert steps[1:3] == ["recompute=full", "recompute=full offload=fine_grained"]
    assert all("parallel." in s for s in steps[3:]) and steps[3:]
    assert any(s["fits"] for s in p["memory_suggestions"])
    totals = [s["total_gib"] for s in p["memory_suggestions"][:2]]
    assert totals[0] > totals[1]
    assert "next step" in r.stdout


@pytest.mark.slow
def test_run_refuses_a_layout_that_does_not_fit_before_starting(cli, tmp_path):
    # 20 MiB of "device memory" for the tiny model on this machine
    r = cli("hardware.memory_gib=0.02")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "[M01]" in r.stderr and "memory.refuse_unfit=false" in r.stderr
    assert not (tmp_path / "run" / "results.json").exists()
    assert json.loads((tmp_path / "run" / "violations.json").read_text())["violations"][0]["rule"] == "M01"


@pytest.mark.slow
def test_run_goes_ahead_when_told_to(cli, tmp_path):
    r = cli("hardware.memory_gib=0.02", "memory.refuse_unfit=false", "contract.window=[2,3]",
            "contract.warmup_steps=1", "logger=none", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["fits"] is False


@pytest.mark.slow
def test_recompute_sweep_plans_each_option(cli, tmp_path):
    r = cli("stage=plan", "model=deepseek_v3", H100, "hardware.nodes=32", "expert_mesh=ep8", "-m",
            "recompute=none,selective,full")
    assert r.returncode == 0, r.stderr
    plans = [json.loads(p.read_text()) for p in sorted((tmp_path / "multi").glob("*/plan.json"))]
    act = [p["memory"]["activations"] for p in plans]
    assert len(act) == 3 and act[0] > act[1] > act[2]


@pytest.mark.gpu
def test_tiny_model_peak_memory_matches_the_estimate_on_a_gpu(cli, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: compares torch.cuda.max_memory_allocated with the estimate")
    r = cli("hardware=h100_sxm", "hardware.devices_per_node=1", "kernels.moe_grouped_gemm=false", "logger=none",
            timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    phases = res["memory_phases_gib"]  # where the peak sits; the run's peak is the largest phase's
    assert max(phases[p] for p in ("between_steps", "forward_backward", "optimizer_step")) <= res["peak_memory_gib"][
        "allocated"] and 0 < phases["after_first_step"] <= phases["optimizer_step"], phases
    assert abs(res["memory_vs_estimate"]["error"]) <= 0.10, (res["memory_vs_estimate"], phases)


def test_fp8_weights_and_bf16_moments_and_muon_shrink_the_states_they_hold():
    base = (*QWEN30_EP16, "precision=fp8_tensorwise")
    _, plain = _assess(*base)
    _, fp8_weights = _assess(*base, "precision.fp8_param_gather=true")
    assert fp8_weights.stages[0].weights == pytest.approx(plain.stages[0].weights / 2)  # 1 byte a weight, not 2
    assert fp8_weights.stages[0].optimizer == plain.stages[0].optimizer  # the fp32 master copy stays
    _, aware = _assess(*base, "optimizer.use_precision_aware_optimizer=true", "optimizer.exp_avg_dtype=bf16",
                       "optimizer.exp_avg_sq_dtype=bf16")
    assert aware.stages[0].optimizer == pytest.approx(plain.stages[0].optimizer * (4 + 2 + 2) / 12)
    _, muon = _assess(*base, "optimizer.optimizer=muon")
    assert muon.stages[0].optimizer == pytest.approx(plain.stages[0].optimizer * (4 + 4) / 12)  # master + momentum
