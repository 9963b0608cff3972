"""Rules on the layout: schema values, both meshes, experts, the pipeline split, sequence/TP/SP, the batch.

Ids follow docs/rules.md. Pure: standard library only.
"""

from __future__ import annotations

import math
from typing import Any

from moe_hydra.core import presets
from moe_hydra.core.arch import parse_moe_layer_freq
from moe_hydra.core.pipeline import expand_layout
from moe_hydra.core.resolved import ATTENTION_BACKENDS
from moe_hydra.planning.rules.base import (DISPATCHER_READS, Ctx, V, _divisors, _ep_choices, _fmt, _here, _list,
                                           _on_gpus, _tp_choices, _v01, _world, rule)

# --------------------------------------------------------------------------- schema values (S)

_CHOICES = {
    "hardware.arch": ("cpu", "ampere", "hopper", "blackwell"),
    "model.normalization": ("RMSNorm", "LayerNorm"),
    "model.activation_func": (None, "silu", "gelu", "quick_gelu"),
    "model.position_embedding_type": ("rope", "learned_absolute", "none"),
    "model.moe_router_score_function": ("softmax", "sigmoid", "sqrtsoftplus"),
    "precision.params_dtype": ("bf16", "fp16", "fp32"),
    "precision.fp8": (None, "e4m3", "hybrid"),
    "precision.fp8_recipe": (None, "tensorwise", "delayed", "blockwise", "mxfp8"),
    "precision.fp4": (None, "e2m1"),
    "precision.fp4_recipe": (None, "nvfp4"),
    "parallel.cp_comm_type": ("p2p", "all_gather", "a2a", "a2a+p2p"),
    "dispatcher.moe_token_dispatcher_type": ("allgather", "alltoall", "flex"),
    "dispatcher.moe_flex_dispatcher_backend": (None, "deepep", "hybridep"),
    "recompute.recompute_granularity": (None, "selective", "full"),
    "recompute.recompute_method": (None, "uniform", "block"),
    "kernels.cuda_graph_impl": ("none", "local", "transformer_engine", "full_iteration"),
    "kernels.attention_backend": ATTENTION_BACKENDS,
    "optimizer.optimizer": ("adam", "sgd", "muon"),
    "data.kind": ("mock", "megatron"),
    "profile.name": ("none", "window"),
    "profile.tool": ("torch", "nsys"),
}


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _choices(c: Ctx, paths: tuple[str, ...]):
    for path in paths:
        allowed, value = _CHOICES[path], _get(c.cfg, path)
        if value not in allowed:
            shown = ", ".join(_fmt(a) for a in allowed)
            yield V("S01", f"{path} must be one of {shown}", f"{path}=<one of {shown}>", **{path.replace(".", "__"): value})


# one rule per kind of field: the layout search varies the mesh, the dispatcher and the recompute settings
_RECOMPUTE_CHOICES = ("recompute.recompute_granularity", "recompute.recompute_method")
_MESH_CHOICES = ("parallel.cp_comm_type", "dispatcher.moe_token_dispatcher_type", "dispatcher.moe_flex_dispatcher_backend")


@rule(reads="fixed")
def s01_choices(c: Ctx):
    yield from _choices(c, tuple(p for p in _CHOICES if p not in _MESH_CHOICES + _RECOMPUTE_CHOICES))


@rule(comm=DISPATCHER_READS)
def s01_mesh_choices(c: Ctx):
    yield from _choices(c, _MESH_CHOICES)


@rule(reads="recompute")
def s01_recompute_choices(c: Ctx):
    yield from _choices(c, _RECOMPUTE_CHOICES)


@rule(reads="fixed")
def l13_moe_layer_freq(c: Ctx):
    if c.arch is None:  # the resolved plan could not read the pattern
        try:
            parse_moe_layer_freq(c.m.moe_layer_freq, c.m.num_layers)
        except ValueError as e:
            yield V("L13", str(e), f"model.moe_layer_freq={_fmt(_layer_freq(c))} (or an int, a 0/1 list of num_layers, "
                    'or "[0]*k+[1]*n")', model__moe_layer_freq=c.m.moe_layer_freq, model__num_layers=c.m.num_layers)


def _layer_freq(c: Ctx) -> Any:
    """The model preset's MoE layer pattern when it fits the layers, else every layer MoE."""
    freq = presets.chosen(c.cfg, "model.moe_layer_freq")
    try:
        parse_moe_layer_freq(freq, c.m.num_layers)
    except (ValueError, TypeError):
        return 1
    return freq


# --------------------------------------------------------------------------- meshes (L01-L09)

@rule(comm=DISPATCHER_READS)  # the EP sizes L02 names keep the flex dispatcher's EP > 1
def l01_l02_world(c: Ctx):
    """A layout larger than the world; on the CPU preset, larger than this machine: the fixes also name the GPU
    presets it fits, with stage=plan."""
    lo, w = c.layout, c.layout.world_size
    need = math.lcm(lo.attention_model_size, lo.expert_model_size)
    if lo.dp == 0:
        size = lo.attention_model_size
        tps = [t for t in _tp_choices(c) if t < lo.tp]
        smaller = [f"parallel.tensor_model_parallel_size=<one of {_list(tps)}>"] if tps else []
        yield V("L01", f"world size {w} is not divisible by TP x CP x PP = {lo.tp}x{lo.cp}x{lo.pp} = {size}{_here(c)}",
                ", or ".join([_world(c, need), *smaller]) + _on_gpus(c, need), hardware__nodes=c.cfg.hardware.nodes,
                hardware__devices_per_node=c.cfg.hardware.devices_per_node,
                parallel__tensor_model_parallel_size=lo.tp, parallel__context_parallel_size=lo.cp,
                parallel__pipeline_model_parallel_size=lo.pp)
    if lo.edp == 0:
        size = lo.expert_model_size
        good = _ep_choices(c)
        ep = "parallel.expert_model_parallel_size"
        first = [f"{ep}=<one of {_list(good)}>"] if good else (
            [f"{ep}=1 dispatcher=alltoall"] if c.flex and w % (lo.etp * lo.pp) == 0 else [])
        yield V("L02", f"world size {w} is not divisible by ETP x EP x PP = {lo.etp}x{lo.ep}x{lo.pp} = {size}{_here(c)}",
                ", or ".join([*first, _world(c, need)]) + _on_gpus(c, need), hardware__nodes=c.cfg.hardware.nodes,
                hardware__devices_per_node=c.cfg.hardware.devices_per_node,
                parallel__expert_model_parallel_size=lo.ep, parallel__expert_tensor_parallel_size=lo.etp,
                parallel__pipeline_model_parallel_size=lo.pp)


@rule(reads="pipeline")
def l04_vpp_needs_pp(c: Ctx):
    vpp = c.p.virtual_pipeline_model_parallel_size
    if vpp is not None and (vpp < 1 or c.layout.pp == 1):
        yield V("L04", "an interleaved schedule (VPP) needs pipeline-model-parallel size > 1 and VPP >= 1",
                "parallel.virtual_pipeline_model_parallel_size=null, or parallel.pipeline_model_parallel_size>1",
                parallel__virtual_pipeline_model_parallel_size=vpp, parallel__pipeline_model_parallel_size=c.layout.pp)


@rule
def l05_tp_pp_dp_mapping(c: Ctx):
    lo = c.layout
    if c.p.use_tp_pp_dp_mapping and lo.pp > 1 and lo.dp and lo.edp and lo.dp != lo.edp:
        yield V("L05", f"without pp-last rank order the attention and expert DP sizes must match: DP {lo.dp} != EDP {lo.edp}",
                "parallel.use_tp_pp_dp_mapping=false", parallel__use_tp_pp_dp_mapping=True,
                parallel__pipeline_model_parallel_size=lo.pp)


@rule
def l07_l08_distopt_instances(c: Ctx):
    n, lo = c.cfg.optimizer.num_distributed_optimizer_instances, c.layout
    if n < 1:
        yield V("L07", "num_distributed_optimizer_instances must be >= 1", "optimizer.num_distributed_optimizer_instances=1",
                optimizer__num_distributed_optimizer_instances=n)
        return
    if lo.dp and (lo.dp * lo.cp) % n:
        yield V("L07", f"DP x CP = {lo.dp}x{lo.cp} = {lo.dp * lo.cp} is not divisible by the partial DistOpt shard factor {n}",
                "optimizer.num_distributed_optimizer_instances=1", optimizer__num_distributed_optimizer_instances=n)
    if lo.edp and lo.edp % n:
        yield V("L08", f"expert DP {lo.edp} is not divisible by the partial DistOpt shard factor {n}",
                "optimizer.num_distributed_optimizer_instances=1", optimizer__num_distributed_optimizer_instances=n)


@rule
def l09_hierarchical_cp(c: Ctx):
    sizes, cp = c.p.hierarchical_context_parallel_sizes, c.layout.cp
    hierarchical = c.p.cp_comm_type == "a2a+p2p"
    if sizes is not None and math.prod(sizes) != cp:
        yield V("L09", f"the product of hierarchical_context_parallel_sizes {list(sizes)} is {math.prod(sizes)}, not CP {cp}",
                f"parallel.hierarchical_context_parallel_sizes={f'[{cp},1]' if hierarchical else 'null'} (sizes whose "
                f"product is {cp}: [a2a_size,p2p_size])", parallel__hierarchical_context_parallel_sizes=list(sizes),
                parallel__context_parallel_size=cp)
    if hierarchical and sizes is None:
        yield V("L09", "cp_comm_type a2a+p2p needs hierarchical_context_parallel_sizes",
                f"parallel.hierarchical_context_parallel_sizes=[{cp},1] ([a2a_size,p2p_size] with product {cp}), "
                "or parallel.cp_comm_type=p2p",
                parallel__cp_comm_type="a2a+p2p", parallel__hierarchical_context_parallel_sizes=None)


# --------------------------------------------------------------------------- experts (L10-L13, L34)

@rule(comm=DISPATCHER_READS)  # the EP sizes L11 names keep the flex dispatcher's EP > 1
def l10_l11_experts(c: Ctx):
    experts, ep = c.m.num_moe_experts, c.layout.ep
    if not experts:
        if ep > 1:
            yield V("L10", "expert parallelism needs a MoE model (num_moe_experts is not set)",
                    "parallel.expert_model_parallel_size=1", model__num_moe_experts=experts,
                    parallel__expert_model_parallel_size=ep)
        return
    if experts % ep:
        good = _ep_choices(c)
        yield V("L11", f"{experts} experts do not split over expert-parallel size {ep}: {experts} % {ep} = {experts % ep}",
                f"parallel.expert_model_parallel_size=<one of {_list(good)}> (e.g. expert_mesh=ep{good[-1]})" if good
                else f"model.num_moe_experts={experts // ep * ep or ep}", model__num_moe_experts=experts,
                parallel__expert_model_parallel_size=ep)
    if c.m.moe_router_topk > experts:
        topk = presets.chosen(c.cfg, "model.moe_router_topk")
        topk = topk if isinstance(topk, int) and 1 <= topk <= experts else experts
        yield V("L11", f"moe_router_topk {c.m.moe_router_topk} exceeds the {experts} experts",
                f"model.moe_router_topk={topk} (at most {experts})", model__moe_router_topk=c.m.moe_router_topk,
                model__num_moe_experts=experts)


@rule
def l34_bias_needs_etp1(c: Ctx):
    lo = c.layout
    if c.m.num_moe_experts and c.m.add_bias_linear and lo.etp != 1:
        etp1: str | None = "parallel.expert_tensor_parallel_size=1"
        if _v01(c, lo.tp, 1, lo.ep):  # ETP 1 under TP > 1 needs EP >= 2 there
            eps = [e for e in _divisors(c.m.num_moe_experts) if e > 1 and lo.world_size % (e * lo.pp) == 0]
            etp1 = f"{etp1} parallel.expert_model_parallel_size={eps[0]}" if eps else None
        yield V("L34", f"MoE with biases (add_bias_linear) supports ETP 1 only, not ETP {lo.etp}",
                ", or ".join([*([etp1] if etp1 else []), "model.add_bias_linear=false"]), model__add_bias_linear=True,
                parallel__expert_tensor_parallel_size=c.layout.etp)


# --------------------------------------------------------------------------- pipeline (L14-L20)

@rule(reads="pipeline")
def l14_l20_pipeline_split(c: Ctx):
    p, lo = c.p, c.layout
    if c.arch is None or lo.pp < 1:
        return
    L, pp, vpp = c.arch.num_layers, lo.pp, p.virtual_pipeline_model_parallel_size
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    acc_e, acc_l = p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split
    layout_fields = dict(parallel__pipeline_model_parallel_layout=p.pipeline_model_parallel_layout)
    if p.pipeline_model_parallel_layout is not None:
        if first is not None or last is not None or acc_e or acc_l:
            split = {"num_layers_in_first_pipeline_stage": first, "num_layers_in_last_pipeline_stage": last,
                     "account_for_embedding_in_pipeline_split": acc_e or None,
                     "account_for_loss_in_pipeline_split": acc_l or None}
            drop = " ".join(f"parallel.{k}={'null' if 'stage' in k else 'false'}" for k, v in split.items() if v)
            yield V("L16", "pipeline_model_parallel_layout cannot be combined with uneven stages or account_for_* flags",
                    f"{drop}, or parallel.pipeline_model_parallel_layout=null", **layout_fields,
                    parallel__num_layers_in_first_pipeline_stage=first, parallel__num_layers_in_last_pipeline_stage=last)
        try:
            stages = expand_layout(p.pipeline_model_parallel_layout)
        except ValueError as e:
            yield V("L17", str(e), _layout_fix(c, pp * (vpp or 1)), **layout_fields)
            return
        n_t, n_m = sum(s.count("t") for s in stages), sum(s.count("m") for s in stages)
        even = pp * (vpp or max(1, len(stages) // pp))  # the virtual stages of the layout a fix names
        if len(stages) % pp:
            yield V("L17", f"the layout has {len(stages)} stages, not a multiple of PP {pp}", _layout_fix(c, even),
                    **layout_fields, parallel__pipeline_model_parallel_size=pp)
        elif vpp is not None and vpp != len(stages) // pp:
            yield V("L16", f"the layout defines VPP = {len(stages)} stages / PP {pp} = {len(stages) // pp}, but VPP is set to {vpp}",
                    f"parallel.virtual_pipeline_model_parallel_size={len(stages) // pp} (or null)", **layout_fields,
                    parallel__virtual_pipeline_model_parallel_size=vpp)
        if n_t != L:
            yield V("L17", f"the layout places {n_t} decoder layers ('t'), the model has {L}",
                    f"{_layout_fix(c, even)} (a layout with {L} 't')", **layout_fields, model__num_layers=L)
        if n_m != c.arch.mtp:
            yield V("L17", f"the layout places {n_m} MTP blocks ('m'), the model has {c.arch.mtp}",
                    f"{_layout_fix(c, even)} (a layout with {c.arch.mtp} 'm')", **layout_fields,
                    model__mtp_num_layers=c.arch.mtp)
        if not stages[0].startswith("E") or not stages[-1].endswith("L"):
            yield V("L17", "the layout must start with the embedding 'E' and end with the loss 'L'",
                    _layout_fix(c, even), **layout_fields)
        return
    v = vpp or 1
    if first is not None or last is not None:
        if acc_e or acc_l:
            flags = [f"parallel.account_for_{k}_in_pipeline_split=false" for k, on in (("embedding", acc_e), ("loss", acc_l))
                     if on]
            yield V("L20", "uneven first/last stages cannot be combined with account_for_*_in_pipeline_split",
                    " ".join(flags), parallel__num_layers_in_first_pipeline_stage=first,
                    parallel__num_layers_in_last_pipeline_stage=last)
        middle_stages = pp - (first is not None) - (last is not None)
        middle = L - (first or 0) - (last or 0)
        if middle < 0 or middle_stages < 0 or (middle_stages == 0 and middle) or (middle_stages and middle % middle_stages):
            yield V("L20", f"{L} layers minus first {first} and last {last} leave {middle} for {middle_stages} middle stages",
                    f"{_uneven_fix(L, pp, v, first, last)} (so that the rest splits evenly)", model__num_layers=L,
                    parallel__num_layers_in_first_pipeline_stage=first,
                    parallel__num_layers_in_last_pipeline_stage=last, parallel__pipeline_model_parallel_size=pp)
        else:
            each = middle // middle_stages if middle_stages else 0
            for name, n in (("first", first), ("last", last), ("middle", each)):
                if n is not None and n % v:
                    yield V("L20", f"the {name} stage's {n} layers do not split over VPP {v}",
                            f"{_uneven_fix(L, pp, v, first, last)} (stage layer counts divisible by {v})",
                            parallel__virtual_pipeline_model_parallel_size=vpp)
        return
    slots = L + acc_e + acc_l
    extra = " (+ embedding and/or loss)" if acc_e or acc_l else ""
    if vpp is None and slots % pp:
        good = [d for d in _divisors(slots) if d <= 64]
        yield V("L14", f"{slots} layers{extra} are not divisible by pipeline-model-parallel size {pp}",
                f"parallel.pipeline_model_parallel_size=<one of {_list(good)}>, or a pipeline layout / uneven stages",
                model__num_layers=L, parallel__pipeline_model_parallel_size=pp)
    elif vpp is not None and vpp >= 1 and slots % (pp * vpp):
        vpps = _vpp_choices(c, slots)
        other = f", or parallel.virtual_pipeline_model_parallel_size=<one of {_list(vpps)}>" if vpps else ""
        yield V("L15", f"{slots} layers{extra} do not split into PP x VPP = {pp}x{vpp} = {pp * vpp} virtual stages",
                f"parallel.virtual_pipeline_model_parallel_size=null{other}, or a pipeline layout",
                model__num_layers=L, parallel__pipeline_model_parallel_size=pp,
                parallel__virtual_pipeline_model_parallel_size=vpp)


def _layout_fix(c: Ctx, stages: int) -> str:
    """A layout of the model's layers over ``stages`` virtual stages, as even as they go: the embedding on the
    first, MTP and the loss on the last, the extra layers on the middle stages."""
    base, extra = divmod(c.arch.num_layers, stages)
    parts = [("E" if i == 0 else "") + _layers(base + (0 < i <= extra)) + ("m" * c.arch.mtp + "L" if i == stages - 1
                                                                           else "") for i in range(stages)]
    text, i = "", 0
    while i < stages - 1:  # runs of equal stages, the last one apart: "(tt|)*29"
        n = next((k for k in range(i, stages - 1) if parts[k] != parts[i]), stages - 1) - i
        text += f"({parts[i]}|)*{n}" if n > 1 else f"{parts[i]}|"
        i += n
    return f"parallel.pipeline_model_parallel_layout={_fmt(text + parts[-1])}"


def _layers(n: int) -> str:
    return "t" * n if n <= 3 else f"t*{n}"


def _uneven_fix(L: int, pp: int, v: int, first: int | None, last: int | None) -> str:
    """The first (or last) stage's layer count nearest the asked one that leaves the middle stages an even split,
    every count divisible by VPP ``v``; without one, no uneven stages."""
    key, asked, other = ("first", first, last) if first is not None else ("last", last, first)
    middle_stages = pp - (first is not None) - (last is not None)

    def fits(n: int) -> bool:
        middle = L - n - (other or 0)
        each = middle // middle_stages if middle_stages > 0 else 0
        return (middle >= 0 and middle_stages >= 0 and (middle_stages > 0 or middle == 0)
                and (middle_stages == 0 or middle % middle_stages == 0)
                and all(x % v == 0 for x in (n, other or 0, each)))

    good = sorted((n for n in range(1, L + 1) if fits(n)), key=lambda n: abs(n - asked))
    if good:
        return f"parallel.num_layers_in_{key}_pipeline_stage={good[0]}"
    return "parallel.num_layers_in_first_pipeline_stage=null parallel.num_layers_in_last_pipeline_stage=null"


def _vpp_choices(c: Ctx, slots: int) -> list[int]:
    """The VPP sizes above 1 that split the layers and keep the interleaved schedule's micro-batches a multiple
    of PP (B01) and its p2p legal (L18)."""
    lo, b = c.layout, c.batch
    m = b.micro_batches_per_step
    if slots % lo.pp or (lo.pp <= 2 and not c.cfg.overlap.overlap_p2p_comm) or m < lo.pp or m % lo.pp:
        return []
    return [v for v in _divisors(slots // lo.pp) if v > 1]


@rule(reads="pipeline")
def l18_interleave_p2p(c: Ctx):
    vpp, pp = c.p.virtual_pipeline_model_parallel_size, c.layout.pp
    interleaved = vpp is not None or c.p.pipeline_model_parallel_layout is not None
    if interleaved and not c.cfg.overlap.overlap_p2p_comm and pp <= 2:
        yield V("L18", f"the interleaved schedule with batched p2p needs PP > 2 (PP is {pp}): "
                "with PP 2 both neighbours are the same rank and sends/receives of equal shape are swapped",
                "overlap.overlap_p2p_comm=true", overlap__overlap_p2p_comm=False,
                parallel__pipeline_model_parallel_size=pp, parallel__virtual_pipeline_model_parallel_size=vpp)


# --------------------------------------------------------------------------- sequence, TP, SP (L21-L28)

@rule
def l21_l22_sequence(c: Ctx):
    lo, s = c.layout, c.seq
    if lo.cp > 1 and s % (2 * lo.cp):
        yield V("L21", f"seq_length {s} must be a multiple of 2 x CP = {2 * lo.cp}", _seq_fix(c), train__seq_length=s,
                parallel__context_parallel_size=lo.cp)
    if lo.sp and lo.tp > 1 and (s // lo.cp) % lo.tp:
        yield V("L22", f"with sequence parallelism seq_length / CP = {s}/{lo.cp} = {s // lo.cp} must be divisible by TP {lo.tp}",
                _seq_fix(c), train__seq_length=s,
                parallel__tensor_model_parallel_size=lo.tp, parallel__context_parallel_size=lo.cp)


def _seq_fix(c: Ctx) -> str:
    """The longest sequence up to the asked one that both L21 and L22 take."""
    lo, s = c.layout, c.seq
    unit = math.lcm(2 * lo.cp if lo.cp > 1 else 1, lo.cp * lo.tp if lo.sp and lo.tp > 1 else 1)
    return f"train.seq_length={max(unit, s // unit * unit)} (a multiple of {unit})"


@rule
def l23_l25_sequence_parallel(c: Ctx):
    lo = c.layout
    if lo.sp and lo.tp == 1:
        yield V("L23", "sequence parallelism needs tensor parallelism (TP is 1)", "parallel.sequence_parallel=false",
                parallel__sequence_parallel=True, parallel__tensor_model_parallel_size=1)
    if c.m.num_moe_experts and lo.tp > 1 and not lo.sp:
        yield V("L25", f"MoE with TP {lo.tp} requires sequence parallelism (Megatron refuses to train without it)",
                "parallel.sequence_parallel=true", parallel__sequence_parallel=False, parallel__tensor_model_parallel_size=lo.tp)


@rule
def l24_tp_comm_overlap(c: Ctx):
    if c.cfg.overlap.tp_comm_overlap and (c.layout.tp < 2 or not c.layout.sp):
        yield V("L24", "TP communication overlap needs TP >= 2 with sequence parallelism",
                "overlap.tp_comm_overlap=false", overlap__tp_comm_overlap=True,
                parallel__tensor_model_parallel_size=c.layout.tp, parallel__sequence_parallel=c.layout.sp)


@rule
def l26_l28_tp_shapes(c: Ctx):
    tp, etp, m = c.layout.tp, c.layout.etp, c.m
    heads = m.num_attention_heads
    if heads % tp:
        yield V("L26", f"num_attention_heads {heads} must be a multiple of TP {tp}", _tp_fix(c),
                model__num_attention_heads=heads, parallel__tensor_model_parallel_size=tp)
    g = m.num_query_groups or heads
    if not m.multi_latent_attention and g % tp and tp % g:
        yield V("L27", f"num_query_groups {g} must be a multiple or divisor of TP {tp}", _tp_fix(c),
                model__num_query_groups=g, parallel__tensor_model_parallel_size=tp)
    shards = [("model.ffn_hidden_size", m.ffn_hidden_size, tp, "parallel.tensor_model_parallel_size")]
    if m.num_moe_experts:
        shards.append(("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size or m.ffn_hidden_size, etp,
                       "parallel.expert_tensor_parallel_size"))
    if m.moe_shared_expert_intermediate_size:
        shards.append(("model.moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size, tp,
                       "parallel.tensor_model_parallel_size"))
    for path, width, n, knob in shards:
        if width % n:
            preset = presets.chosen(c.cfg, path)
            fit = preset if isinstance(preset, int) and preset > 0 and preset % n == 0 else max(n, round(width / n) * n)
            yield V("L28", f"{path.split('.')[1]} {width} is not divisible by {n}",
                    f"{path}={fit}, or {knob}=<one of {_list([d for d in _divisors(width) if d <= 64])}>",
                    **{path.replace(".", "__"): width, knob.replace(".", "__"): n})


def _tp_fix(c: Ctx) -> str:
    """The TP sizes every TP rule takes; without one, TP 1 without sequence parallelism."""
    good = _tp_choices(c)
    if good:
        return f"parallel.tensor_model_parallel_size=<one of {_list(good)}>"
    return "parallel.tensor_model_parallel_size=1 parallel.sequence_parallel=false"


# --------------------------------------------------------------------------- batch, kernels, optimizer (L30-L33)

@rule
def l30_global_batch(c: Ctx):
    gbs, mbs, dp = c.batch.global_batch_size, c.batch.micro_batch_size, c.layout.dp
    if dp and gbs % (mbs * dp):
        unit = mbs * dp
        yield V("L30", f"global batch {gbs} is not divisible by micro batch {mbs} x DP {dp} = {unit}",
                f"train.global_batch_size={max(unit, gbs // unit * unit)} (a multiple of {unit}), or null for {unit}",
                train__global_batch_size=gbs, train__micro_batch_size=mbs)


@rule(reads="pipeline")
def b01_interleaved_microbatches(c: Ctx):
    """Megatron's interleaved schedule runs micro-batches in groups of PP per virtual stage
    (microbatch_group_size_per_vp_stage): fewer than PP, or a last group of 1..PP-1, is refused at the first step."""
    lo, b = c.layout, c.batch
    if not (lo.vpp and lo.vpp > 1 and lo.pp > 1 and lo.dp):
        return
    mbs, gbs, m = b.micro_batch_size, b.global_batch_size, b.micro_batches_per_step
    unit = mbs * lo.dp
    if gbs % unit == 0 and (m < lo.pp or 0 < m % lo.pp < lo.pp):
        yield V("B01", f"the interleaved pipeline (PP {lo.pp}, VPP {lo.vpp}) needs a multiple of PP micro-batches "
                f"per step, got {m} (global batch {gbs} / (micro batch {mbs} x DP {lo.dp}))",
                f"train.global_batch_size={unit * lo.pp * max(1, -(-m // lo.pp))} (or null for micro batch x world size)",
                train__global_batch_size=c.cfg.train.global_batch_size, parallel__pipeline_model_parallel_size=lo.pp)


@rule(reads="fixed")
def l31_grouped_gemm(c: Ctx):
    if c.cfg.kernels.moe_grouped_gemm and c.cfg.hardware.arch == "cpu":
        yield V("L31", "grouped-GEMM experts need a GPU with compute capability >= 8",
                "kernels.moe_grouped_gemm=false", kernels__moe_grouped_gemm=True, hardware__arch="cpu")


@rule(reads="fixed")
def l32_l33_distributed_optimizer(c: Ctx):
    o, dist = c.cfg.overlap, c.cfg.optimizer.use_distributed_optimizer
    if o.overlap_param_gather and not (dist and o.overlap_grad_reduce):
        yield V("L32", "overlap_param_gather needs the distributed optimizer and overlap_grad_reduce",
                "optimizer.use_distributed_optimizer=true overlap.overlap_grad_reduce=true (or overlap.overlap_param_gather=false)",
                overlap__overlap_param_gather=True, overlap__overlap_grad_reduce=o.overlap_grad_reduce,
                optimizer__use_distributed_optimizer=dist)
    if c.cfg.offload.optimizer_cpu_offload and not dist:
        yield V("L33", "optimizer CPU offload needs the distributed optimizer",
                "optimizer.use_distributed_optimizer=true (or offload=none)", offload__optimizer_cpu_offload=True,
                optimizer__use_distributed_optimizer=False)
