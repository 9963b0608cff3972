"""Steady step time of the tiny MoE under ``python -m moe_hydra`` against a bare Megatron-Core loop.

The bare loop (below, :func:`bare_worker`) builds the same model (the tiny_moe preset's values, bf16,
local spec, DDP + DistributedOptimizer) with Megatron-Core directly and runs the same steps on the
same process count, with the same data; only the CPU shims of ``moe_hydra.job.compat`` are shared,
since Megatron-Core does not run on a CPU build of torch without them. Runs alternate
(moe_hydra, bare, moe_hydra, bare, ...) and each side's figure is the median over its repeats of the
mean over the steady window.

Two ratios are printed: the timed step (what results.json reports) and the whole loop per window
step (including what the harness does between steps: measurement sync, logging).

    python benchmarks/harness_overhead.py [--repeats 3] [--procs 1|2] [--steps 40]

Goal: ratio <= 1.02.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = dict(num_layers=2, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4, vocab=1024, seq=128,
            experts=8, moe_ffn=256, topk=2, mbs=4, lr=1e-3, aux=0.01)


def bare_worker(steps: int, first: int, out: str) -> None:
    """One rank of the bare loop (torchrun / elastic environment)."""
    import torch
    import torch.distributed as dist

    from moe_hydra.job import compat

    compat.apply()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from moe_hydra.job.data import MockData

    ps.initialize_model_parallel(expert_model_parallel_size=world, expert_tensor_parallel_size=1)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    t = TINY
    cfg = TransformerConfig(
        num_layers=t["num_layers"], hidden_size=t["hidden_size"], ffn_hidden_size=t["ffn_hidden_size"],
        num_attention_heads=t["num_attention_heads"], num_moe_experts=t["experts"], moe_ffn_hidden_size=t["moe_ffn"],
        moe_router_topk=t["topk"], moe_aux_loss_coeff=t["aux"], moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=world, expert_tensor_parallel_size=1, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, use_cpu_initialization=True, gradient_accumulation_fusion=False,
        bias_dropout_fusion=False, bias_activation_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, moe_router_dtype="fp32",
    )
    gpt = GPTModel(config=cfg, transformer_layer_spec=get_gpt_decoder_block_spec(cfg, use_transformer_engine=False),
                   vocab_size=t["vocab"], max_sequence_length=t["seq"], position_embedding_type="rope")
    model = DistributedDataParallel(config=cfg, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=True), module=Float16Module(cfg, gpt))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=t["lr"], bf16=True, params_dtype=torch.bfloat16,
                                                 use_distributed_optimizer=True, clip_grad=1.0, weight_decay=0.01),
                                 [model])
    cfg.finalize_model_grads_func = finalize_model_grads
    fb = get_forward_backward_func()
    data = MockData(t["vocab"], t["seq"], t["mbs"], t["mbs"] * world, 1, 1234)  # one micro-batch per DP rank
    pos = torch.arange(t["seq"]).unsqueeze(0).expand(t["mbs"], t["seq"])
    mask = torch.triu(torch.ones(1, 1, t["seq"], t["seq"], dtype=torch.bool), diagonal=1)

    def forward_step(it, m):
        tokens, labels = next(it)
        out = m(tokens, pos, mask, labels=labels)
        return out, lambda o: (o.float().mean(), {})

    times, rank = [], dist.get_rank()
    for step in range(1, steps + 1):
        if step == first:
            loop_start = time.perf_counter()
        it = iter([data.batch(step - 1, rank, 0)])
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        fb(forward_step_func=forward_step, data_iterator=it, model=model, num_microbatches=1,
           seq_length=t["seq"], micro_batch_size=t["mbs"], forward_only=False)
        opt.step()
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    loop_ms = (time.perf_counter() - loop_start) * 1e3 / (steps - first + 1)
    if rank == 0:
        Path(out).write_text(json.dumps({"step_time_ms": statistics.fmean(times[first - 1:]),
                                         "window_loop_ms_per_step": loop_ms}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], cwd: str) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--first", type=int, default=6, help="first step of the steady window")
    ap.add_argument("--bare-worker", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_worker:
        return bare_worker(args.steps, args.first, args.bare_worker)
    ours, bare = [], []
    with tempfile.TemporaryDirectory() as tmp:
        mesh = [f"hardware.devices_per_node={args.procs}", f"parallel.expert_model_parallel_size={args.procs}",
                "parallel.expert_tensor_parallel_size=1"]
        for i in range(args.repeats):
            run_dir = f"{tmp}/ours{i}"
            _run([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={run_dir}", "logger=none", *mesh,
                  f"contract.warmup_steps={args.first - 1}", f"contract.window=[{args.first},{args.steps}]",
                  "train.layout_invariant_init=false"], tmp)
            ours.append(json.loads(Path(run_dir, "results.json").read_text()))
            out = f"{tmp}/bare{i}.json"
            _run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.procs}",
                  f"--master-port={_free_port()}",
                  __file__, "--bare-worker", out, f"--steps={args.steps}", f"--first={args.first}"], tmp)
            bare.append(json.loads(Path(out).read_text()))
    print(f"tiny_moe, {args.procs} process(es), EP{args.procs}, steps {args.first}..{args.steps} of {args.steps}, "
          f"{args.repeats} alternating repeats (median)")
    for key, label in (("step_time_ms", "timed step"), ("window_loop_ms_per_step", "whole loop per step")):
        o, b = statistics.median(r[key] for r in ours), statistics.median(r[key] for r in bare)
        print(f"{label:20s}  moe_hydra {o:7.1f} ms   bare Megatron-Core loop {b:7.1f} ms   ratio {o / b:.3f}"
              f"  (goal <= 1.02)")


if __name__ == "__main__":
    main()
