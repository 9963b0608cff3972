"""Rules on features: kernels, optimizer, dispatcher, routing, recompute/offload, CUDA graphs, EP overlap,
precision vs hardware (P), the contract window (C) and the installed megatron-core (V).

Ids follow docs/rules.md. Pure: standard library only.
"""

from __future__ import annotations

import json
import math

from moe_hydra.core import schema
from moe_hydra.core.steady import AUTO, AUTO_HISTORY
from moe_hydra.planning.rules.base import (COMM_READS, DISPATCHER_READS, Ctx, V, _divisors, _ep_choices, _fmt, _here,
                                           _list, _on_gpus, rule)

# --------------------------------------------------------------------------- dispatcher (L37-L45)

@rule(comm=DISPATCHER_READS)
def l37_l45_dispatcher(c: Ctx):
    d, r, lo = c.cfg.dispatcher, c.cfg.routing, c.layout
    if c.flex and d.moe_flex_dispatcher_backend is None:
        yield V("L38", "the flex dispatcher needs a backend",
                "dispatcher.moe_flex_dispatcher_backend=<one of deepep, hybridep> (or dispatcher=deepep, dispatcher=hybridep)",
                dispatcher__moe_token_dispatcher_type="flex", dispatcher__moe_flex_dispatcher_backend=None)
    if not c.flex and d.moe_flex_dispatcher_backend is not None:
        yield V("L35", f"backend {d.moe_flex_dispatcher_backend} is only used by the flex dispatcher",
                "dispatcher.moe_flex_dispatcher_backend=null", dispatcher__moe_token_dispatcher_type=d.moe_token_dispatcher_type,
                dispatcher__moe_flex_dispatcher_backend=d.moe_flex_dispatcher_backend)
    if c.flex and lo.etp * lo.ep <= 1:
        good = _ep_choices(c, above_one=True)
        fix = (f"parallel.expert_model_parallel_size=<one of {_list(good)}>, or dispatcher=alltoall" if good
               else "dispatcher=alltoall" + _flex_on_gpus(c))
        yield V("L40", f"the flex dispatcher ({d.moe_flex_dispatcher_backend}) needs ETP x EP > 1; it is "
                f"{lo.etp}x{lo.ep}{_here(c)}", fix,
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


def _flex_on_gpus(c: Ctx) -> str:
    """On the CPU preset, the flex dispatcher planned on GPU presets with the largest EP up to a node of 8."""
    ep = max(e for e in _divisors(c.m.num_moe_experts or 1) if e <= 8)
    if ep == 1:
        return ""
    lo = c.layout
    size = math.lcm(lo.attention_model_size, lo.etp * ep * lo.pp)
    return _on_gpus(c, size, f" parallel.expert_model_parallel_size={ep}")


# --------------------------------------------------------------------------- routing (L47-L49)

@rule(reads="fixed")
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
            good = [g for g in _divisors(m.num_moe_experts) if g >= (gtop or 1)]
            yield V("L48", f"{m.num_moe_experts} experts do not split into {groups} routing groups",
                    f"model.moe_router_num_groups=<one of {_list(good)}>", model__num_moe_experts=m.num_moe_experts,
                    model__moe_router_num_groups=groups)
        if gtop is None or gtop > groups:
            yield V("L48", f"group-limited routing needs moe_router_group_topk <= moe_router_num_groups ({groups})",
                    f"model.moe_router_group_topk={min(gtop or 1, groups)} (1..{groups})",
                    model__moe_router_num_groups=groups, model__moe_router_group_topk=gtop)
    if m.moe_router_enable_expert_bias and m.moe_router_score_function not in ("sigmoid", "sqrtsoftplus"):
        yield V("L49", "expert bias needs the sigmoid (or sqrtsoftplus) score function",
                "model.moe_router_score_function=sigmoid", model__moe_router_enable_expert_bias=True,
                model__moe_router_score_function=m.moe_router_score_function)


# --------------------------------------------------------------------------- recompute, offload (L50-L56)

@rule(reads="recompute")
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
                "recompute.recompute_modules=[core_attn]", recompute__recompute_modules=list(mods))
    if "moe_act" in mods and not c.cfg.kernels.moe_grouped_gemm:
        gemm = "kernels.moe_grouped_gemm=true"
        drop = _drop_modules(mods, "moe_act")
        yield V("L52", "moe_act recompute needs grouped-GEMM experts",
                f"{drop}, or {gemm}" if c.cfg.hardware.arch == "cpu" else f"{gemm}, or {drop}",
                recompute__recompute_modules=list(mods), kernels__moe_grouped_gemm=False)
    if "mla_up_proj" in mods and not c.m.multi_latent_attention:
        yield V("L52", "mla_up_proj recompute needs multi-latent attention", _drop_modules(mods, "mla_up_proj"),
                recompute__recompute_modules=list(mods), model__multi_latent_attention=False)
    checkpointed = [m for m in ("layernorm", "moe_act", "mla_up_proj") if m in mods]
    if checkpointed and not c.r.impl.te:
        yield V("L75", f"{', '.join(checkpointed)} recompute needs Transformer Engine, which this implementation has "
                "not: Megatron-Core's CheckpointWithoutOutput takes its FP8 branch whatever the precision "
                "(fp8=False is not None), and that branch calls TE (NameError: FP8GlobalStateManager)",
                _drop_modules(mods, *checkpointed), recompute__recompute_modules=list(mods))
    if "shared_experts" in mods and c.cfg.overlap.moe_shared_expert_overlap:
        yield V("L53", "shared_experts recompute cannot work with moe_shared_expert_overlap",
                "overlap.moe_shared_expert_overlap=false", recompute__recompute_modules=list(mods),
                overlap__moe_shared_expert_overlap=True)
    if c.cfg.precision.fp8_recipe == "delayed" and c.fp8 and {"moe_act", "layernorm"} & set(mods):
        yield V("L54", "FP8 delayed scaling does not support moe_act or layernorm recompute",
                f"precision=fp8_tensorwise, or {_drop_modules(mods, 'moe_act', 'layernorm')}",
                precision__fp8_recipe="delayed", recompute__recompute_modules=list(mods))


def _drop_modules(mods: list[str], *names: str) -> str:
    """The recompute modules without ``names``; no recompute when none is left."""
    kept = [m for m in mods if m not in names]
    return f"recompute.recompute_modules={_fmt(kept)}" if kept else "recompute=none recompute.recompute_modules=null"


@rule(reads="fixed")
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
                f"offload.offload_modules={_fmt(['core_attn', *mods])}", offload__offload_modules=mods)


# --------------------------------------------------------------------------- attention backend (L74)

@rule(reads="fixed")
def l74_attention_backend(c: Ctx):
    # the implementation that will run: declared by the preset when planning, detected on the machine for stage=run.
    # Megatron-Core's local DotProductAttention sits in the local layer spec only; under TE's spec the backend turns
    # every TE kernel off and the model has no attention
    if c.cfg.kernels.attention_backend == "local" and c.r.impl.te:
        yield V("L74", "kernels.attention_backend=local needs the local layer spec; with Transformer Engine "
                "its unfused attention is kernels.attention_backend=unfused",
                "kernels.attention_backend=unfused (or hardware.transformer_engine=false)",
                kernels__attention_backend="local", hardware__transformer_engine=True)


# --------------------------------------------------------------------------- CUDA graphs (L57-L61)

@rule(reads="recompute")  # L60/L61 read the recompute settings
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
                _drop_modules(mods, "moe"), recompute__recompute_modules=list(mods),
                kernels__cuda_graph_scope=sorted(scope))


# --------------------------------------------------------------------------- optimizer precision (O)

@rule(reads="fixed")
def o01_optimizer_dtypes(c: Ctx):
    o = c.cfg.optimizer
    if o.use_precision_aware_optimizer:
        return
    for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(o, name) != "fp32":
            yield V("O01", f"optimizer.{name} can only be fp32 without the precision-aware optimizer (Megatron-Core "
                    "asserts it); the gradient buffer's dtype is optimizer.grad_reduce_in_fp32",
                    f"optimizer.use_precision_aware_optimizer=true, or optimizer.{name}=fp32",
                    **{f"optimizer__{name}": getattr(o, name), "optimizer__use_precision_aware_optimizer": False})


# --------------------------------------------------------------------------- EP overlap (L64-L73)

@rule(reads="recompute", comm=COMM_READS)
def l65_l73_ep_overlap(c: Ctx):
    o, lo = c.cfg.overlap, c.layout
    if o.delay_wgrad_compute and not o.overlap_moe_expert_parallel_comm:
        on, keep = "overlap.overlap_moe_expert_parallel_comm=true", "overlap.delay_wgrad_compute=false"
        yield V("L73", "delay_wgrad_compute needs EP overlap", f"{on}, or {keep}" if _overlap_fits(c) else f"{keep}, or {on}",
                overlap__delay_wgrad_compute=True, overlap__overlap_moe_expert_parallel_comm=False)
    if not o.overlap_moe_expert_parallel_comm:
        return
    off = "overlap.overlap_moe_expert_parallel_comm=false"
    if not lo.expert_parallel:  # this kind of rule does not read the world: the EP sizes are named, not checked
        eps = [e for e in _divisors(c.m.num_moe_experts or 1) if e > 1]
        yield V("L65", "EP overlap needs EP > 1", f"{off}, or parallel.expert_model_parallel_size=<one of {_list(eps)}> "
                "(one that divides the world)" if eps else off, parallel__expert_model_parallel_size=lo.ep)
    if c.cfg.dispatcher.moe_token_dispatcher_type not in ("alltoall", "flex"):
        yield V("L66", "EP overlap needs the alltoall or flex dispatcher", f"dispatcher=alltoall, or {off}",
                dispatcher__name=c.cfg.dispatcher.name)
    if lo.pp > 1 and not lo.virtual_stages:  # a layout string with PP stages only leaves VPP unset too
        yield V("L67", "EP overlap with PP > 1 needs VPP", f"{off}, or parallel.virtual_pipeline_model_parallel_size=2 "
                "(VPP dividing the layers per stage)",
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


def _overlap_fits(c: Ctx) -> bool:
    """Whether EP overlap, turned on, breaks no rule of its own (L65-L72), as far as the cheap ones tell."""
    lo, mods = c.layout, c.cfg.recompute.recompute_modules or []
    return (lo.expert_parallel and c.cfg.dispatcher.moe_token_dispatcher_type in ("alltoall", "flex")
            and (lo.pp == 1 or lo.virtual_stages) and c.cfg.recompute.recompute_granularity != "full"
            and "moe" not in mods and c.cfg.precision.params_dtype in ("bf16", "fp16")
            and not c.cfg.overlap.moe_shared_expert_overlap and (c.arch is None or c.arch.mtp <= 1)
            and not (c.cfg.kernels.cuda_graph_impl == "transformer_engine"
                     and set(c.cfg.kernels.cuda_graph_scope) & {"moe", "mlp"}))


# --------------------------------------------------------------------------- precision vs hardware (P)

# Which hardware families run each low-precision recipe (Transformer Engine).
PRECISION_ARCH = {
    "tensorwise": ("hopper", "blackwell"),
    "delayed": ("hopper", "blackwell"),
    "blockwise": ("hopper", "blackwell"),
    "mxfp8": ("blackwell",),
    "nvfp4": ("blackwell",),
}


@rule(reads="fixed")
def p01_precision_hardware(c: Ctx):
    pr, arch = c.cfg.precision, c.cfg.hardware.arch
    if pr.fp8 is not None and pr.fp8_recipe is None:
        yield V("P01", "fp8 needs an fp8_recipe", "precision=fp8_tensorwise", precision__fp8=pr.fp8)
    if pr.fp4 is not None and pr.fp4_recipe is None:
        yield V("P01", "fp4 needs an fp4_recipe", "precision=nvfp4", precision__fp4=pr.fp4)
    if pr.fp8_param_gather and pr.fp8 is None:
        yield V("P01", "fp8_param_gather keeps FP8 weights, so it needs an fp8 recipe",
                "precision=fp8_tensorwise (or another fp8 preset), or precision.fp8_param_gather=false",
                precision__fp8_param_gather=True, precision__fp8=None)
    if pr.fp8_dot_product_attention and (pr.fp8 is None or c.r.impl.attention != "flash"):
        yield V("P01", "fp8_dot_product_attention runs Transformer Engine's fused attention in FP8, so it needs an fp8 "
                f"recipe and TE's fused attention (precision {pr.name}, attention {c.r.impl.attention})",
                "precision.fp8_dot_product_attention=false, or precision=fp8_tensorwise (or another fp8 preset) "
                "with hardware.transformer_engine=true and kernels.attention_backend=auto",
                precision__fp8_dot_product_attention=True, precision__fp8=pr.fp8)
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
    if isinstance(k.window, str):
        if k.window != AUTO:
            yield V("C01", f"contract.window must be [first, last] or {AUTO}, got {k.window!r}", "contract.window=auto",
                    contract__window=k.window)
        elif iters < k.warmup_steps + AUTO_HISTORY * k.steady_steps:
            yield V("C01", f"contract.window=auto judges at least {AUTO_HISTORY} x {k.steady_steps} steps "
                    f"(contract.steady_steps) after the {k.warmup_steps} warmup steps, more than the run's {iters} steps",
                    f"train.train_iters={max(schema.AUTO_MAX_STEPS, k.warmup_steps + AUTO_HISTORY * k.steady_steps)}",
                    train__train_iters=iters, contract__steady_steps=k.steady_steps,
                    contract__warmup_steps=k.warmup_steps)
        return
    w = list(k.window)
    if len(w) != 2:
        yield V("C01", f"contract.window must be [first, last] or {AUTO}, got {w}", f"contract.window={AUTO}",
                contract__window=w)
        return
    first, last = w
    if first <= k.warmup_steps:
        yield V("C01", f"the steady window starts at step {first}, inside the {k.warmup_steps} warmup steps",
                f"contract.window=[{k.warmup_steps + 1},{max(last, k.warmup_steps + 1)}]",
                contract__window=w, contract__warmup_steps=k.warmup_steps)
    if last < first:
        yield V("C01", f"the steady window [{first},{last}] ends before it starts", f"contract.window=[{first},{first}]", contract__window=w)
    if last > iters:
        yield V("C01", f"the steady window ends at step {last}, after the run's {iters} steps",
                f"train.train_iters={last}", contract__window=w, train__train_iters=iters)


@rule
def c02_profile_window(c: Ctx):
    p, k = c.cfg.profile, c.cfg.contract
    if p.name == "none":
        return
    if p.tool == "nsys" and c.cfg.hardware.arch == "cpu":
        yield V("C02", "profile.tool=nsys traces CUDA; this run has no GPU", "profile.tool=torch",
                profile__tool=p.tool, hardware__name=c.cfg.hardware.name)
    if k.window == AUTO:
        if p.steps is not None:
            yield V("C02", f"profile.steps={list(p.steps)} with contract.window=auto: the window is found while the "
                    "run steps, so fixed profiled steps may fall inside it", "profile.steps=null (the steps after "
                    "the window it finds)", profile__steps=list(p.steps), contract__window=AUTO)
        return
    steps = c.r.profile_steps
    if steps is None:
        yield V("C02", f"profile.steps must be [first, last], got {list(p.steps)}", "profile.steps=null (the steps "
                "after the window)", profile__steps=list(p.steps))
        return
    first, last = steps
    if last < first:
        yield V("C02", f"the profiled steps [{first},{last}] end before they start", f"profile.steps=[{first},{first}]",
                profile__steps=list(steps))
    if first <= k.warmup_steps:
        yield V("C02", f"the profile starts at step {first}, inside the {k.warmup_steps} warmup steps: a profile "
                "explains steady steps", f"profile.steps=null (steps {k.window[-1] + 1}.. after the window)",
                profile__steps=list(steps), contract__warmup_steps=k.warmup_steps)


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


@rule
def j01_job_context_parallel(c: Ctx):
    """The admission of stage=run: the job feeds every CP rank whole sequences (it does not split them over
    context-parallel ranks), so a CP layout is planned, searched and fitted, but not run."""
    if c.cfg.stage == "run" and c.layout.cp > 1:
        yield V("J01", f"the job does not split sequences over context-parallel ranks (CP {c.layout.cp}); "
                "plan, search and fit CP layouts with stage=plan or stage=fit",
                "parallel.context_parallel_size=1, or stage=plan", parallel__context_parallel_size=c.layout.cp,
                stage="run")


@rule(reads="fixed")
def j02_job_muon(c: Ctx):
    """The admission of stage=run: Muon is planned (its memory: one momentum buffer) but the job builds
    Megatron-Core's Adam or SGD only."""
    if c.cfg.stage == "run" and c.cfg.optimizer.optimizer == "muon":
        yield V("J02", "the job builds Megatron-Core's Adam or SGD; Muon is planned and searched, not run",
                "optimizer.optimizer=adam, or stage=plan", optimizer__optimizer="muon", stage="run")


# --------------------------------------------------------------------------- data (D)

def _data_files(c: Ctx, prefixes: list[str], path: list):
    """D04-D07, stage=run: every prefix's files are on this machine, are one Megatron indexed dataset, fit the
    model's vocabulary and leave the train split documents. Read with the standard library (the header, four
    integers of the index, the tokenizer description; the token ids of a .bin without one, up to
    core.contract.MAX_TOKEN_SCAN_BYTES), cached per file version."""
    from moe_hydra.core import contract

    vocab, found, tokenizers = c.m.vocab_size, [], {}
    for prefix in prefixes:
        try:
            found.append(contract.read_index(prefix))
        except contract.DataFileError as e:
            if e.kind == "missing":
                yield V("D04", f"data.path prefix {prefix}: {e}", f"{_without(path, prefixes, {prefix})}, or "
                        "data.path=[<a prefix with .bin and .idx>] (make one: python -m moe_hydra.data prepare --out "
                        "DIR/NAME FILE...)", data__path=path)
            else:
                yield V("D05", f"data.path prefix {prefix}: {e}", f"{_without(path, prefixes, {prefix})}, or prepare "
                        "the dataset again (python -m moe_hydra.data prepare, or Megatron-LM's "
                        "tools/preprocess_data.py)", data__path=path)
            continue
        try:
            tokenizers[prefix] = contract.read_tokenizer(prefix)
        except contract.DataFileError as e:
            yield V("D06", f"data.path prefix {prefix}: {e}", f"{_without(path, prefixes, {prefix})}, or remove or "
                    f"rewrite {prefix}{contract.TOKENIZER_SUFFIX}", data__path=path)
    described = {p: t for p, t in tokenizers.items() if t is not None}
    if len({tuple(sorted(t.items())) for t in described.values()}) > 1:
        shown = "; ".join(f"{p}: {t}" for p, t in described.items())
        first = next(iter(described.values()))
        yield V("D06", f"data.path blends datasets made with different tokenizers ({shown})",
                _without(path, prefixes, {p for p, t in described.items() if t != first}), data__path=path)
    try:
        split = contract.parse_split(c.cfg.data.split)
    except ValueError:
        split = None  # D03
    for facts in found:
        tok = tokenizers.get(facts.prefix)
        if tok is not None and tok["vocab_size"] > vocab:
            yield V("D06", f"data.path prefix {facts.prefix} was made with the {tok.get('tokenizer')} tokenizer's "
                    f"{tok['vocab_size']}-token vocabulary ({facts.prefix}{contract.TOKENIZER_SUFFIX}), larger than "
                    f"model.vocab_size={vocab}", f"model.vocab_size={tok['vocab_size']}",
                    data__path=path, model__vocab_size=vocab)
        elif tok is None and contract.DTYPE_MAX[facts.dtype] >= vocab:
            top = contract.max_token(facts)
            if top is not None and top >= vocab:
                yield V("D06", f"data.path prefix {facts.prefix} holds token id {top} ({facts.prefix}.bin, "
                        f"{facts.dtype}), not below model.vocab_size={vocab}", f"model.vocab_size={top + 1} (or the "
                        "vocabulary size of the tokenizer the data was made with)", data__path=path,
                        model__vocab_size=vocab)
        if split is not None and contract.train_documents(facts.documents, split) == 0:
            yield V("D07", f"data.split={c.cfg.data.split} leaves the train split none of the {facts.documents} "
                    f"document(s) of data.path prefix {facts.prefix}", 'data.split="969,30,1" (or more documents: '
                    "python -m moe_hydra.data prepare --documents paragraph)", data__split=c.cfg.data.split,
                    data__path=path)


def _named(path: list) -> list[str]:
    """The entries of a ``data.path`` that read as prefixes, not weights."""
    out = []
    for x in path:
        try:
            float(x)
        except (TypeError, ValueError):
            if str(x).strip():
                out.append(str(x).strip())
    return out


def _without(path: list, prefixes: list[str], bad: set[str]) -> str:
    """data.path without the ``bad`` prefixes (and their weights) when others are left, else stage=plan: a plan
    does not read the files (they may live on the cluster only)."""
    kept = [i for i, p in enumerate(prefixes) if p not in bad]
    if not kept:
        return "stage=plan (a plan does not read the files)"
    weighted = len(path) == 2 * len(prefixes)
    return "data.path=" + _fmt([x for i in kept for x in ((path[2 * i], path[2 * i + 1]) if weighted else (path[i],))])


@rule(reads="fixed")
def d01_d07_data(c: Ctx):
    """What ``data.kind=megatron`` reads: a blend in Megatron's ``--data-path`` form and a split (every stage), and,
    for stage=run, files on this machine that Megatron-Core can read and the model can embed. A plan is made
    anywhere (the data may live on the cluster only), so stage=plan and stage=fit leave the files alone."""
    from moe_hydra.core import contract

    d = c.cfg.data
    path = None if d.path is None else list(d.path)
    if d.kind != "megatron":
        if path is not None:
            yield V("D01", f"data.path is read by data.kind=megatron only; data.kind={d.kind} would ignore it",
                    "data.kind=megatron (or data.path=null)", data__kind=d.kind, data__path=path)
        return
    if not path:
        yield V("D01", "data.kind=megatron needs data.path, Megatron's --data-path: dataset prefixes, optionally "
                "with blend weights", "data.kind=mock, or data.path=[DIR/NAME] (make one: python -m moe_hydra.data "
                "prepare --out DIR/NAME FILE...)", data__kind="megatron", data__path=path)
        return
    try:
        prefixes, _ = contract.blend(path)
    except ValueError as e:
        named = _named(path)
        first = f"data.path={_fmt(named)} (its prefixes, equal weights)" if named else "data.kind=mock data.path=null"
        yield V("D02", str(e), f"{first}, or data.path=[0.3,PREFIX_A,0.7,PREFIX_B]", data__path=path)
        return
    try:
        contract.parse_split(d.split)
    except ValueError as e:
        yield V("D03", str(e), 'data.split="969,30,1"', data__split=d.split)
    if c.cfg.stage == "run":
        yield from _data_files(c, prefixes, path)


# --------------------------------------------------------------------------- calibration (K)

@rule(reads="fixed")
def k01_calibration(c: Ctx):
    """hardware.calibration: a calibration.json with a fitted step, measured on this plan's device kind with its
    implementation (the kernels a step runs); one from other software versions is used with a note (plan.py)."""
    from dataclasses import fields

    from moe_hydra.core import calibrated_step
    from moe_hydra.core.resolved import Implementation

    path = calibrated_step.named(c.cfg)
    if not path:
        return
    fix = ("hardware.calibration=null (the fitted priors), or hardware.calibration=<a calibration.json of this "
           "machine> (make one: python -m moe_hydra stage=calibrate hydra.run.dir=DIR)")
    try:
        cal, _ = calibrated_step.load(path)
    except ValueError as e:
        yield V("K01", str(e), fix, hardware__calibration=path)
        return
    other = calibrated_step.other_device(cal.get("machine") or {}, c.cfg.hardware)
    if other:
        yield V("K01", f"hardware.calibration {path} was measured on {other}", fix, hardware__calibration=path)
    impl = {f.name: getattr(c.r.impl, f.name) for f in fields(Implementation) if f.name != "source"}
    calibrated = {k: v for k, v in (cal.get("implementation") or {}).items() if k != "source"}
    differ = calibrated_step.differences(calibrated, json.loads(json.dumps(impl)))
    if differ:
        yield V("K01", f"hardware.calibration {path} was measured with another implementation: {'; '.join(differ)}",
                fix, hardware__calibration=path)
