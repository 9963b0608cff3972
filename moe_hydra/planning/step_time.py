"""``plan.json``'s ``step_time``: measured on this machine when ``hardware.calibration`` names a calibration that
holds for the plan (:mod:`moe_hydra.core.calibrated_step`), else the step model fitted on the published runs
(:func:`moe_hydra.planning.step_model.prediction`; null on the CPU preset).

Pure: standard library only.
"""

from __future__ import annotations

import math
from typing import Any

from moe_hydra.core import calibrated_step, metrics
from moe_hydra.core.resolved import Resolved
from moe_hydra.planning import step_model


def prediction(r: Resolved, dense_params: int, expert_params: int, flops_per_token: float) -> dict | None:
    """The plan's step time: :func:`calibrated` when the calibration holds for the plan; else the priors'
    (``dense_params``, ``expert_params``: the most loaded rank's), with the calibration's ``differences`` when one
    was named."""
    if not calibrated_step.named(r.cfg):
        return step_model.prediction(r, dense_params, expert_params, flops_per_token)
    measured = calibrated(r, flops_per_token)
    if measured["seconds"] is not None:
        return measured
    return {**(step_model.prediction(r, dense_params, expert_params, flops_per_token) or {"seconds": None}),
            "calibration": measured["calibration"]}


def calibrated(r: Resolved, flops_per_token: float) -> dict[str, Any]:
    """The fit of this machine's steps on the plan's layout at its depth, micro-batch, sequence and micro-batches
    per step (times the measured factor of its recompute and dispatcher where they are not the layout's own), its
    parts, and the range the held-out error of what it used spans (x / exp(p90) to x exp(p90)); ``calibration``
    names the file, its sha256, the machine and what it used. ``seconds`` None when the calibration does not hold
    for the plan (``differences``: another model's widths, processes, layout or settings). The rules (K01) refused
    a file that is unreadable or from another device kind or implementation."""
    cfg = r.cfg
    cal, sha = calibrated_step.load(cfg.hardware.calibration)
    named = {"file": str(calibrated_step.resolve_path(cfg.hardware.calibration)), "sha256": sha,
             "machine": cal.get("machine"), "model": cal.get("model")}
    estimate = calibrated_step.estimate(cal["step"], r)
    if isinstance(estimate, list):
        return {"seconds": None, "calibration": {**named, "applies": False, "differences": estimate}}
    seconds, terms, used = estimate
    spread = math.exp(used["p90"])
    world, tokens = r.layout.world_size, r.batch.tokens_per_step
    peak, _ = metrics.peak_tflops(cfg.hardware, cfg.precision)
    tflops = flops_per_token * tokens / (seconds * world * 1e12)
    return {"seconds": seconds, "interval_s": [seconds / spread, seconds * spread], "interval_of": "calibration",
            "terms": terms, "calibration": {**named, "applies": True, **used},
            "tokens_per_s_per_gpu": tokens / (seconds * world), "tflops_per_gpu": tflops,
            "mfu": tflops / peak if peak else None}
