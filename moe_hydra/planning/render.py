"""``plan.json`` as a rich table, the one ``stage=plan`` prints (rich is imported when a table is made).

Reads the plan's record only: what is printed is what was written.
"""

from __future__ import annotations

from typing import Any

from moe_hydra.core.steady import AUTO


def _si(n: float, billion: str = "B") -> str:
    for unit, scale in (("T", 1e12), (billion, 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _memory_rows(t, plan: dict[str, Any]) -> None:
    m = plan["memory"]
    unit, scale = ("GiB", 1) if m["total"] >= 1 else ("MiB", 1024)  # the tiny model's few MiB stay readable
    flight = m["breakdown"]["in_flight_microbatches"]
    held = (f"activations {m['activations'] * scale:.1f} ({flight:g} micro-batch{'' if flight == 1 else 'es'} in "
            "flight)")
    if m["optimizer_step"] > m["activations"]:  # the optimizer step's temporary is the larger
        held = f"the optimizer step's fp32 temporary {m['optimizer_step'] * scale:.1f} (more than the {held})"
    parts = (f"weights {m['weights'] * scale:.1f} + gradients {m['gradients'] * scale:.1f} + optimizer "
             f"{m['optimizer'] * scale:.1f} + {held} + cuBLAS workspaces {m['workspaces'] * scale:.2f} + allowance {m['allowance'] * scale:.1f}")
    t.add_row("memory / rank", f"{m['total'] * scale:.2f} {unit} on pipeline rank {m['most_loaded_pp_rank']} "
              f"(the most loaded): {parts}")
    if len(m["per_stage"]) > 1:
        t.add_row("memory per stage", ", ".join(f"{s['pp_rank']}: {s['total'] * scale:.1f}" for s in m["per_stage"])
                  + f" {unit}")
    fits = plan["fits"]
    if fits is None:
        t.add_row("fits", "unknown: the hardware declares no device memory (hardware.memory_gib)")
    else:
        verdict = "[green]yes[/]" if fits else "[bold red]no[/]"
        t.add_row("fits", f"{verdict}: {m['total']:.1f} of {m['capacity']} GiB, margin {m['margin']:.1f} GiB")
    from rich.markup import escape

    for s in plan["memory_suggestions"]:
        mark = "fits" if s["fits"] else "does not fit"
        t.add_row("next step", escape(f"{' '.join(s['overrides'])}: {s['total_gib']:.1f} GiB ({mark})"))


def plan_table(plan: dict[str, Any]):
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
    impl = plan["implementation"]
    t.add_row("implementation", f"{impl['layer_spec']} layers, {impl['attention']} attention, {impl['experts']} experts, "
              f"{impl['optimizer']} Adam ({impl['source']})")
    t.add_row("model FLOPs/token", f"{_si(plan['flops_per_token'], 'G')} FLOP ({plan['flops_counter']})")
    if plan.get("flops_per_token_swa"):
        t.add_row("SWA FLOPs/token", f"{_si(plan['flops_per_token_swa'], 'G')} FLOP ({plan['flops_counter_swa']})")
    st = plan.get("step_time") or {}
    measured = st.get("calibration") if isinstance(st.get("calibration"), dict) else None
    if measured and not measured["applies"]:
        t.add_row("calibration", f"{measured['file']} does not hold for this plan: {'; '.join(measured['differences'])}"
                  + ("" if st.get("seconds") else " (no prediction on this hardware without one)")
                  + (f". To extend it: {measured['extend']}" if measured.get("extend") else ""))
    if st.get("seconds"):
        mfu = f", MFU {st['mfu']:.1%}" if st["mfu"] is not None else ""
        lo, hi = st["interval_s"]
        if st["interval_of"] == "calibration":
            where = (f"the calibration's held-out range on {measured['layout']}: p90 |ln| {measured['p90']:.2f}, "
                     "each measured step predicted by the fit of the others")
            source = f"calibrated on this machine: {measured['file']}, sha256 {measured['sha256'][:12]}"
            scaled = measured.get("scaled_out")
            if scaled:
                where += (f"; up to the reduction in full: extrapolated from {scaled['from']} on "
                          f"{scaled['processes'][0]} processes")
                source += (f"; extrapolated to {scaled['processes'][1]} processes: the larger data-parallel groups' "
                           f"gradient reduction adds {scaled['exposed_s'] * 1e3:.3g} ms exposed of "
                           f"{scaled['reduction_s'] * 1e3:.3g} ms, at the measured "
                           f"{'/'.join(scaled['collectives'])} {scaled['busbw_gb_per_s']:.3g} GB/s within a node"
                           + ("" if scaled["nodes"][0] > 1 or scaled["nodes"][1] == 1 else
                              f" and {scaled['across_nodes_gb_per_s']:.3g} GB/s across nodes (not measured: "
                              f"{scaled['across_nodes_from'].split(':')[0]})"))
        else:
            where = (f"{st['coverage']:.0%} of held-out {'MoE' if st['interval_of'] == 'moe' else 'dense'} runs, each "
                     f"source weighing the same; leaving each source out it held {st['held_out_coverage']:.0%} "
                     f"(the worst source {st['worst_source_coverage']:.0%}"
                     + (f"; on {st['arch']} {st['held_out_coverage_on_arch']:.0%}"
                        if st.get("held_out_coverage_on_arch") is not None else "") + ")")
            source = "moe_hydra.planning.step_model; a ranking aid"
        t.add_row("predicted step", f"{st['seconds']:.3f} s ({lo:.3g}-{hi:.3g} s: {where}): "
                  f"{st['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, {st['tflops_per_gpu']:.3g} TFLOP/s/GPU{mfu} "
                  f"({source})")
    _memory_rows(t, plan)
    label = plan["label"] + (f": {'; '.join(plan['label_reasons'])}" if plan["label_reasons"] else "")
    t.add_row("label", label)
    steps, window = plan.get("profile_steps"), plan["contract"]["timing"]["window"]
    timing = plan["contract"]["timing"]
    if window == AUTO:
        t.add_row("steps", f"up to {plan['train_iters']}: warmup {timing['warmup_steps']}, then until the steps "
                  f"have a steady segment of {timing['steady_steps']} (contract.window=auto), which is measured")
    else:
        t.add_row("steps", f"{plan['train_iters']}: warmup {timing['warmup_steps']}, measured "
                  f"{window[0]}..{window[1]}" + (f", profiled {steps[0]}..{steps[1]} (profile.json: the step's walls)"
                                                 if steps else "; add profile=window to profile the steps after them"))
    t.add_row("contract", f"{plan['contract_hash']} (full {plan['contract_full_hash']})"
              + (f", excluding swept {', '.join(plan['swept'])}" if plan["swept"] else ""))
    mc = plan["megatron_core"]
    t.add_row("megatron-core", f"{mc['version']}" + ("" if mc["installed"] else " (not installed: rules of the newest supported)"))
    for note in plan["notes"]:
        t.add_row("note", note)
    return t
