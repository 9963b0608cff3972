"""``stage=plan``: validate a composed config and describe what it would run.

compose -> :func:`make_plan` (rules, layout, parameter and FLOPs counts, label) -> ``plan.json``
and a rich table. A plan is a plain dict so the later stages (launch, compare, search) and tests read
it without this module. Planning never imports torch or megatron.

``plan.json`` keys:
    world_size, min_gpus         world = nodes x devices_per_node; min = PP x lcm(TP x CP, EP x ETP)
    parallel                     the seven Megatron sizes + data_parallel_size, expert_data_parallel_size
    experts_per_rank             routed experts on each expert-parallel rank
    params_total, params_active  whole model (MTP included); active = with top-k experts
    params_per_rank              the most-loaded rank (max over pipeline stages)
    params_per_stage             one rank of each pipeline stage: dense / expert / total
    flops_per_token, flops_counter, flops_breakdown   model FLOPs at train.seq_length
    batch                        micro / global batch, micro-batches per step, tokens per step
    label, label_reasons         training-equivalent or benchmark-only, and why
    contract, contract_hash, contract_full_hash, swept   what must stay fixed between arms (contract.py)
    megatron_core                version the version-dependent rules were checked against
    notes                        advice that is not a violation (e.g. EP leaving the NVLink domain)
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from moe_hydra import contract, flops, params, rules
from moe_hydra.arch import Arch
from moe_hydra.env import snapshot as env_snapshot
from moe_hydra.layout import Layout
from moe_hydra.versions import mcore_facts


def _notes(cfg: Any, lo: Layout) -> list[str]:
    hw, notes = cfg.hardware, []
    if hw.arch == "cpu":
        return notes
    domain = hw.nvlink_domain_size
    if lo.ep * lo.etp > domain:
        notes.append(
            f"EP x ETP = {lo.ep * lo.etp} spans more than the NVLink domain ({domain}): "
            "the expert all-to-all crosses the scale-out network"
        )
    if lo.tp * lo.cp > domain:
        notes.append(f"TP x CP = {lo.tp * lo.cp} spans more than the NVLink domain ({domain})")
    return notes


def make_plan(cfg: Any, swept: list[str] | None = None, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan of a composed config (objects, e.g. ``OmegaConf.to_object(cfg)``).

    ``swept``: the override keys the current multirun sweeps (left out of ``contract_hash``);
    ``env``: the environment snapshot (:func:`moe_hydra.env.snapshot`, taken when not given).

    Raises:
        rules.LayoutError: listing every rule the config breaks.
    """
    mcore = mcore_facts()
    rules.validate(cfg, mcore=mcore)
    lo = Layout.from_config(cfg)
    arch = Arch.from_model(cfg.model)
    seq = cfg.train.seq_length
    per_stage = params.params_per_rank(arch, lo, cfg.parallel)
    fl = flops.flops_per_token(arch, seq, lo.tp)
    mbs = cfg.train.micro_batch_size
    gbs = cfg.train.global_batch_size or mbs * lo.dp
    label, reasons = contract.label(cfg)
    batch = {
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "micro_batches_per_step": gbs // (mbs * lo.dp),
        "tokens_per_step": gbs * seq,
    }
    env = env or env_snapshot()
    the_contract = contract.build(cfg, lo.to_megatron(), batch, env)
    return {
        "stage": "plan",
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "world_size": lo.world_size,
        "min_gpus": lo.min_gpus,
        "layout": lo.describe(),
        "parallel": lo.to_megatron(),
        "experts_per_rank": arch.experts // lo.ep if arch.experts else 0,
        "params_total": params.total_params(arch),
        "params_active": params.active_params(arch),
        "params_per_rank": max(s.total for s in per_stage),
        "params_per_stage": [
            {"pp_rank": s.pp_rank, "layers": s.layers, "dense": s.dense, "expert": s.expert, "total": s.total}
            for s in per_stage
        ],
        "seq_length": seq,
        "flops_per_token": fl.total,
        "flops_counter": flops.COUNTER,
        "flops_breakdown": asdict(fl),
        "batch": batch,
        "label": label,
        "label_reasons": reasons,
        **contract.hashes(the_contract, list(swept or [])),
        "swept": list(swept or []),
        "contract": the_contract,
        "megatron_core": {"version": mcore.version, "installed": mcore.installed},
        "notes": _notes(cfg, lo),
    }


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write ``data`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def _si(n: float, billion: str = "B") -> str:
    for unit, scale in (("T", 1e12), (billion, 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def render(plan: dict[str, Any]):
    """A rich table of the plan (rich is imported here only)."""
    from rich.table import Table

    p = plan["parallel"]
    t = Table(title=f"plan: {plan['model']} on {plan['world_size']} x {plan['hardware']}", show_header=False,
              title_justify="left")
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    vpp = p["virtual_pipeline_model_parallel_size"]
    t.add_row("attention mesh", f"TP {p['tensor_model_parallel_size']} x CP {p['context_parallel_size']} x "
              f"DP {p['data_parallel_size']} x PP {p['pipeline_model_parallel_size']}"
              + (f" (VPP {vpp})" if vpp else "") + (" , SP" if p["sequence_parallel"] else ""))
    t.add_row("expert mesh", f"ETP {p['expert_tensor_parallel_size']} x EP {p['expert_model_parallel_size']} x "
              f"EDP {p['expert_data_parallel_size']} x PP {p['pipeline_model_parallel_size']}")
    t.add_row("world size", f"{plan['world_size']} (minimum for this layout: {plan['min_gpus']})")
    t.add_row("experts per rank", str(plan["experts_per_rank"]))
    t.add_row("parameters", f"{_si(plan['params_total'])} total, {_si(plan['params_active'])} active, "
              f"{_si(plan['params_per_rank'])} on the most-loaded rank")
    stages = plan["params_per_stage"]
    if len(stages) > 1:
        t.add_row("per PP stage", ", ".join(f"{s['pp_rank']}: {_si(s['total'])} ({s['layers']} layers)" for s in stages))
    b = plan["batch"]
    t.add_row("batch", f"MBS {b['micro_batch_size']}, GBS {b['global_batch_size']} "
              f"({b['micro_batches_per_step']} micro-batches/step), seq {plan['seq_length']}, "
              f"{_si(b['tokens_per_step'])} tokens/step")
    t.add_row("model FLOPs/token", f"{_si(plan['flops_per_token'], 'G')} FLOP ({plan['flops_counter']})")
    label = plan["label"] + (f": {'; '.join(plan['label_reasons'])}" if plan["label_reasons"] else "")
    t.add_row("label", label)
    t.add_row("contract", f"{plan['contract_hash']} (full {plan['contract_full_hash']})"
              + (f", excluding swept {', '.join(plan['swept'])}" if plan["swept"] else ""))
    mc = plan["megatron_core"]
    t.add_row("megatron-core", f"{mc['version']}" + ("" if mc["installed"] else " (not installed: rules of the newest supported)"))
    for note in plan["notes"]:
        t.add_row("note", note)
    return t
