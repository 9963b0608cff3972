"""Throughput figures from per-step records, by Megatron-Core's definitions (docs/flops-memory.md).

    step time       mean wall time of the steps in the declared steady window (slowest rank per step)
    tokens/s/GPU    tokens_per_step / (step_time x world_size)
    TFLOP/s/GPU     model FLOPs per step / (step_time x 1e12 x world_size)
    MFU             TFLOP/s/GPU / dense peak of the compute precision (null when the peak is unknown)

Warmup steps never enter a statistic. Pure: standard library only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int  # 1-based
    time_ms: float  # wall time of the step, max over ranks
    loss: float  # language-model loss, averaged over the global batch
    host_ms: float | None = None  # time the host spent issuing the step (GPU: before the final sync)
    device_ms: float | None = None  # device time between CUDA events (GPU only)
    grad_norm: float | None = None
    skipped: bool = False  # the optimizer skipped the update (non-finite gradients)
    memory_gib: float | None = None  # rank 0's peak so far (GPU: max allocated; CPU: peak RSS)


def peak_tflops(hardware: Any, precision: Any) -> tuple[float | None, str | None]:
    """The dense peak for the compute precision, and which field it came from."""
    if precision.fp4:
        field = "peak_tflops_fp4"
    elif precision.fp8:
        field = "peak_tflops_fp8"
    else:
        field = "peak_tflops_bf16"
    value = getattr(hardware, field)
    return (float(value), f"hardware.{field}") if value else (None, None)


# The share of its datasheet peak a GPU's best-shape matmul reaches where the preset declares no measurement: about
# what mamf-finder measures on NVIDIA's (A100 0.87, H100 0.80, B200 0.78, GB200 0.73; AMD's run lower)
UNMEASURED_MATMUL_SHARE = 0.8
# the bf16 compute precision, for the parts that run in bf16 under any recipe (the logits, core attention)
BF16 = SimpleNamespace(fp8=None, fp4=None)


def matmul_tflops(hardware: Any, precision: Any) -> float | None:
    """The best-shape GEMM rate of the compute precision: ``hardware.matmul_tflops_bf16`` / ``_fp8`` (measured),
    FP4 at the FP8 measurement's share of its peak; :data:`UNMEASURED_MATMUL_SHARE` of the peak where nothing is
    measured. None without a peak."""
    peak, _ = peak_tflops(hardware, precision)
    if precision.fp4 or precision.fp8:
        measured, of = hardware.matmul_tflops_fp8, hardware.peak_tflops_fp8
    else:
        measured, of = hardware.matmul_tflops_bf16, hardware.peak_tflops_bf16
    if not peak:
        return None
    return peak * measured / of if measured and of else peak * UNMEASURED_MATMUL_SHARE


def window_steps(records: list[StepRecord], window: list[int]) -> list[StepRecord]:
    first, last = window
    return [r for r in records if first <= r.step <= last]


def summarize(
    records: list[StepRecord],
    *,
    window: list[int],
    warmup_steps: int,
    tokens_per_step: int,
    world_size: int,
    flops_per_token: float,
    peak: float | None,
    stopped: bool = False,
) -> dict[str, Any]:
    """The throughput part of ``results.json``. ``stopped``: the run was stopped by a signal before the end of
    its window; the figures are then those of the window steps it measured (``window_measured``), None when
    it measured none."""
    steady = window_steps(records, window)
    if not steady and not stopped:
        raise ValueError(f"no step in the window {window}: the run has {len(records)} steps")
    times = [r.time_ms for r in steady]
    step_ms = statistics.fmean(times) if times else None
    tokens_per_s_per_gpu = tokens_per_step / (step_ms / 1e3 * world_size) if times else None
    tflops = flops_per_token * tokens_per_s_per_gpu / 1e12 if times else None
    losses = [r.loss for r in records]
    finite = [x for x in losses if math.isfinite(x)]

    def mean_or_none(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    return {
        "steps": len(records),
        "warmup_steps": warmup_steps,
        "window": list(window),
        "window_measured": [steady[0].step, steady[-1].step] if steady else None,
        "step_times_ms": [r.time_ms for r in records],
        "host_times_ms": [r.host_ms for r in records],
        "device_times_ms": [r.device_ms for r in records],
        "step_time_ms": step_ms,
        "step_time_ms_std": statistics.stdev(times) if len(times) > 1 else 0.0,
        "host_time_ms": mean_or_none(r.host_ms for r in steady),
        "device_time_ms": mean_or_none(r.device_ms for r in steady),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "tflops_per_gpu": tflops,
        "mfu": tflops / peak if peak and times else None,
        "loss": {
            "first": losses[0] if losses else None,
            "last": losses[-1] if losses else None,
            "per_step": losses,
            "all_finite": len(finite) == len(losses),
            "nan_or_skipped": sum(1 for r in records if r.skipped or not math.isfinite(r.loss)),
        },
        "grad_norms": [r.grad_norm for r in records],
        "memory_gib_per_step": [r.memory_gib for r in records],
    }


def log_line(r: StepRecord, tokens_per_step: int, world_size: int, flops_per_token: float,
             peak: float | None, memory_gib: float | None) -> str:
    """One torchtitan-style line: step, loss, tokens/s/GPU, TFLOP/s/GPU, MFU, memory."""
    tps = tokens_per_step / (r.time_ms / 1e3 * world_size)
    tflops = flops_per_token * tps / 1e12
    mfu = f"  mfu {100 * tflops / peak:5.2f}%" if peak else ""
    mem = f"  memory {memory_gib:.2f} GiB" if memory_gib is not None else ""
    return (f"step {r.step:4d}  loss {r.loss:8.4f}  step {r.time_ms:8.1f} ms  tokens/s/gpu {tps:10.1f}  "
            f"tflops/gpu {tflops:8.3f}{mfu}{mem}")
