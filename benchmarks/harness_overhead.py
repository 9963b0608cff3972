"""Steady step time of the tiny MoE under ``python -m moe_hydra`` against a bare Megatron-Core loop.

The bare loop (:func:`bare_worker`) is Megatron-Core written out by hand: an explicit ``TransformerConfig``,
``DistributedDataParallelConfig`` and ``OptimizerConfig``, ``GPTModel``, ``get_megatron_optimizer`` and
``get_forward_backward_func``, with the job's data (``moe_hydra.job.data.MockData``) and the timed step of the
job (``Job._step``): zero the gradient buffer and the optimizer's gradients, forward/backward through the
schedule, the optimizer step, and on a GPU the device sync. It never calls moe_hydra's ``Job``; it shares only
the CPU shims of ``moe_hydra.job.compat`` (Megatron-Core does not run on a CPU build of torch without them) and
``moe_hydra.job.built.describe`` to write down what it built.

Same work, checked, not assumed (:mod:`moe_hydra.analysis.same_work` decides it): both sides write
``megatron_configs.json`` (the three configs handed to Megatron-Core, every field after ``__post_init__``), and the
bare loop records in ``work.json`` the run facts the configs do not hold (the ``GPTModel`` arguments, batch, steps
and window, data kind and seeds, no profiler, threads, backend, and facts read from the built model: parameters per
rank, classes of the dispatcher, experts and optimizer), which the job's results.json holds too. Each pair is
checked as soon as it has run: configs and run facts field by field, then the loss of every step (the same model,
data and steps give the same losses: bit for bit on the CPU, ``same_work.LOSS_RTOL``). The first pair that differs
ends the benchmark: it prints the differences and exits 1 without printing a ratio. ``same_work.IGNORED_FIELDS``
and ``same_work.NORMALIZED`` say what is not compared or is rewritten before comparing, and why.

Both sides start their ranks the same way (torch's elastic launcher, c10d rendezvous on localhost, spawn), with
the same threads per rank (on the CPU the job's ``train.cpu_threads``; torch's default on a GPU), seeds and layout (EP = the
process count, ETP 1), and time a step the same way: the ranks meet at a barrier, then the step is timed on each
rank (host clock; on a GPU up to ``torch.cuda.synchronize``), and the step's time is the slowest rank's. On a GPU the bare loop uses NCCL and ``cuda:LOCAL_RANK``, and the job runs with a GPU
hardware preset (``--hardware``, default h200_sxm); on the CPU, gloo and ``hardware=local_cpu``.

Runs alternate (moe_hydra, bare, moe_hydra, bare, ...); each side's figure is the median over its repeats of
the mean over the steady window (steps ``--first``..``--steps``). Two ratios are printed: the timed step (what
results.json reports as step_time_ms) and the whole loop per window step (wall time from the window's first step
to its last, including what the harness does between steps: the measurement all-reduces, logging).

    python benchmarks/harness_overhead.py [--repeats 3] [--procs 1|2] [--steps 40] [--first 6]
    python benchmarks/harness_overhead.py --procs 8 --hardware h200_sxm        # on a GPU node

Goal: ratio within 0.98..1.02 (a harness is not faster than the same work done bare, and costs <= 2 %).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from moe_hydra.analysis import same_work
from moe_hydra.core.errors import Refused

GOAL = (0.98, 1.02)
SEED = 1234  # the job's `seed` and `data.seed` (schema defaults)


# ---------------------------------------------------------------------------------------------------- bare loop


def bare_worker(steps: int, first: int, out_dir: str) -> None:
    """One rank of the bare Megatron-Core loop (started by :func:`launch_bare`: LOCAL_RANK etc. are set)."""
    import torch
    import torch.distributed as dist

    from moe_hydra.job import compat
    from moe_hydra.job.train import cpu_threads

    compat.apply()  # the CPU shims (and the no-TE fixes); changes nothing on a GPU with TE
    on_gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))  # as the job does
        device = torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    from moe_hydra.job import built
    from moe_hydra.job.data import MockData

    # Layout: EP over every rank, TP = PP = CP = ETP = 1, so DP = world and expert-DP = 1.
    ep = world
    ps.initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1, hierarchical_context_parallel_sizes=None, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1, num_distributed_optimizer_instances=1, order="tp-cp-ep-dp-pp",
    )
    # Transformer Engine's layers on a GPU where it is installed, Megatron's local (torch) layers otherwise; the
    # fused kernels are TE/Apex kernels, off without TE. Grouped-GEMM experts: the GPU presets' choice, where TE or
    # the grouped_gemm package provides them (the benchmark passes kernels.moe_grouped_gemm=false to the job
    # otherwise); sequential experts on the CPU. With TE, the swiglu's bias add and activation fused (the
    # performance recipes' choice, kernels.bias_activation_fusion's default).
    use_te = on_gpu and compat.te_available()
    grouped_gemm = on_gpu and (use_te or importlib.util.find_spec("grouped_gemm") is not None)
    fusions = {"bias_activation_fusion": True} if use_te else dict.fromkeys(
        ("bias_dropout_fusion", "bias_activation_fusion", "apply_rope_fusion", "masked_softmax_fusion",
         "persist_layer_norm", "gradient_accumulation_fusion"), False)
    cfg = TransformerConfig(
        # tiny_moe: 2 layers, hidden 128, 8 experts top-2
        num_layers=2, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4, num_query_groups=None,
        kv_channels=None, normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, add_qkv_bias=False, qk_layernorm=False, hidden_dropout=0.0, attention_dropout=0.0,
        mtp_num_layers=None,
        num_moe_experts=8, moe_ffn_hidden_size=256, moe_router_topk=2, moe_shared_expert_intermediate_size=None,
        moe_shared_expert_gate=False, moe_layer_freq=[1, 1], moe_router_score_function="softmax",
        moe_router_pre_softmax=False, moe_router_num_groups=None, moe_router_group_topk=None,
        moe_router_topk_scaling_factor=None, moe_router_enable_expert_bias=False,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01,
        # dispatcher=alltoall, routing=natural
        moe_token_dispatcher_type="alltoall", moe_router_force_load_balancing=False, moe_expert_capacity_factor=None,
        moe_pad_expert_input_to_capacity=False, moe_token_drop_policy="probs", moe_router_dtype="fp32",
        moe_router_padding_for_quantization=False,
        # parallelism
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1, sequence_parallel=False, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1, cp_comm_type="p2p", hierarchical_context_parallel_sizes=None,
        pipeline_model_parallel_layout=None, num_layers_in_first_pipeline_stage=None,
        num_layers_in_last_pipeline_stage=None, account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
        # precision=bf16
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bf16=True, fp16=False, fp8=None,
        fp8_recipe="delayed", fp8_param=False, fp4=None, fp4_recipe="nvfp4",
        # recompute=none, offload=none
        recompute_granularity=None, recompute_method=None, recompute_num_layers=None, recompute_modules=None,
        fine_grained_activation_offloading=False, offload_modules=None,
        # kernels, overlap (PP 1: p2p neither overlapped nor, on gloo, batched)
        moe_grouped_gemm=grouped_gemm, moe_permute_fusion=False, moe_router_fusion=False, cuda_graph_impl="none",
        tp_comm_overlap=False, overlap_p2p_comm=False, batch_p2p_comm=on_gpu,
        overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False, moe_shared_expert_overlap=False,
        use_cpu_initialization=not on_gpu,
        **fusions,
    )
    # The model: Megatron's own initialisation from the seed (the job runs with train.layout_invariant_init=false).
    torch.manual_seed(SEED)
    model_parallel_cuda_manual_seed(SEED)
    vocab, seq, mbs = 1024, 128, 4  # 1024 is already a multiple of make_vocab_size_divisible_by (128) x TP
    gpt = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_decoder_block_spec(cfg, use_transformer_engine=use_te, normalization="RMSNorm"),
        vocab_size=vocab, max_sequence_length=seq, pre_process=True, post_process=True,
        share_embeddings_and_output_weights=False, position_embedding_type="rope", rotary_base=10000,
    )
    if on_gpu:
        gpt.cuda(torch.cuda.current_device())
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, overlap_param_gather=False,
        use_distributed_optimizer=True, num_distributed_optimizer_instances=1,
    )
    model = DistributedDataParallel(config=cfg, ddp_config=ddp_cfg, module=Float16Module(cfg, gpt))
    opt_cfg = OptimizerConfig(
        optimizer="adam", lr=1e-3, min_lr=1e-3, weight_decay=0.01, clip_grad=1.0, bf16=True, fp16=False,
        params_dtype=torch.bfloat16, use_distributed_optimizer=True, use_precision_aware_optimizer=False,
        main_grads_dtype=torch.float32, main_params_dtype=torch.float32, exp_avg_dtype=torch.float32,
        exp_avg_sq_dtype=torch.float32, overlap_param_gather=False, optimizer_cpu_offload=False,
        optimizer_offload_fraction=0.0,
    )
    optimizer = get_megatron_optimizer(opt_cfg, [model])
    cfg.finalize_model_grads_func = finalize_model_grads

    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    microbatches = 1  # global batch = micro batch x world size (train.global_batch_size: null), one per DP rank
    data = MockData(vocab, seq, mbs, mbs * world, microbatches, SEED)
    position_ids = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, seq)
    mask = None if use_te else torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool, device=device), diagonal=1)

    def forward_step(data_iterator, m):
        tokens, labels = next(data_iterator)
        tokens, labels = tokens.to(device), labels.to(device)
        output = m(tokens, position_ids, mask, labels=labels)

        def loss_func(per_token_loss):
            loss = per_token_loss.float().mean()
            return loss, {"lm loss": loss.detach().clone()}

        return output, loss_func

    forward_backward = get_forward_backward_func()
    times, local_losses, loop_ms, window_start = [], [], 0.0, 0.0
    for step in range(1, steps + 1):
        if step == first:
            window_start = time.perf_counter()
        it = iter([data.batch(step - 1, dp_rank, mb) for mb in range(microbatches)])
        # The timing method of the job's step: the ranks meet first, so no rank's timed step holds its wait for a
        # rank still finishing the previous step (with EP the first all-to-all would make it wait).
        dist.barrier()
        if on_gpu:
            start_evt, end_evt = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_evt.record()
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=it, model=model,
                                  num_microbatches=microbatches, seq_length=seq, micro_batch_size=mbs,
                                  forward_only=False)
        optimizer.step()
        if on_gpu:
            end_evt.record()
            torch.cuda.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3], device=device, dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's, as the job's
        times.append(float(elapsed))
        local_losses.append(sum(float(x["lm loss"]) for x in losses) / len(losses))
        if step == steps:
            loop_ms = (time.perf_counter() - window_start) * 1e3 / (steps - first + 1)

    # the global batch's loss per step, as the job reports it (the mean over DP ranks of each rank's loss)
    loss = torch.tensor(local_losses, dtype=torch.float64, device=device)
    dist.all_reduce(loss, group=ps.get_data_parallel_group(with_context_parallel=True))
    loss /= ps.get_data_parallel_world_size(with_context_parallel=True)
    moe = next(mod for mod in model.modules() if isinstance(mod, MoELayer))
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    run = {
        "world_size": world, "data_parallel_size": dp, "vocab_size": vocab, "max_sequence_length": seq,
        "share_embeddings_and_output_weights": False, "position_embedding_type": "rope", "rotary_base": 10000,
        "seq_length": seq, "micro_batch_size": mbs, "global_batch_size": mbs * world,
        "micro_batches_per_step": microbatches, "train_iters": steps, "window": [first, steps], "profile_steps": None,
        "seed": SEED, "data_kind": "mock", "data_seed": SEED, "layout_invariant_init": False,
        "params_per_rank": sum(p.numel() for p in model.parameters()),
        "layer_spec": "transformer_engine" if use_te else "local", "backend": dist.get_backend(),
        "torch_threads": torch.get_num_threads(), "dispatcher_class": type(moe.token_dispatcher).__name__,
        "experts_class": type(moe.experts).__name__, "local_experts_per_rank": moe.experts.num_local_experts,
        "param_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "optimizer_class": " / ".join(type(o).__name__ for o in inner), "ddp_class": type(model).__name__,
        "model_chunks": 1,
    }
    if rank == 0:
        Path(out_dir, same_work.CONFIGS_FILE).write_text(json.dumps(built.describe(cfg, ddp_cfg, opt_cfg), indent=1))
        Path(out_dir, same_work.LOOP_FILE).write_text(json.dumps({
            "step_time_ms": statistics.fmean(times[first - 1:]), "window_loop_ms_per_step": loop_ms,
            "step_times_ms": times, "loss_per_step": loss.tolist(), same_work.RUN_SECTION: run}, indent=1))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def launch_bare(procs: int, steps: int, first: int, out_dir: str) -> None:
    """:func:`bare_worker` on ``procs`` local ranks, started as the job starts its ranks
    (moe_hydra.launch.local.launch_local: torch's elastic launcher, c10d rendezvous on localhost, spawn)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from moe_hydra.launch.local import free_port

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=procs, run_id=uuid.uuid4().hex[:8], rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(Path(out_dir, "ranks")),
                                    redirects={r: Std.ALL if r else Std.NONE for r in range(procs)}),
    )
    elastic_launch(config, bare_worker)(steps, first, out_dir)


# ---------------------------------------------------------------------------------------------------- driver


def _run(cmd: list[str], cwd: str) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")


def _job_overrides(args: argparse.Namespace, on_gpu: bool) -> list[str]:
    """The job's command line: tiny_moe (the default model), EP over the processes, the steady window."""
    over = ["logger=none", f"hardware.devices_per_node={args.procs}",
            f"parallel.expert_model_parallel_size={args.procs}", "parallel.expert_tensor_parallel_size=1",
            f"contract.warmup_steps={args.first - 1}", f"contract.window=[{args.first},{args.steps}]",
            # Megatron's own initialisation, as the bare loop (a redraw changes the weights, hence the routing)
            "train.layout_invariant_init=false"]
    if on_gpu:
        over.insert(0, f"hardware={args.hardware}")
        te = importlib.util.find_spec("transformer_engine") is not None
        if not te:  # what the job detects anyway; the plan should say so too
            over.append("hardware.transformer_engine=false")
        if not (te or importlib.util.find_spec("grouped_gemm") is not None):
            over.append("kernels.moe_grouped_gemm=false")  # refused otherwise (H07); the bare loop does the same
    return over


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", type=int, default=1, help="ranks (= EP size; GPUs on a GPU node)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--first", type=int, default=6, help="first step of the steady window")
    ap.add_argument("--hardware", default="h200_sxm", help="the job's hardware preset on a GPU node (CPU: local_cpu)")
    ap.add_argument("--bare-launch", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 1 <= args.first <= args.steps:
        ap.error("need 1 <= --first <= --steps")
    if args.bare_launch:
        return launch_bare(args.procs, args.steps, args.first, args.bare_launch)
    on_gpu = _cuda_available()
    hardware = args.hardware if on_gpu else "local_cpu"
    loads = []  # the 1-minute load average after each pair
    with tempfile.TemporaryDirectory() as tmp:

        def ours(i: int) -> same_work.Work:
            run_dir = f"{tmp}/ours{i}"
            _run([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={run_dir}", *_job_overrides(args, on_gpu)], tmp)
            return same_work.read_job(Path(run_dir))

        def bare(i: int) -> same_work.Work:
            out = Path(tmp, f"bare{i}")
            out.mkdir()
            _run([sys.executable, os.path.abspath(__file__), "--bare-launch", str(out), f"--procs={args.procs}",
                  f"--steps={args.steps}", f"--first={args.first}"], tmp)
            loads.append(os.getloadavg()[0])
            return same_work.read_loop(out, "bare")

        try:
            pairs = same_work.alternate(args.repeats, ours, bare, same_work.LOSS_RTOL["gpu" if on_gpu else "cpu"])
        except Refused as e:  # a program left no readable record of its work
            sys.exit(str(e))
    if not pairs.same:  # refused on the first pair that differs, before the other repeats are spent
        sys.exit(pairs.refusal)
    print(f"tiny_moe on {hardware}, {args.procs} process(es), EP{args.procs}, steps {args.first}..{args.steps} of "
          f"{args.steps}, {args.repeats} alternating repeats (median); the same configs "
          f"({', '.join(same_work.CONFIG_SECTIONS)}, {same_work.RUN_SECTION}) and losses")
    for key, label in (("step_time_ms", "timed step"), ("window_loop_ms_per_step", "whole loop per step")):
        r = pairs.ratio(key)
        print(f"{label:20s}  moe_hydra {r.a_median:7.1f} ms   bare Megatron-Core loop {r.b_median:7.1f} ms   "
              f"ratio {r.ratio:.3f}  (goal {GOAL[0]:.2f}..{GOAL[1]:.2f})")
        # the machine's load drifts between pairs more than within one: each pair's ratio is shown too
        print(f"{'':20s}  per repeat: moe_hydra {' '.join(f'{x:.1f}' for x in r.a_ms)}   "
              f"bare {' '.join(f'{x:.1f}' for x in r.b_ms)}   pair ratios {' '.join(f'{x:.3f}' for x in r.pair_ratios)}"
              f" (median {statistics.median(r.pair_ratios):.3f})")
    # Both programs keep the cores busy (the CPU: a thread per core, one left over); a 1-minute load average well
    # above the cores means other work shared them during the runs, which moves a run's mean by far more than 2 %.
    cores = os.cpu_count() or 1
    print(f"load average (1 min) after each pair: {' '.join(f'{x:.1f}' for x in loads)} on {cores} cores"
          + ("  -- other work shared the machine: the ratio is not reliable to 2 %" if max(loads) > cores + 0.5
             else ""))


if __name__ == "__main__":
    main()
