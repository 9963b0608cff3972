"""The measurement contract: everything that must stay fixed between two arms of an A/B (docs/workflow.md).

A contract is a plain nested dict — software versions, hardware and topology, model, data, batch
shape, optimizer, both meshes, routing, precision, recompute, offload, dispatcher, kernels (graph
scope), overlap, warmup and window, and the launcher environment (performance env vars). Two hashes:

    contract_full_hash   of the whole contract
    contract_hash        with the variable(s) swept by the current multirun left out, so all arms of one
                         A/B share it (and runs that differ in anything else do not)

The label is computed, never typed: ``training-equivalent`` only when the run keeps the production
routing, data and loss semantics; anything else makes it ``benchmark-only``, with the reasons.

Pure: standard library only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

TRAINING_EQUIVALENT = "training-equivalent"
BENCHMARK_ONLY = "benchmark-only"

# Config sections that are part of the contract as they are.
SECTIONS = ("model", "hardware", "precision", "recompute", "offload", "dispatcher", "routing", "kernels",
            "overlap", "optimizer", "data")
# Config groups and the contract section each writes.
GROUP_SECTIONS = {"attention_mesh": "parallel", "expert_mesh": "parallel", "mesh": "parallel"}
SOFTWARE = ("python", "torch", "megatron-core", "transformer-engine", "transformer_engine", "deep_ep", "deep-ep",
            "nvidia-nccl-cu12", "nvidia-nccl-cu13")


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


def build(cfg: Any, r: Any, env: dict[str, Any]) -> dict[str, Any]:
    """The contract of a composed config; the layout, the batch and the implementation as resolved (``r``, a
    :class:`~moe_hydra.core.resolved.Resolved`)."""
    contract = {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}
    contract["parallel"] = {**dataclasses.asdict(cfg.parallel), **r.layout.to_megatron()}
    # micro-batches per step follow from the layout (GBS / (MBS x DP)): part of the layout, not the batch
    contract["train"] = {"seq_length": cfg.train.seq_length, "train_iters": cfg.train.train_iters,
                         "layout_invariant_init": cfg.train.layout_invariant_init,
                         **{k: v for k, v in r.batch.as_dict().items() if k != "micro_batches_per_step"}}
    # what runs (TE or local layers, flash or unfused attention, ...): arms built differently are not matched
    contract["implementation"] = {k: v for k, v in dataclasses.asdict(r.impl).items() if k != "source"}
    contract["timing"] = {"warmup_steps": cfg.contract.warmup_steps, "window": list(cfg.contract.window)}
    first, last = cfg.contract.window[0], cfg.contract.window[-1]
    profiled = r.profile_steps
    if profiled and profiled[0] <= last and first <= profiled[1]:  # a profile inside the window perturbs it
        contract["timing"]["profiled_steps"] = list(profiled)
    contract["seed"] = cfg.seed
    contract["software"] = {k: v for k, v in env["versions"].items() if k in SOFTWARE}
    contract["launcher"] = {"name": cfg.launcher.name, "partition": cfg.launcher.partition,
                            "constraint": cfg.launcher.constraint, "env": env["env"]}
    return contract


def _drop(tree: dict[str, Any], path: list[str]) -> None:
    node = tree
    for part in path[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


def excluding(contract: dict[str, Any], swept: list[str]) -> dict[str, Any]:
    """The contract without the swept variables (override keys such as ``dispatcher`` or
    ``parallel.expert_model_parallel_size``; a mesh group stands for the whole layout)."""
    out = json.loads(json.dumps(contract))
    for key in swept:
        _drop(out, GROUP_SECTIONS.get(key, key).split("."))
    return out


def digest(tree: dict[str, Any]) -> str:
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hashes(contract: dict[str, Any], swept: list[str]) -> dict[str, str]:
    return {"contract_hash": digest(excluding(contract, swept)), "contract_full_hash": digest(contract)}
