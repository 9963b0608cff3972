"""The acceptance gate of the validate phase (docs/workflow.md): a run is accepted only when it is training-
equivalent (real data, the loss falls), long enough (>= 50 steps, a window of >= 10), finite, and carries the
evidence that each variable under test was active in the built model (``moe-hydra accept``)."""

from __future__ import annotations

import json
from typing import Any

from moe_hydra.analysis.runs import Run
from moe_hydra.core import contract as contracts


ACCEPT_MIN_STEPS, ACCEPT_MIN_WINDOW = 50, 10
EVIDENCE_FOR = {"dispatcher": "dispatcher_class", "precision": "precision_recipe",
                "kernels.moe_grouped_gemm": "grouped_gemm", "expert_mesh": "local_experts_per_rank",
                "mesh": "local_experts_per_rank", "parallel.expert_model_parallel_size": "local_experts_per_rank"}


def loss_fall(r: dict[str, Any]) -> tuple[str, float, float] | None:
    """(what is compared, the loss before, the loss after): the mean of the first min(10, warmup) steps (at least
    one) against the steady window's mean; without per-step losses, the first step's against the last's; None when
    the run recorded neither."""
    loss, (first, last) = r.get("loss") or {}, r["window"]
    per_step, head = loss.get("per_step") or [], max(1, min(10, r.get("warmup_steps") or 0))
    window = per_step[first - 1:last]
    if len(per_step) >= head and window:
        return f"mean of steps 1..{head} -> window mean", sum(per_step[:head]) / head, sum(window) / len(window)
    if isinstance(loss.get("first"), (int, float)) and isinstance(loss.get("last"), (int, float)):
        return "first step -> last step", loss["first"], loss["last"]
    return None


def acceptance_problems(run: Run, variables: list[str]) -> list[str]:
    r, problems = run.results, []
    if r.get("label") != contracts.TRAINING_EQUIVALENT:
        problems.append(f"benchmark-only: {'; '.join(r.get('label_reasons', []))}")
    elif (fall := loss_fall(r)) is None or not fall[2] < fall[1]:  # on real data the model must learn
        problems.append("the loss does not fall on real data: " + (
            f"{fall[1]:.4f} -> {fall[2]:.4f} ({fall[0]})" if fall else "no losses recorded"))
    first, last = r["window"]
    if last - first + 1 < ACCEPT_MIN_WINDOW:
        problems.append(f"window [{first},{last}] has {last - first + 1} steps; acceptance needs >= {ACCEPT_MIN_WINDOW}")
    if r.get("steps", 0) < ACCEPT_MIN_STEPS:
        problems.append(f"{r.get('steps')} steps; acceptance needs >= {ACCEPT_MIN_STEPS}")
    loss = r.get("loss", {})
    if not loss.get("all_finite", False):
        problems.append("non-finite loss")
    skipped = loss.get("nan_or_skipped")
    if skipped != 0:
        problems.append(f"{skipped} NaN or skipped steps" if skipped else "loss.nan_or_skipped missing")
    evidence = r.get("evidence") or {}
    for v in variables:
        key = EVIDENCE_FOR.get(v)
        if key and evidence.get(key) is None:
            problems.append(f"no evidence that {v} was active (evidence.{key} missing)")
    if not evidence:
        problems.append("no evidence read from the built model")
    return problems


def _fmt(value: Any, spec: str) -> str:
    """A number as ``spec``; anything else (null, absent) as it is."""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def accept(runs: list[Run], variables: list[str]) -> tuple[list[str], list[str]]:
    """(refusals, report lines): the acceptance gate of docs/workflow.md for every run."""
    refusals, report = [], []
    for run in runs:
        problems = acceptance_problems(run, variables)
        refusals += [f"{run.path}: {p}" for p in problems]
        r, loss = run.results, run.results["loss"]
        report.append(
            f"{run.path}\n  label {r.get('label')}; contract {r['contract_hash']}; {r['steps']} steps, window "
            f"{r['window']}\n  step {run.window_mean:.2f} ms (window mean), "
            f"{_fmt(r.get('tokens_per_s_per_gpu'), '.1f')} tokens/s/GPU, {_fmt(r.get('tflops_per_gpu'), '.4f')} "
            f"TFLOP/s/GPU, MFU {r.get('mfu')}\n  loss {loss['first']:.4f} -> {loss['last']:.4f}, finite "
            f"{loss.get('all_finite')}, NaN/skipped {loss.get('nan_or_skipped')}\n"
            + ("" if (fall := loss_fall(r)) is None else f"  loss {'falls' if fall[2] < fall[1] else 'does not fall'}: "
               f"{fall[1]:.4f} -> {fall[2]:.4f} ({fall[0]})\n")
            + f"  peak memory {r.get('peak_memory_gib')}\n  evidence: {json.dumps(r.get('evidence'), sort_keys=True)}")
    return refusals, report


