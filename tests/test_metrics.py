"""Throughput arithmetic (pure): window, tokens/s/GPU, TFLOP/s/GPU, MFU, loss bookkeeping."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from moe_hydra.core.metrics import StepRecord, peak_tflops, summarize


def records(times, losses=None):
    losses = losses or [5.0 - 0.1 * i for i in range(len(times))]
    return [StepRecord(step=i + 1, time_ms=t, loss=l) for i, (t, l) in enumerate(zip(times, losses))]


def test_window_excludes_warmup_and_defines_the_figures():
    # warmup steps are slow on purpose: they must not move the steady figure
    recs = records([900.0, 800.0, 700.0, 100.0, 110.0, 90.0])
    s = summarize(recs, window=[4, 6], warmup_steps=3, tokens_per_step=8192, world_size=8,
                  flops_per_token=1e9, peak=989.0)
    assert s["step_time_ms"] == pytest.approx(100.0)
    assert s["tokens_per_s_per_gpu"] == pytest.approx(8192 / (0.1 * 8))  # 10240
    assert s["tflops_per_gpu"] == pytest.approx(1e9 * 10240 / 1e12)
    assert s["mfu"] == pytest.approx(s["tflops_per_gpu"] / 989.0)
    assert s["step_times_ms"] == [900.0, 800.0, 700.0, 100.0, 110.0, 90.0]


def test_loss_bookkeeping_counts_nonfinite_and_skipped():
    recs = records([1.0] * 4, [5.0, float("nan"), 4.0, 3.0])
    recs[2] = StepRecord(step=3, time_ms=1.0, loss=4.0, skipped=True)
    s = summarize(recs, window=[1, 4], warmup_steps=0, tokens_per_step=1, world_size=1, flops_per_token=1, peak=None)
    assert s["loss"]["all_finite"] is False and s["loss"]["nan_or_skipped"] == 2 and s["mfu"] is None
    assert s["loss"]["first"] == 5.0 and s["loss"]["last"] == 3.0 and math.isnan(s["loss"]["per_step"][1])


def test_an_empty_window_is_an_error():
    with pytest.raises(ValueError, match=r"no step in the window \[5, 6\]"):
        summarize(records([1.0] * 4), window=[5, 6], warmup_steps=0, tokens_per_step=1, world_size=1,
                  flops_per_token=1, peak=None)


def test_peak_follows_the_compute_precision():
    hw = SimpleNamespace(peak_tflops_bf16=989, peak_tflops_fp8=1979, peak_tflops_fp4=None)
    assert peak_tflops(hw, SimpleNamespace(fp8=None, fp4=None)) == (989.0, "hardware.peak_tflops_bf16")
    assert peak_tflops(hw, SimpleNamespace(fp8="e4m3", fp4=None)) == (1979.0, "hardware.peak_tflops_fp8")
    assert peak_tflops(hw, SimpleNamespace(fp8=None, fp4="e2m1")) == (None, None)
