"""``plan.json``'s ``step_time``: measured on this machine when ``hardware.calibration`` names a calibration that
holds for the plan (:mod:`moe_hydra.core.calibrated_step`), else the step model fitted on the published runs
(:func:`moe_hydra.planning.step_model.prediction`; null on the CPU preset).

Pure: standard library only.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from moe_hydra.core import calibrated_step, metrics
from moe_hydra.core.resolved import Resolved
from moe_hydra.planning import memory, step_model


# What a plan that a calibration does not hold for says to do about it (plan.json: step_time.calibration.extend)
EXTEND = ("calibrate with this plan's settings: its command with stage=calibrate instead of stage=plan measures its "
          "model, processes and settings on every layout it can run, and the other recompute and dispatcher options "
          "(calibrate.variants); then name the new file in hardware.calibration")


def prediction(r: Resolved, dense_params: int, expert_params: int, flops_per_token: float) -> dict | None:
    """The plan's step time: :func:`calibrated` when the calibration holds for the plan; else the priors'
    (``dense_params``, ``expert_params``: the most loaded rank's), with the calibration's ``differences`` when one
    was named."""
    if not calibrated_step.named(r.cfg):
        return step_model.prediction(r, dense_params, expert_params, flops_per_token)
    measured = calibrated(r, dense_params, expert_params, flops_per_token)
    if measured["seconds"] is not None:
        return measured
    return {**(step_model.prediction(r, dense_params, expert_params, flops_per_token) or {"seconds": None}),
            "calibration": measured["calibration"]}


def calibrated(r: Resolved, dense_params: int, expert_params: int, flops_per_token: float) -> dict[str, Any]:
    """The fit of this machine's steps on the plan's layout at its depth, micro-batch, sequence and micro-batches
    per step (times the measured factor of its recompute and dispatcher where they are not the layout's own; on a
    larger machine plus what its larger data-parallel groups add, :func:`estimate`), its parts, and the range the
    held-out error of what it used spans (x / exp(p90) to x exp(p90), and up to the extrapolated reduction in
    full); ``calibration`` names the file, its sha256, the machine and what it used. ``seconds`` None when the
    calibration does not hold for the plan (``differences``: another model's widths, processes, layout or
    settings). The rules (K01) refused a file that is unreadable or from another device kind or implementation."""
    cfg = r.cfg
    cal, sha = calibrated_step.load(cfg.hardware.calibration)
    # the machine's reference as the calibration read it: its summary, not each reading (the search writes this
    # for every layout it ranks)
    reference = {k: v for k, v in (cal.get("reference") or {}).items() if k != "each"} or None
    named = {"file": str(calibrated_step.resolve_path(cfg.hardware.calibration)), "sha256": sha,
             "machine": cal.get("machine"), "model": cal.get("model"), "reference": reference}
    found = estimate(cal, r, dense_params, expert_params)
    if isinstance(found, list):
        return {"seconds": None, "calibration": {**named, "applies": False, "differences": found, "extend": EXTEND}}
    seconds, terms, used = found
    spread = math.exp(used["p90"])
    upper = seconds + (used["scaled_out"]["reduction_s"] - terms["data_parallel"] if "scaled_out" in used else 0.0)
    world, tokens = r.layout.world_size, r.batch.tokens_per_step
    peak, _ = metrics.peak_tflops(cfg.hardware, cfg.precision)
    tflops = flops_per_token * tokens / (seconds * world * 1e12)
    return {"seconds": seconds, "interval_s": [seconds / spread, upper * spread], "interval_of": "calibration",
            "coverage": step_model.COVERAGE, "held_out_coverage": None,
            "interval_scheme": "the p90 of the calibration's own held-out error (each measured step predicted by the "
                               "others); its coverage of real runs the calibration never saw is not measured here "
                               "(benchmarks/calibration_heldout.py measures it)",
            "terms": terms, "calibration": {**named, "applies": True, **used},
            "tokens_per_s_per_gpu": tokens / (seconds * world), "tflops_per_gpu": tflops,
            "mfu": tflops / peak if peak else None}


def estimate(cal: dict[str, Any], r: Resolved, dense_params: int, expert_params: int
             ) -> tuple[float, dict[str, float], dict[str, Any]] | list[str]:
    """:func:`moe_hydra.core.calibrated_step.estimate` of calibration ``cal`` at ``r``; on a larger machine than it
    measured, plus the ``data_parallel`` term (:func:`data_parallel_growth`, with ``dense_params`` and
    ``expert_params`` the most loaded rank's) and how it was extrapolated under ``scaled_out``."""
    found = calibrated_step.estimate(cal["step"], r)
    if isinstance(found, list) or "scaled_out" not in found[2]:
        return found
    seconds, terms, used = found
    try:
        exposed, how = data_parallel_growth(cal, r, used["scaled_out"], dense_params, expert_params, terms["layers"])
    except ValueError as e:
        return [f"processes {r.layout.world_size} ({e})"]
    return seconds + exposed, {**terms, "data_parallel": exposed}, {**used, "scaled_out": {**used["scaled_out"], **how}}


def data_parallel_growth(cal: dict[str, Any], r: Resolved, scaled: dict[str, Any], dense_params: int,
                         expert_params: int, layers_s: float) -> tuple[float, dict[str, Any]]:
    """What a layout's larger data-parallel groups add to the step the calibration measured on fewer ranks: the
    gradients' reduction (the distributed optimizer's reduce-scatter and parameter all-gather, else an all-reduce;
    the bytes a parameter moves as the priors count them, :class:`moe_hydra.planning.step_model.StepModel`) over
    the DP (dense) and EDP (expert) groups at their new sizes, less at the calibrated sizes (already in the fit),
    each a two-level ring: within a node at the bus bandwidth the calibration measured for that collective at the
    size a rank reduces (its largest size beyond the range), across nodes at the calibrated world's when the
    calibration spanned nodes, else at the hardware preset's scale-out bandwidth (not measured: said). With
    overlap_grad_reduce only what the backward pass (2/3 of the layers' time) cannot hide is exposed, and at least
    the last bucket's share (1 / (M x VPP)), as the priors assume. Returns (seconds exposed, how)."""
    cfg, lo = r.cfg, r.layout
    distributed = cfg.optimizer.use_distributed_optimizer
    per_param = memory.grad_bytes(cfg) + (memory.weight_bytes(cfg.precision) if distributed else memory.grad_bytes(cfg))
    ops = ("reduce_scatter", "all_gather") if distributed else ("all_reduce",)
    message = max(dense_params, expert_params, 1) * memory.grad_bytes(cfg)
    intra = statistics.fmean(_busbw(cal["measurements"], op, message) for op in ops) * 1e9
    cal_nodes, nodes = scaled["nodes"]
    if cal_nodes > 1:
        inter, inter_from = intra, "measured (the calibrated world spans nodes)"
    else:
        declared = cfg.hardware.scaleout_bandwidth_gb_s
        inter = (declared or step_model.NOMINAL_GB_S) * 1e9 * cfg.step_model.scaleout_efficiency
        inter_from = ((f"hardware.scaleout_bandwidth_gb_s {declared:g}" if declared else
                       f"a nominal {step_model.NOMINAL_GB_S:g} GB/s (hardware.scaleout_bandwidth_gb_s is null)")
                      + " x step_model.scaleout_efficiency: the calibration measured one node")
    per_node = cfg.hardware.devices_per_node

    def per_byte(group: int, stride: int) -> float:  # a two-level ring's seconds per byte a rank moves
        if group <= 1:
            return 0.0
        inside = max(1, min(group, per_node // stride))
        across = group // inside
        return (inside - 1) / inside / intra + (across - 1) / across / inside / inter

    cal_dp, dp = scaled["dp"]
    emp = lo.ep * lo.etp * lo.pp
    cal_world, world = scaled["processes"]
    full = per_param * (dense_params * (per_byte(dp * lo.cp, lo.tp) - per_byte(cal_dp * lo.cp, lo.tp))
                        + expert_params * (per_byte(world // emp, lo.ep * lo.etp)
                                           - per_byte(cal_world // emp, lo.ep * lo.etp)))
    full = max(full, 0.0)
    exposed = full
    if cfg.overlap.overlap_grad_reduce:
        chunks = r.batch.micro_batches_per_step * (lo.vpp or 1)
        exposed = max(full - 2 / 3 * layers_s, full / chunks)
    return exposed, {"reduction_s": full, "exposed_s": exposed, "collectives": list(ops), "bytes_per_rank": message,
                     "busbw_gb_per_s": intra / 1e9, "across_nodes_gb_per_s": inter / 1e9,
                     "across_nodes_from": inter_from}


def _busbw(rows: list[dict[str, Any]], op: str, nbytes: float) -> float:
    """The bus bandwidth (GB/s) the calibration measured for ``op`` at ``nbytes`` a rank, interpolated in log size
    between its sizes (its smallest or largest size's beyond them).

    Raises:
        ValueError: the calibration measured no ``op`` (one process: nothing to extrapolate from).
    """
    curve = sorted((x["bytes"], x["busbw_gb_per_s"]) for x in rows
                   if x.get("kind") == "collective" and x.get("op") == op)
    if not curve:
        raise ValueError(f"the calibration measured no {op} (calibrate on 2 or more processes to predict a larger "
                         "machine)")
    if nbytes <= curve[0][0]:
        return curve[0][1]
    for (b0, w0), (b1, w1) in zip(curve, curve[1:]):
        if nbytes <= b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return w0 + f * (w1 - w0)
    return curve[-1][1]
