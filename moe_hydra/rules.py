"""Legality of a composed config, decided before anything is launched.

Each rule mirrors a check that Megatron-Core (or its kernels) makes at run time, or a trap that
gives silently wrong results; ids follow ``megatron-knobs.md`` §13 (``L01``..``L74``), with
moe_hydra's own rules as ``C`` (contract), ``P`` (precision/hardware), ``S`` (schema values) and
``V`` (megatron-core version). :func:`check` runs every rule and returns *all* violations; each
names the fields and values involved, the arithmetic that failed, and an override that fixes it.

Whether a package (DeepEP, HybridEP, Transformer Engine) is installed is not decided here: plans
are made on laptops; the job checks its own machine.

Pure: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from moe_hydra.arch import Arch, parse_moe_layer_freq
from moe_hydra.layout import Layout
from moe_hydra.pipeline import expand_layout
from moe_hydra.versions import McoreFacts, mcore_facts


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    message: str  # what broke, with the values and the arithmetic
    fields: tuple[tuple[str, Any], ...]  # (dotted path, value) of every field involved
    fix: str  # an override (or a choice of overrides) that makes the rule hold

    def render(self) -> str:
        where = "  ".join(f"{k}={_fmt(v)}" for k, v in self.fields)
        return f"[{self.rule}] {self.message}\n        {where}\n        fix: {self.fix}"


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(getattr(v, "value", v))


class LayoutError(ValueError):
    """The composed config breaks one or more rules. ``violations`` holds all of them."""

    def __init__(self, violations: list[Violation], subject: str = "this config"):
        self.violations = violations
        self.subject = subject
        super().__init__(self.report())

    def report(self) -> str:
        n = len(self.violations)
        head = f"{n} layout violation{'s' if n > 1 else ''} for {self.subject}; nothing was launched."
        return "\n".join([head] + ["  " + v.render() for v in self.violations])


@dataclass(slots=True)
class Ctx:
    """What every rule reads: the config, its layout, its architecture, the megatron-core facts."""

    cfg: Any
    layout: Layout
    arch: Arch | None  # None when moe_layer_freq itself is malformed (S02 reports it)
    mcore: McoreFacts

    @property
    def p(self):
        return self.cfg.parallel

    @property
    def m(self):
        return self.cfg.model

    @property
    def seq(self) -> int:
        return self.cfg.train.seq_length

    @property
    def fp8(self) -> bool:
        return self.cfg.precision.fp8 is not None

    @property
    def flex(self) -> bool:
        return self.cfg.dispatcher.moe_token_dispatcher_type == "flex"


Rule = Callable[[Ctx], Iterator[Violation]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def V(rule_id: str, message: str, fix: str, **fields: Any) -> Violation:
    """A violation; ``fields`` are dotted paths written with ``__`` for ``.``."""
    return Violation(rule_id, message, tuple((k.replace("__", "."), v) for k, v in fields.items()), fix)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values)) if values else "none"


# --------------------------------------------------------------------------- schema values (S)

_CHOICES = {
    "hardware.arch": ("cpu", "hopper", "blackwell"),
    "model.normalization": ("RMSNorm", "LayerNorm"),
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
    "data.kind": ("mock",),
}


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


@rule
def s01_choices(c: Ctx):
    for path, allowed in _CHOICES.items():
        value = _get(c.cfg, path)
        if value not in allowed:
            shown = ", ".join(_fmt(a) for a in allowed)
            yield V("S01", f"{path} must be one of {shown}", f"{path}=<one of {shown}>", **{path.replace(".", "__"): value})


@rule
def s02_positive(c: Ctx):
    for path in ("hardware.nodes", "hardware.devices_per_node", "train.micro_batch_size", "train.seq_length",
                 "parallel.tensor_model_parallel_size", "parallel.context_parallel_size",
                 "parallel.pipeline_model_parallel_size", "parallel.expert_model_parallel_size"):
        value = _get(c.cfg, path)
        if value < 1:
            yield V("S02", f"{path} must be >= 1", f"{path}=1", **{path.replace(".", "__"): value})
    if c.arch is None:
        try:
            parse_moe_layer_freq(c.m.moe_layer_freq, c.m.num_layers)
        except ValueError as e:
            yield V("L13", str(e), 'model.moe_layer_freq=<int, 0/1 list of num_layers, or "[0]*k+[1]*n">',
                    model__moe_layer_freq=c.m.moe_layer_freq, model__num_layers=c.m.num_layers)


# --------------------------------------------------------------------------- meshes (L01-L09)

@rule
def l01_l02_world(c: Ctx):
    lo, w = c.layout, c.layout.world_size
    if lo.dp == 0:
        size = lo.attention_model_size
        yield V("L01", f"world size {w} is not divisible by TP x CP x PP = {lo.tp}x{lo.cp}x{lo.pp} = {size}",
                f"a world size that is a multiple of {size} (hardware.nodes / hardware.devices_per_node), "
                "or smaller TP/CP/PP", hardware__nodes=c.cfg.hardware.nodes,
                hardware__devices_per_node=c.cfg.hardware.devices_per_node,
                parallel__tensor_model_parallel_size=lo.tp, parallel__context_parallel_size=lo.cp,
                parallel__pipeline_model_parallel_size=lo.pp)
    if lo.edp == 0:
        size = lo.expert_model_size
        experts = c.arch.experts if c.arch and c.arch.experts else 1
        good = [e for e in _divisors(experts) if w % (lo.etp * e * lo.pp) == 0]
        yield V("L02", f"world size {w} is not divisible by ETP x EP x PP = {lo.etp}x{lo.ep}x{lo.pp} = {size}",
                f"parallel.expert_model_parallel_size=<one of {_list(good)}>, or a world size that is a "
                f"multiple of {size}", hardware__nodes=c.cfg.hardware.nodes,
                hardware__devices_per_node=c.cfg.hardware.devices_per_node,
                parallel__expert_model_parallel_size=lo.ep, parallel__expert_tensor_parallel_size=lo.etp,
                parallel__pipeline_model_parallel_size=lo.pp)


@rule
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
    if sizes is not None and math.prod(sizes) != cp:
        yield V("L09", f"the product of hierarchical_context_parallel_sizes {list(sizes)} is {math.prod(sizes)}, not CP {cp}",
                f"parallel.hierarchical_context_parallel_sizes=<sizes whose product is {cp}>",
                parallel__hierarchical_context_parallel_sizes=list(sizes), parallel__context_parallel_size=cp)
    if c.p.cp_comm_type == "a2a+p2p" and sizes is None:
        yield V("L09", "cp_comm_type a2a+p2p needs hierarchical_context_parallel_sizes",
                f"parallel.hierarchical_context_parallel_sizes=[a2a_size,p2p_size] with product {cp}",
                parallel__cp_comm_type="a2a+p2p", parallel__hierarchical_context_parallel_sizes=None)


# --------------------------------------------------------------------------- experts (L10-L13, L34)

@rule
def l10_l11_experts(c: Ctx):
    experts, ep = c.m.num_moe_experts, c.layout.ep
    if not experts:
        if ep > 1:
            yield V("L10", "expert parallelism needs a MoE model (num_moe_experts is not set)",
                    "parallel.expert_model_parallel_size=1", model__num_moe_experts=experts,
                    parallel__expert_model_parallel_size=ep)
        return
    if experts % ep:
        w, lo = c.layout.world_size, c.layout
        good = [e for e in _divisors(experts) if w % (lo.etp * e * lo.pp) == 0]
        yield V("L11", f"{experts} experts do not split over expert-parallel size {ep}: {experts} % {ep} = {experts % ep}",
                f"parallel.expert_model_parallel_size=<one of {_list(good)}> (e.g. expert_mesh=ep{good[-1] if good else 1})",
                model__num_moe_experts=experts, parallel__expert_model_parallel_size=ep)
    if c.m.moe_router_topk > experts:
        yield V("L11", f"moe_router_topk {c.m.moe_router_topk} exceeds the {experts} experts",
                f"model.moe_router_topk=<= {experts}", model__moe_router_topk=c.m.moe_router_topk,
                model__num_moe_experts=experts)


@rule
def l34_bias_needs_etp1(c: Ctx):
    if c.m.num_moe_experts and c.m.add_bias_linear and c.layout.etp != 1:
        yield V("L34", f"MoE with biases (add_bias_linear) supports ETP 1 only, not ETP {c.layout.etp}",
                "parallel.expert_tensor_parallel_size=1", model__add_bias_linear=True,
                parallel__expert_tensor_parallel_size=c.layout.etp)


# --------------------------------------------------------------------------- pipeline (L14-L20)

@rule
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
            yield V("L16", "pipeline_model_parallel_layout cannot be combined with uneven stages or account_for_* flags",
                    "drop parallel.num_layers_in_first/last_pipeline_stage and set the account_for_* flags false",
                    **layout_fields, parallel__num_layers_in_first_pipeline_stage=first,
                    parallel__num_layers_in_last_pipeline_stage=last)
        try:
            stages = expand_layout(p.pipeline_model_parallel_layout)
        except ValueError as e:
            yield V("L17", str(e), "parallel.pipeline_model_parallel_layout=<e.g. Et|(tt|)*30mL>", **layout_fields)
            return
        n_t, n_m = sum(s.count("t") for s in stages), sum(s.count("m") for s in stages)
        if len(stages) % pp:
            yield V("L17", f"the layout has {len(stages)} stages, not a multiple of PP {pp}",
                    f"a layout with a multiple of {pp} stages", **layout_fields, parallel__pipeline_model_parallel_size=pp)
        elif vpp is not None and vpp != len(stages) // pp:
            yield V("L16", f"the layout defines VPP = {len(stages)} stages / PP {pp} = {len(stages) // pp}, but VPP is set to {vpp}",
                    f"parallel.virtual_pipeline_model_parallel_size={len(stages) // pp} (or null)", **layout_fields,
                    parallel__virtual_pipeline_model_parallel_size=vpp)
        if n_t != L:
            yield V("L17", f"the layout places {n_t} decoder layers ('t'), the model has {L}",
                    f"a layout with {L} 't'", **layout_fields, model__num_layers=L)
        if n_m != c.arch.mtp:
            yield V("L17", f"the layout places {n_m} MTP blocks ('m'), the model has {c.arch.mtp}",
                    f"a layout with {c.arch.mtp} 'm'", **layout_fields, model__mtp_num_layers=c.arch.mtp)
        if not stages[0].startswith("E") or not stages[-1].endswith("L"):
            yield V("L17", "the layout must start with the embedding 'E' and end with the loss 'L'",
                    "parallel.pipeline_model_parallel_layout=E...L", **layout_fields)
        return
    v = vpp or 1
    if first is not None or last is not None:
        if acc_e or acc_l:
            yield V("L20", "uneven first/last stages cannot be combined with account_for_*_in_pipeline_split",
                    "parallel.account_for_embedding_in_pipeline_split=false parallel.account_for_loss_in_pipeline_split=false",
                    parallel__num_layers_in_first_pipeline_stage=first, parallel__num_layers_in_last_pipeline_stage=last)
        middle_stages = pp - (first is not None) - (last is not None)
        middle = L - (first or 0) - (last or 0)
        if middle < 0 or middle_stages < 0 or (middle_stages == 0 and middle) or (middle_stages and middle % middle_stages):
            yield V("L20", f"{L} layers minus first {first} and last {last} leave {middle} for {middle_stages} middle stages",
                    "num_layers_in_first/last_pipeline_stage so that the rest splits evenly",
                    model__num_layers=L, parallel__num_layers_in_first_pipeline_stage=first,
                    parallel__num_layers_in_last_pipeline_stage=last, parallel__pipeline_model_parallel_size=pp)
        else:
            each = middle // middle_stages if middle_stages else 0
            for name, n in (("first", first), ("last", last), ("middle", each)):
                if n is not None and n % v:
                    yield V("L20", f"the {name} stage's {n} layers do not split over VPP {v}",
                            f"a {name}-stage layer count divisible by {v}", parallel__virtual_pipeline_model_parallel_size=vpp)
        return
    slots = L + acc_e + acc_l
    extra = " (+ embedding and/or loss)" if acc_e or acc_l else ""
    if vpp is None and slots % pp:
        good = [d for d in _divisors(slots) if d <= 64]
        yield V("L14", f"{slots} layers{extra} are not divisible by pipeline-model-parallel size {pp}",
                f"parallel.pipeline_model_parallel_size=<one of {_list(good)}>, or a pipeline layout / uneven stages",
                model__num_layers=L, parallel__pipeline_model_parallel_size=pp)
    elif vpp is not None and vpp >= 1 and slots % (pp * vpp):
        yield V("L15", f"{slots} layers{extra} do not split into PP x VPP = {pp}x{vpp} = {pp * vpp} virtual stages",
                "parallel.virtual_pipeline_model_parallel_size=<VPP with (layers / PP) % VPP == 0>, or a pipeline layout",
                model__num_layers=L, parallel__pipeline_model_parallel_size=pp,
                parallel__virtual_pipeline_model_parallel_size=vpp)


@rule
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
        yield V("L21", f"seq_length {s} must be a multiple of 2 x CP = {2 * lo.cp}",
                f"train.seq_length=<multiple of {2 * lo.cp}>", train__seq_length=s, parallel__context_parallel_size=lo.cp)
    if lo.sp and lo.tp > 1 and (s // lo.cp) % lo.tp:
        yield V("L22", f"with sequence parallelism seq_length / CP = {s}/{lo.cp} = {s // lo.cp} must be divisible by TP {lo.tp}",
                f"train.seq_length=<multiple of {lo.cp * lo.tp}>", train__seq_length=s,
                parallel__tensor_model_parallel_size=lo.tp, parallel__context_parallel_size=lo.cp)


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
    good_tp = [d for d in _divisors(heads) if d <= 64]
    if heads % tp:
        yield V("L26", f"num_attention_heads {heads} must be a multiple of TP {tp}",
                f"parallel.tensor_model_parallel_size=<one of {_list(good_tp)}>", model__num_attention_heads=heads,
                parallel__tensor_model_parallel_size=tp)
    g = m.num_query_groups or heads
    if not m.multi_latent_attention and g % tp and tp % g:
        yield V("L27", f"num_query_groups {g} must be a multiple or divisor of TP {tp}",
                "parallel.tensor_model_parallel_size=<a multiple or divisor of the query groups>",
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
            yield V("L28", f"{path.split('.')[1]} {width} is not divisible by {n}", f"{knob}=<a divisor of {width}>",
                    **{path.replace(".", "__"): width, knob.replace(".", "__"): n})


# --------------------------------------------------------------------------- batch, kernels, optimizer (L30-L33)

@rule
def l30_global_batch(c: Ctx):
    gbs, mbs, dp = c.cfg.train.global_batch_size, c.cfg.train.micro_batch_size, c.layout.dp
    if gbs is not None and dp and gbs % (mbs * dp):
        unit = mbs * dp
        yield V("L30", f"global batch {gbs} is not divisible by micro batch {mbs} x DP {dp} = {unit}",
                f"train.global_batch_size={max(unit, gbs // unit * unit)} (a multiple of {unit}), or null for {unit}",
                train__global_batch_size=gbs, train__micro_batch_size=mbs)


@rule
def l31_grouped_gemm(c: Ctx):
    if c.cfg.kernels.moe_grouped_gemm and c.cfg.hardware.arch == "cpu":
        yield V("L31", "grouped-GEMM experts need a GPU with compute capability >= 8",
                "kernels.moe_grouped_gemm=false", kernels__moe_grouped_gemm=True, hardware__arch="cpu")


@rule
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
    frac = c.cfg.offload.optimizer_offload_fraction
    if not 0.0 <= frac <= 1.0:
        yield V("L33", f"optimizer_offload_fraction {frac} is outside 0..1", "offload.optimizer_offload_fraction=1.0",
                offload__optimizer_offload_fraction=frac)


# --------------------------------------------------------------------------- dispatcher (L37-L45)

@rule
def l37_l45_dispatcher(c: Ctx):
    d, r, lo = c.cfg.dispatcher, c.cfg.routing, c.layout
    if c.flex and d.moe_flex_dispatcher_backend is None:
        yield V("L38", "the flex dispatcher needs a backend", "dispatcher=deepep or dispatcher=hybridep",
                dispatcher__moe_token_dispatcher_type="flex", dispatcher__moe_flex_dispatcher_backend=None)
    if not c.flex and d.moe_flex_dispatcher_backend is not None:
        yield V("L35", f"backend {d.moe_flex_dispatcher_backend} is only used by the flex dispatcher",
                "dispatcher.moe_flex_dispatcher_backend=null", dispatcher__moe_token_dispatcher_type=d.moe_token_dispatcher_type,
                dispatcher__moe_flex_dispatcher_backend=d.moe_flex_dispatcher_backend)
    if c.flex and lo.etp * lo.ep <= 1:
        experts = c.m.num_moe_experts or 1
        good = [e for e in _divisors(experts) if e > 1 and lo.world_size % (lo.etp * e * lo.pp) == 0]
        yield V("L40", f"the flex dispatcher ({d.moe_flex_dispatcher_backend}) needs ETP x EP > 1; it is {lo.etp}x{lo.ep}",
                f"parallel.expert_model_parallel_size=<one of {_list(good)}>, or dispatcher=alltoall",
                dispatcher__name=d.name, parallel__expert_model_parallel_size=lo.ep,
                parallel__expert_tensor_parallel_size=lo.etp)
    if c.flex and d.moe_flex_dispatcher_backend == "deepep" and r.moe_pad_expert_input_to_capacity:
        yield V("L37", "flex + DeepEP does not support padding expert inputs to capacity",
                "routing.moe_pad_expert_input_to_capacity=false", dispatcher__name=d.name,
                routing__moe_pad_expert_input_to_capacity=True)
    if r.moe_pad_expert_input_to_capacity and r.moe_expert_capacity_factor is None:
        yield V("L37", "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor",
                "routing.moe_expert_capacity_factor=1.0", routing__moe_pad_expert_input_to_capacity=True,
                routing__moe_expert_capacity_factor=None)
    if r.moe_router_padding_for_quantization and (not (c.fp8 or c.cfg.precision.fp4) or
                                                  d.moe_token_dispatcher_type == "allgather"):
        yield V("L44", "moe_router_padding_for_quantization needs fp8/fp4 and an alltoall or flex dispatcher",
                "routing.moe_router_padding_for_quantization=false", routing__moe_router_padding_for_quantization=True,
                precision__name=c.cfg.precision.name, dispatcher__name=d.name)
    allowed = c.mcore.shared_expert_overlap_dispatchers
    if c.cfg.overlap.moe_shared_expert_overlap:
        if not c.m.moe_shared_expert_intermediate_size:
            yield V("L45", "moe_shared_expert_overlap needs shared experts", "overlap.moe_shared_expert_overlap=false",
                    overlap__moe_shared_expert_overlap=True, model__moe_shared_expert_intermediate_size=None)
        elif d.moe_token_dispatcher_type not in allowed:
            yield V("L45", f"moe_shared_expert_overlap works only with the {' or '.join(sorted(allowed))} dispatcher "
                    f"on megatron-core {c.mcore.version}", "dispatcher=alltoall (or overlap.moe_shared_expert_overlap=false)",
                    overlap__moe_shared_expert_overlap=True, dispatcher__name=d.name)


# --------------------------------------------------------------------------- routing (L47-L49)

@rule
def l47_l49_routing(c: Ctx):
    m = c.m
    if not m.num_moe_experts:
        return
    if m.moe_router_topk == 1 and m.moe_router_score_function == "softmax" and not m.moe_router_pre_softmax:
        yield V("L47", "top-1 routing with softmax needs moe_router_pre_softmax", "model.moe_router_pre_softmax=true",
                model__moe_router_topk=1, model__moe_router_pre_softmax=False)
    groups, gtop = m.moe_router_num_groups, m.moe_router_group_topk
    if groups is not None:
        if m.num_moe_experts % groups:
            yield V("L48", f"{m.num_moe_experts} experts do not split into {groups} routing groups",
                    "model.moe_router_num_groups=<a divisor of the experts>", model__num_moe_experts=m.num_moe_experts,
                    model__moe_router_num_groups=groups)
        if gtop is None or gtop > groups:
            yield V("L48", f"group-limited routing needs moe_router_group_topk <= moe_router_num_groups ({groups})",
                    f"model.moe_router_group_topk=<1..{groups}>", model__moe_router_num_groups=groups,
                    model__moe_router_group_topk=gtop)
    if m.moe_router_enable_expert_bias and m.moe_router_score_function not in ("sigmoid", "sqrtsoftplus"):
        yield V("L49", "expert bias needs the sigmoid (or sqrtsoftplus) score function",
                "model.moe_router_score_function=sigmoid", model__moe_router_enable_expert_bias=True,
                model__moe_router_score_function=m.moe_router_score_function)


# --------------------------------------------------------------------------- recompute, offload (L50-L56)

@rule
def l50_l54_recompute(c: Ctx):
    r = c.cfg.recompute
    gran, method, n, mods = r.recompute_granularity, r.recompute_method, r.recompute_num_layers, r.recompute_modules
    if gran == "full":
        if method is None or n is None:
            yield V("L50", "full recompute needs recompute_method (uniform|block) and recompute_num_layers",
                    "recompute.recompute_method=uniform recompute.recompute_num_layers=1",
                    recompute__recompute_method=method, recompute__recompute_num_layers=n)
        elif c.arch is not None and not 1 <= n <= c.arch.num_layers // max(c.layout.pp, 1):
            yield V("L50", f"recompute_num_layers {n} must be between 1 and the layers per pipeline rank "
                    f"({c.arch.num_layers // max(c.layout.pp, 1)})", "recompute.recompute_num_layers=1",
                    recompute__recompute_num_layers=n)
    elif method is not None or n is not None:
        yield V("L50", f"recompute_method / recompute_num_layers apply to full recompute only (granularity is {_fmt(gran)})",
                "recompute.recompute_method=null recompute.recompute_num_layers=null",
                recompute__recompute_granularity=gran, recompute__recompute_method=method, recompute__recompute_num_layers=n)
    if gran != "selective" or not mods:
        return
    unknown = sorted(set(mods) - c.mcore.recompute_modules)
    if unknown:
        yield V("L51", f"unknown recompute modules {unknown} for megatron-core {c.mcore.version}; "
                f"allowed: {', '.join(sorted(c.mcore.recompute_modules))}",
                "recompute.recompute_modules=[core_attn,layernorm]", recompute__recompute_modules=list(mods))
    if "moe_act" in mods and not c.cfg.kernels.moe_grouped_gemm:
        yield V("L52", "moe_act recompute needs grouped-GEMM experts",
                "kernels.moe_grouped_gemm=true (on a GPU), or drop moe_act from recompute.recompute_modules",
                recompute__recompute_modules=list(mods), kernels__moe_grouped_gemm=False)
    if "mla_up_proj" in mods and not c.m.multi_latent_attention:
        yield V("L52", "mla_up_proj recompute needs multi-latent attention", "drop mla_up_proj from recompute.recompute_modules",
                recompute__recompute_modules=list(mods), model__multi_latent_attention=False)
    if "shared_experts" in mods and c.cfg.overlap.moe_shared_expert_overlap:
        yield V("L53", "shared_experts recompute cannot work with moe_shared_expert_overlap",
                "overlap.moe_shared_expert_overlap=false", recompute__recompute_modules=list(mods),
                overlap__moe_shared_expert_overlap=True)
    if c.cfg.precision.fp8_recipe == "delayed" and c.fp8 and {"moe_act", "layernorm"} & set(mods):
        yield V("L54", "FP8 delayed scaling does not support moe_act or layernorm recompute",
                "precision=fp8_tensorwise, or drop moe_act/layernorm from recompute.recompute_modules",
                precision__fp8_recipe="delayed", recompute__recompute_modules=list(mods))


@rule
def l56_offload(c: Ctx):
    o = c.cfg.offload
    if not o.fine_grained_activation_offloading:
        return
    mods = list(o.offload_modules)
    if not mods:
        yield V("L56", "fine-grained activation offloading needs offload_modules", "offload.offload_modules=[expert_fc1,moe_act]",
                offload__offload_modules=mods)
    unknown = sorted(set(mods) - c.mcore.offload_modules)
    if unknown:
        yield V("L56", f"unknown offload modules {unknown}; allowed: {', '.join(sorted(c.mcore.offload_modules))}",
                "offload.offload_modules=[expert_fc1,moe_act]", offload__offload_modules=mods)
    if "attn_proj" in mods and "core_attn" not in mods:
        yield V("L56", "attn_proj cannot be offloaded without core_attn (its input is core_attn's output)",
                "add core_attn to offload.offload_modules", offload__offload_modules=mods)


# --------------------------------------------------------------------------- CUDA graphs (L57-L61)

@rule
def l57_l61_cuda_graphs(c: Ctx):
    k, r = c.cfg.kernels, c.cfg.routing
    impl, scope = k.cuda_graph_impl, set(k.cuda_graph_scope)
    if impl == "none":
        return
    if c.cfg.hardware.arch == "cpu":
        yield V("L57", "CUDA graphs need a GPU", "kernels.cuda_graph_impl=none", kernels__cuda_graph_impl=impl, hardware__arch="cpu")
    if "moe" in scope and (r.moe_expert_capacity_factor is None or not r.moe_pad_expert_input_to_capacity):
        yield V("L57", "the 'moe' graph scope needs static shapes: drop-and-pad routing (capacity factor + padding)",
                "kernels.cuda_graph_scope=[moe_router,moe_preprocess]", kernels__cuda_graph_scope=sorted(scope),
                routing__moe_expert_capacity_factor=r.moe_expert_capacity_factor)
    if {"moe", "moe_router"} <= scope:
        yield V("L58", "the 'moe' and 'moe_router' graph scopes are mutually exclusive",
                "kernels.cuda_graph_scope=[moe_router,moe_preprocess]", kernels__cuda_graph_scope=sorted(scope))
    if "moe_preprocess" in scope and "moe_router" not in scope:
        yield V("L59", "the 'moe_preprocess' graph scope needs 'moe_router'", "kernels.cuda_graph_scope=[moe_router,moe_preprocess]",
                kernels__cuda_graph_scope=sorted(scope))
    if c.cfg.recompute.recompute_granularity == "full" and impl != "full_iteration":
        yield V("L60", "full recompute works only with a full-iteration CUDA graph or none",
                "recompute=selective, or kernels.cuda_graph_impl=none", recompute__recompute_granularity="full",
                kernels__cuda_graph_impl=impl)
    mods = c.cfg.recompute.recompute_modules or []
    if impl == "transformer_engine" and "moe_router" in scope and "moe" in mods:
        yield V("L61", "MoE recompute conflicts with the TE 'moe_router' graph scope",
                "drop moe from recompute.recompute_modules", recompute__recompute_modules=list(mods),
                kernels__cuda_graph_scope=sorted(scope))


# --------------------------------------------------------------------------- EP overlap (L64-L73)

@rule
def l65_l73_ep_overlap(c: Ctx):
    o, lo = c.cfg.overlap, c.layout
    if o.delay_wgrad_compute and not o.overlap_moe_expert_parallel_comm:
        yield V("L73", "delay_wgrad_compute needs EP overlap", "overlap.overlap_moe_expert_parallel_comm=true (or overlap.delay_wgrad_compute=false)",
                overlap__delay_wgrad_compute=True, overlap__overlap_moe_expert_parallel_comm=False)
    if not o.overlap_moe_expert_parallel_comm:
        return
    off = "overlap.overlap_moe_expert_parallel_comm=false"
    if lo.ep <= 1:
        yield V("L65", "EP overlap needs EP > 1", f"an expert mesh with EP > 1, or {off}", parallel__expert_model_parallel_size=lo.ep)
    if c.cfg.dispatcher.moe_token_dispatcher_type not in ("alltoall", "flex"):
        yield V("L66", "EP overlap needs the alltoall or flex dispatcher", f"dispatcher=alltoall, or {off}",
                dispatcher__name=c.cfg.dispatcher.name)
    if lo.pp > 1 and lo.vpp is None and c.p.pipeline_model_parallel_layout is None:
        yield V("L67", "EP overlap with PP > 1 needs VPP", f"parallel.virtual_pipeline_model_parallel_size=2, or {off}",
                parallel__pipeline_model_parallel_size=lo.pp, parallel__virtual_pipeline_model_parallel_size=None)
    mods = c.cfg.recompute.recompute_modules or []
    if c.cfg.recompute.recompute_granularity == "full" or (c.cfg.recompute.recompute_granularity == "selective" and "moe" in mods):
        yield V("L68", "EP overlap cannot run with full recompute or 'moe' recompute", f"recompute=selective without moe, or {off}",
                recompute__recompute_granularity=c.cfg.recompute.recompute_granularity, recompute__recompute_modules=list(mods))
    if c.cfg.precision.params_dtype not in ("bf16", "fp16"):
        yield V("L69", "EP overlap needs BF16 or FP16 parameters", f"precision=bf16, or {off}",
                precision__params_dtype=c.cfg.precision.params_dtype)
    if o.moe_shared_expert_overlap:
        yield V("L70", "EP overlap and shared-expert overlap are mutually exclusive", "overlap.moe_shared_expert_overlap=false",
                overlap__moe_shared_expert_overlap=True)
    if c.arch is not None and c.arch.mtp > 1:
        yield V("L71", f"EP overlap allows at most one MTP block, the model has {c.arch.mtp}", off, model__mtp_num_layers=c.arch.mtp)
    scope = set(c.cfg.kernels.cuda_graph_scope)
    if c.cfg.kernels.cuda_graph_impl == "transformer_engine" and scope & {"moe", "mlp"}:
        yield V("L72", "EP overlap cannot run with a TE CUDA-graph scope on moe or mlp", "kernels.cuda_graph_scope=[moe_router]",
                kernels__cuda_graph_scope=sorted(scope))


# --------------------------------------------------------------------------- precision vs hardware (P)

# Which hardware families run each low-precision recipe (Transformer Engine).
PRECISION_ARCH = {
    "tensorwise": ("hopper", "blackwell"),
    "delayed": ("hopper", "blackwell"),
    "blockwise": ("hopper", "blackwell"),
    "mxfp8": ("blackwell",),
    "nvfp4": ("blackwell",),
}


@rule
def p01_precision_hardware(c: Ctx):
    pr, arch = c.cfg.precision, c.cfg.hardware.arch
    if pr.fp8 is not None and pr.fp8_recipe is None:
        yield V("P01", "fp8 needs an fp8_recipe", "precision=fp8_tensorwise", precision__fp8=pr.fp8)
    if pr.fp4 is not None and pr.fp4_recipe is None:
        yield V("P01", "fp4 needs an fp4_recipe", "precision=nvfp4", precision__fp4=pr.fp4)
    for recipe in (pr.fp8_recipe if pr.fp8 else None, pr.fp4_recipe if pr.fp4 else None):
        if recipe in PRECISION_ARCH and arch not in PRECISION_ARCH[recipe]:
            where = " or ".join(PRECISION_ARCH[recipe])
            yield V("P01", f"precision {pr.name} ({recipe}) runs on {where} GPUs, not on {c.cfg.hardware.name} ({arch})",
                    "precision=bf16, or a hardware preset that supports it", precision__name=pr.name,
                    hardware__name=c.cfg.hardware.name)


# --------------------------------------------------------------------------- contract (C)

@rule
def c01_contract_window(c: Ctx):
    k, iters = c.cfg.contract, c.cfg.train.train_iters
    w = list(k.window)
    if len(w) != 2:
        yield V("C01", f"contract.window must be [first, last], got {w}", "contract.window=[4,10]", contract__window=w)
        return
    first, last = w
    if k.warmup_steps < 0:
        yield V("C01", "warmup_steps must be >= 0", "contract.warmup_steps=3", contract__warmup_steps=k.warmup_steps)
    if first <= k.warmup_steps:
        yield V("C01", f"the steady window starts at step {first}, inside the {k.warmup_steps} warmup steps",
                f"contract.window=[{k.warmup_steps + 1},{max(last, k.warmup_steps + 1)}]",
                contract__window=w, contract__warmup_steps=k.warmup_steps)
    if last < first:
        yield V("C01", f"the steady window [{first},{last}] ends before it starts", f"contract.window=[{first},{first}]", contract__window=w)
    if last > iters:
        yield V("C01", f"the steady window ends at step {last}, after the run's {iters} steps",
                f"train.train_iters={last}", contract__window=w, train__train_iters=iters)


# --------------------------------------------------------------------------- megatron-core version (V)

@rule
def v01_ep1_etp_grads(c: Ctx):
    lo = c.layout
    if c.m.num_moe_experts and lo.ep == 1 and lo.tp > 1 and lo.etp != lo.tp and c.mcore.ep1_etp_wrong_expert_grads:
        yield V("V01", f"on megatron-core {c.mcore.version}, TP {lo.tp} with ETP {lo.etp} != TP and EP 1 silently "
                "leaves expert gradients unsummed over TP (wrong training; fixed in 0.19)",
                f"parallel.expert_model_parallel_size=2 (EP >= 2), or parallel.expert_tensor_parallel_size={lo.tp}",
                parallel__tensor_model_parallel_size=lo.tp, parallel__expert_tensor_parallel_size=lo.etp,
                parallel__expert_model_parallel_size=1)


# --------------------------------------------------------------------------- entry points

def check(cfg: Any, mcore: McoreFacts | None = None) -> list[Violation]:
    """Every violation of ``cfg`` (a composed config as objects, e.g. ``OmegaConf.to_object``)."""
    try:
        arch = Arch.from_model(cfg.model)
    except ValueError:
        arch = None
    ctx = Ctx(cfg, Layout.from_config(cfg), arch, mcore or mcore_facts())
    return [v for r in RULES for v in r(ctx)]


def validate(cfg: Any, subject: str | None = None, mcore: McoreFacts | None = None) -> None:
    """Raise :class:`LayoutError` listing every violation, if there are any."""
    violations = check(cfg, mcore)
    if violations:
        lo = Layout.from_config(cfg)
        raise LayoutError(violations, subject or f"{cfg.model.name} on {lo.world_size} x {cfg.hardware.name}")
