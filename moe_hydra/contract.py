"""The measurement contract: what a run was measured under, and the label that follows from it.

A run is ``training-equivalent`` only when it keeps the production routing, data, optimizer and
loss semantics; any departure makes it ``benchmark-only``, with the reasons listed. The label is
computed from the composed config, never typed by a user (workflow.md §3).

Pure: standard library only.
"""

from __future__ import annotations

from typing import Any

TRAINING_EQUIVALENT = "training-equivalent"
BENCHMARK_ONLY = "benchmark-only"


def label(cfg: Any) -> tuple[str, list[str]]:
    """(label, reasons) for a composed config; no reasons means training-equivalent."""
    reasons = []
    if cfg.routing.moe_router_force_load_balancing:
        reasons.append("force-balanced routing (routing.moe_router_force_load_balancing=true)")
    if cfg.routing.moe_expert_capacity_factor is not None:
        reasons.append(
            f"token drop at capacity {cfg.routing.moe_expert_capacity_factor} "
            "(routing.moe_expert_capacity_factor set; production MoE training is dropless)"
        )
    if cfg.data.kind == "mock":
        reasons.append("mock data (data.kind=mock: synthetic tokens)")
    return (BENCHMARK_ONLY if reasons else TRAINING_EQUIVALENT), reasons
