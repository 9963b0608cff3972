"""``stage=plan``: check a resolved plan and describe what it would run.

resolved plan -> :func:`assess` (rules, per-rank parameters, memory) -> :func:`make_plan` (counts, FLOPs,
label, contract) -> ``plan.json`` (printed by :mod:`moe_hydra.planning.render`). A plan is a plain dict so
the later stages (launch, compare) and tests read it without this module. Planning never imports torch or
megatron.

``plan.json`` keys:
    world_size, min_gpus, layout, parallel, experts_per_rank, pipeline, batch, seq_length, implementation
                                 the resolved plan (moe_hydra.core.resolved.Resolved.as_dict): both meshes in
                                 Megatron's names + data_parallel_size, expert_data_parallel_size; what each
                                 pipeline rank holds; the batch; the layers, attention, experts, Adam and
                                 the MLPs' activation (fused or not) that run, and where that was decided
    params_total, params_active  whole model (MTP included); active = with top-k experts
    params_per_rank              the most-loaded rank (max over pipeline stages)
    params_per_stage             one rank of each pipeline stage: dense / expert / total
    flops_per_token, flops_counter, flops_breakdown   model FLOPs at train.seq_length
    flops_per_token_swa, flops_counter_swa   the sliding-window-discounted counter (null without a window)
    step_time                    the step time predicted (moe_hydra.planning.step_time): from hardware.calibration
                                 when it holds for the plan, else the step-time model's (GPU hardware; null on
                                 the CPU preset): seconds, interval_s, terms, calibration, tokens_per_s_per_gpu,
                                 tflops_per_gpu, mfu
    layer_spec                   implementation.layer_spec: the spec the counts assume
    memory                       per-rank estimate in GiB (moe_hydra.planning.memory): the most-loaded rank's
                                 weights / gradients / optimizer / activations / allowance / total,
                                 breakdown, per_stage, capacity, margin, excluded
    fits                         total <= hardware.memory_gib (null when the hardware declares none)
    memory_suggestions           when it does not fit: the workflow's next steps, each with its
                                 overrides and estimate (selective -> full recompute -> offload -> more
                                 model parallelism)
    label, label_reasons         training-equivalent or benchmark-only, and why
    contract, contract_hash, contract_full_hash, swept   what must stay fixed between arms (contract.py)
    megatron_core                version the version-dependent rules were checked against
    notes                        advice that is not a violation (e.g. EP leaving the NVLink domain)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from moe_hydra.core import calibrated_step, contract, flops, overrides, params
from moe_hydra.core.arch import Arch
from moe_hydra.core.env import snapshot as env_snapshot
from moe_hydra.core.resolved import Resolved, resolve
from moe_hydra.core.versions import McoreFacts, mcore_facts
from moe_hydra.core.violations import V, Violation
from moe_hydra.planning import memory, rules, step_time


def _notes(r: Resolved) -> list[str]:
    hw, lo, notes = r.cfg.hardware, r.layout, []
    if calibrated_step.named(r.cfg):
        notes += calibrated_step.other_versions(calibrated_step.load(hw.calibration)[0], hw.calibration)
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


@dataclass(frozen=True, slots=True)
class Assessment:
    """A legal resolved plan, counted and estimated: what the plan and the layout search share."""

    r: Resolved
    ranks: list[params.RankParams]
    stages: list[memory.StageMemory]

    @property
    def peak(self) -> memory.StageMemory:
        return max(self.stages, key=lambda s: s.total)


def assess(r: Resolved, mcore: McoreFacts | None = None) -> Assessment:
    """Rules, per-rank parameters and the memory estimate of a resolved plan.

    Raises:
        rules.LayoutError: listing every rule it breaks.
    """
    rules.validate(r, mcore=mcore or mcore_facts())
    ranks = params.params_per_rank(r.arch, r.layout, r.split, te_spec=r.impl.te)
    return Assessment(r, ranks, memory.estimate(r, ranks))


def selective_recompute(a: Arch) -> list[str]:
    """Overrides for selective recompute of this model: the ``selective`` preset, plus ``mla_up_proj``
    for MLA models (the preset's own note; the layout search uses the same)."""
    if not a.mla:
        return ["recompute=selective"]
    return ["recompute=selective", "recompute.recompute_modules=[core_attn,layernorm,moe_act,mla_up_proj]"]


def _memory_steps(a: Arch) -> list[list[str]]:
    """The workflow's order when a layout does not fit: recompute, then offload (then more model parallelism)."""
    return [selective_recompute(a), ["recompute=full"], ["recompute=full", "offload=fine_grained"]]


def _more_parallelism(r: Resolved) -> list[list[str]]:
    """One step more of EP, PP or TP (the workflow's order), each only where the sizes allow it."""
    lo, a, out = r.layout, r.arch, []
    if a.experts and a.experts % (2 * lo.ep) == 0:
        out.append([f"parallel.expert_model_parallel_size={2 * lo.ep}"])
    if r.cfg.parallel.pipeline_model_parallel_layout is None:
        out.append([f"parallel.pipeline_model_parallel_size={2 * lo.pp}"])
    out.append([f"parallel.tensor_model_parallel_size={2 * lo.tp}"]
               + ([] if lo.sp or not a.experts else ["parallel.sequence_parallel=true"]))
    return [[*selective_recompute(a), *o] for o in out]


def suggestions(assessed: Assessment, mcore: McoreFacts) -> list[dict[str, Any]]:
    """The workflow's next steps for a layout that does not fit, each estimated; illegal ones left out."""
    r = assessed.r
    cfg, a, out = r.cfg, r.arch, []
    for steps in (*_memory_steps(a), *_more_parallelism(r)):
        if cfg.recompute.name == "selective" and steps == selective_recompute(a):
            continue
        try:
            est = assess(resolve(overrides.apply(cfg, steps), r.impl, a), mcore)
        except (rules.LayoutError, ValueError):
            continue
        total = est.peak.total / memory.GIB
        cap = cfg.hardware.memory_gib
        out.append({"overrides": steps, "total_gib": round(total, 3), "fits": None if cap is None else total <= cap})
    return out


def unfit(cfg: Any, p: dict[str, Any]) -> Violation | None:
    """The refusal stage=run gives a plan (or its :func:`memory_verdict`) that does not fit, unless
    ``memory.refuse_unfit=false``."""
    if p["fits"] is not False or not cfg.memory.refuse_unfit:
        return None
    m = p["memory"]
    first = next((s for s in p["memory_suggestions"] if s["fits"]), None)
    fix = (" ".join(first["overrides"]) + f" (estimate {first['total_gib']:.1f} GiB)") if first else "more GPUs"
    return V("M01", f"the estimate for pipeline rank {m['most_loaded_pp_rank']} is {m['total']:.1f} GiB, "
             f"more than the {m['capacity']} GiB of {cfg.hardware.name} (margin {m['margin']:.1f} GiB)",
             f"{fix}; or memory.refuse_unfit=false to run it anyway",
             hardware__memory_gib=m["capacity"])


def run_violations(r: Resolved) -> list[Violation]:
    """Everything in the plan that stops it from running, found before anything is queued: the rules, then
    the memory estimate."""
    mcore = mcore_facts()
    try:
        assessed = assess(r, mcore)
    except rules.LayoutError as e:
        return e.violations
    v = unfit(r.cfg, memory_verdict(assessed, mcore))
    return [v] if v else []


def memory_verdict(assessed: Assessment, mcore: McoreFacts) -> dict[str, Any]:
    """The plan's ``memory``, ``fits`` and ``memory_suggestions``."""
    mem = memory.summary(assessed.r, assessed.stages, assessed.ranks)
    fits = memory.fits(mem)
    return {"memory": mem, "fits": fits,
            "memory_suggestions": suggestions(assessed, mcore) if fits is False else []}


def make_plan(r: Resolved, swept: list[str] | None = None, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """``plan.json``: the resolved plan, counted, estimated and labelled.

    ``swept``: the override keys the current multirun sweeps (left out of ``contract_hash``);
    ``env``: the environment snapshot (:func:`moe_hydra.core.env.snapshot`, taken when not given).

    Raises:
        rules.LayoutError: listing every rule the plan breaks.
    """
    mcore = mcore_facts()
    assessed = assess(r, mcore)
    cfg, lo, arch, per_stage = r.cfg, r.layout, r.arch, assessed.ranks
    worst = max(per_stage, key=lambda s: s.total)
    fl = flops.flops_per_token(arch, r.batch.seq_length, lo.tp)
    label, reasons = contract.label(cfg)
    the_contract = contract.build(cfg, r, env or env_snapshot())
    resolved = r.as_dict()
    return {
        "stage": "plan",
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        **resolved,
        "params_total": params.total_params(arch),
        "params_active": params.active_params(arch),
        "params_per_rank": worst.total,
        "params_per_stage": [
            {"pp_rank": s.pp_rank, "layers": s.layers, "dense": s.dense, "expert": s.expert, "total": s.total}
            for s in per_stage
        ],
        "flops_per_token": fl.total,
        "flops_counter": flops.COUNTER,
        "flops_breakdown": asdict(fl),
        # the second counter, labelled, where the model has sliding-window layers (GPT-OSS)
        "flops_per_token_swa": flops.swa_discounted(arch, r.batch.seq_length, lo.tp).total if arch.window else None,
        "flops_counter_swa": flops.SWA_COUNTER if arch.window else None,
        "step_time": step_time.prediction(r, worst.dense, worst.expert, fl.total),
        "layer_spec": r.impl.layer_spec,
        **memory_verdict(assessed, mcore),
        "label": label,
        "label_reasons": reasons,
        **contract.hashes(the_contract, list(swept or [])),
        "swept": list(swept or []),
        "contract": the_contract,
        "megatron_core": {"version": mcore.version, "installed": mcore.installed},
        "notes": _notes(r),
    }
