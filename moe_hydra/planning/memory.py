"""Per-rank device memory of a layout: weights, gradients, optimizer state, activations, allowance.

Follows Megatron-Bridge's accounting (docs/flops-memory.md), made right for MoE:

**Static** (per rank of each pipeline stage, from :mod:`moe_hydra.core.params`)::

    weights     params x bytes(params_dtype)                      (fp8 recipes keep bf16 weights, 1 byte
                                                                   with precision.fp8_param_gather)
    gradients   params x 4 with grad_reduce_in_fp32, else x bytes(params_dtype) (the DDP buffer, never sharded)
    optimizer   dense  x state / (DP x CP / instances)            (distributed optimizer)
              + expert x state / (EDP / instances)
                state = master copy (0 when the weights are fp32) + Adam m and v (SGD, Muon: one
                momentum buffer), each in its dtype (fp32 unless use_precision_aware_optimizer: e.g. bf16
                moments); x (1 - offloaded fraction); not sharded without use_distributed_optimizer

For bf16 weights, fp32 gradients and the distributed optimizer this is Megatron's 6 + 12/d bytes
per parameter, with d = DP x CP for the dense part and EDP for the experts.

**Optimizer step**: what the step holds beyond the states, by the implementation that runs
(``Resolved.impl.optimizer``). torch's Adam, Megatron's fallback without Transformer Engine or Apex, computes
its update in an fp32 temporary of the shard it steps: shard x 4 bytes (x (1 - offloaded fraction)); the fused
kernels hold none. The step follows the backward pass, when no activation is held, so a stage holds the larger
of its activations and this temporary.

**Activations** (what autograd keeps for the backward pass), per micro-batch and layer, summed over
named terms so recompute and offload remove exactly the terms they remove in Megatron-Core::

    T  = s x b / CP      tokens of this rank's sequence shard     (s = seq_length, b = micro batch)
    Th = T / TP with sequence parallelism, else T                 (rows of the hidden state)

    attn_norm      Th x h             input of the attention norm
    qkv_linear     Th x h             its output, the QKV (MLA: down-projection) input    [layernorm]
    mla_down       T x (2 q_lora + 2 kv_lora + rope) MLA latents and their norms' outputs
    core_attn      T x (q + 2 kv) / TP                q, k (after RoPE), v              [mla_up_proj]
                   (MLA: nothing else of the up-projections is held; their outputs feed only the
                   RoPE, whose kernels keep cos and sin, and ``mla_up_proj`` discards q, k, v)
    core_attn_internal  flash: T x heads / TP fp32 (softmax statistics); unfused (the local spec): the
                   attention probabilities, T x heads / TP x s, twice with bf16 scores: the softmax
                   runs in fp32 (attention_softmax_in_fp32) and keeps its fp32 output, the bmm with v
                   the bf16 copy (6 bytes an element)                                 [core_attn]
    attn_proj      T x q / TP         core-attention output, kept by the attention and, as the same
                   tensor, by the projection (FP8 / FP4 recipes too: Megatron-Core sets the projection to
                   save its original input, except for delayed scaling, which adds the quantized copy)
    mlp_norm       Th x h             input of the MLP norm
    mlp_input      Th x h             its output (MLP / router / dispatcher input)    [layernorm]
    mlp            T x (fc1 width + f) / TP           dense MLP fc1 output, activation output  [mlp]
    router         Th x experts x 2 fp32              logits and scores                      [moe]
    expert_fc1     Th x k x ETP x h                   dispatched tokens (top-k duplicated)  [moe]
    expert_act_in  Th x k x fc1 width                 expert fc1 output                      [moe]
    moe_act        Th x k x fe                        expert activation output   [moe_act, moe]
    moe_act_unfused Th x k x 2 fe                     without bias_activation_fusion (impl.activation unfused):
                                                      the gate's activation and the GLU product, kept by the
                                                      ops after them (a dense or shared GLU MLP: the first, in
                                                      its own term)                       [moe_act, moe]
    expert_probs   Th x k fp32                        the routing probs the experts' activation weights by
                                                      (Megatron-Core applies them there, so the combine
                                                      keeps no expert output)                    [moe]
    shared_experts T x (fc1 width + f_sh) / TP        [shared_experts, moe]

(bracketed: the ``recompute_modules`` entry that drops the term; top-k routing is assumed balanced,
padded to capacity when ``moe_pad_expert_input_to_capacity``). Full recompute keeps one hidden state
per ``recompute_num_layers`` layers (uniform) or recomputes that many layers per model chunk (block),
plus one recomputed group live during the backward pass. Fine-grained offloading removes the
offloaded modules' terms. The last stage adds the final norm, the output layer's input and the fp32
logits of the cross-entropy (its softmax, kept for the backward pass); each MTP block adds its norms, projection
input, layer and logits. Beside them for a moment the logits in the activation dtype: the output layer's as the
cross-entropy makes its fp32 copy, their gradient as its backward returns one.

Micro-batches in flight on pipeline rank r (M per step): 1F1B holds min(PP - r, M);
the interleaved schedule holds min(2 (PP - r - 1) + (VPP - 1) PP + 1, M VPP) model-chunk
micro-batches, i.e. PP (1 + (PP - 1) / (PP VPP)) stage micro-batches on rank 0, as Megatron's schedule
warms up. EP overlap holds one layer more: the next micro-batch's forward runs layer by layer beside the oldest
one's backward, which frees as it goes. Activation elements are 2 bytes (4 with fp32 weights); in FP8 / FP4
recipes the GEMM inputs kept for the backward pass (qkv_linear, mlp_input, expert_fc1, moe_act, the dense MLP's
activation output) are Transformer Engine's quantized copies: 1 byte (+ 1/32 for MXFP8's scales), NVFP4 half.

**Workspaces**: the cuBLAS workspaces the caching allocator holds (``max_memory_allocated`` counts them), by the
implementation that runs: torch gives each (cuBLAS handle, stream) pair one, and the autograd engine runs the
backward pass on its own thread with its own handle, so two; Transformer Engine keeps one of its own, and four
more for its grouped GEMM's streams. Each is 32 MiB from Hopper on and 8.125 MiB (torch) / 4 MiB (TE) before.
They dominate a small model (tiny_moe: 64 MiB beside 34 MiB of states). Unfused attention adds Megatron's global
memory buffer for the raw scores, b x heads / TP x s x s in the activation dtype: the first layer allocates it
and every layer reuses it.

**Allowance**: declared, not estimated (``memory.*``): CUDA context, NCCL buffers, flex-dispatcher
buffers, CUDA graphs, allocator fragmentation. Listed as such in the plan.

Pure: standard library only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from moe_hydra.core.arch import Arch
from moe_hydra.core.columns import SCALARS, Mesh
from moe_hydra.core.params import RankParams
from moe_hydra.core.pipeline import RankLayers
from moe_hydra.core.resolved import Resolved

GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

# Terms each selective-recompute module drops (Megatron-Core ``recompute_modules``).
RECOMPUTE_DROPS = {
    "core_attn": ("core_attn_internal",),
    "layernorm": ("qkv_linear", "mlp_input"),
    "mla_up_proj": ("core_attn",),
    "mlp": ("mlp",),
    "moe_act": ("moe_act", "moe_act_clamped", "moe_act_unfused"),
    "moe": ("router", "expert_fc1", "expert_act_in", "moe_act", "moe_act_clamped", "moe_act_unfused", "expert_probs",
            "shared_experts"),
    "shared_experts": ("shared_experts",),
}
# Terms each fine-grained offload module moves to the host (``offload_modules``).
OFFLOAD_DROPS = {
    "attn_norm": ("attn_norm",),
    "qkv_linear": ("qkv_linear",),
    "core_attn": ("core_attn", "core_attn_internal"),
    "attn_proj": ("attn_proj",),
    "mlp_norm": ("mlp_norm",),
    "expert_fc1": ("expert_fc1",),
    "moe_act": ("moe_act",),
}
EXCLUDED = ("routing imbalance beyond the capacity factor", "workspaces of kernels other than cuBLAS",
            "memory of other processes")
MIB = 2**20


def score_buffer_bytes(r: Resolved, lo: Mesh | None = None) -> Any:
    """Megatron's global memory buffer for unfused attention's raw scores, allocated once and reused by every
    layer (none with fused attention, and none counted on the CPU preset, like the workspaces). ``lo``: the
    layout and batch (``r``'s, or columns of many)."""
    if r.impl.attention == "flash" or r.cfg.hardware.arch == "cpu":
        return 0.0
    lo, s = lo or Mesh.of(r), r.batch.seq_length
    e = 4 if r.cfg.precision.params_dtype == "fp32" else 2
    return lo.mbs * r.arch.heads / lo.tp * (s / lo.cp) * s * e


def workspace_bytes(arch: str, impl: Any) -> float:
    """The cuBLAS workspaces a rank holds (see the module docstring), by GPU architecture and implementation."""
    if arch == "cpu":
        return 0.0
    hopper_on = arch not in ("ampere",)
    torch_ws = 32 * MIB if hopper_on else 2 * 4 * MIB + 8 * 16 * 2**10
    te_ws = 32 * MIB if hopper_on else 4 * MIB
    n_te = (1 + 4 * (impl.experts == "grouped")) if impl.te else 0
    return 2 * torch_ws + n_te * te_ws


def workspaces(r: Resolved, lo: Mesh | None = None) -> Any:
    """What a rank holds for its kernels: the cuBLAS workspaces and the attention score buffer (``lo``: the layout
    and batch, ``r``'s, or columns of many)."""
    return workspace_bytes(r.cfg.hardware.arch, r.impl) + score_buffer_bytes(r, lo)


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes on one rank of one pipeline stage."""

    pp_rank: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    in_flight: float  # micro-batches of this stage's layers whose activations are held at the peak
    allowance: float
    optimizer_step: float = 0.0  # held during the optimizer step, instead of the activations
    workspaces: float = 0.0  # cuBLAS workspaces (and unfused attention's score buffer)

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + max(self.activations, self.optimizer_step)
                + self.workspaces + self.allowance)


def _state_bytes(cfg: Any) -> float:
    """Optimizer bytes per parameter before sharding: master copy + moments."""
    o, dtype = cfg.optimizer, cfg.precision.params_dtype
    aware = o.use_precision_aware_optimizer
    master = 0 if dtype == "fp32" else DTYPE_BYTES[o.main_params_dtype if aware else "fp32"]
    m = DTYPE_BYTES[o.exp_avg_dtype if aware else "fp32"]
    v = DTYPE_BYTES[o.exp_avg_sq_dtype if aware else "fp32"]
    moments = m + v if o.optimizer == "adam" else m  # sgd, muon: one momentum buffer
    return master + moments


def weight_bytes(precision: Any) -> int:
    """Bytes per weight on the device: the params dtype's, or 1 with FP8 weights (fp8_param_gather)."""
    return DTYPE_BYTES["fp8" if precision.fp8_param_gather and precision.fp8 else precision.params_dtype]


def grad_bytes(cfg: Any) -> int:
    """Bytes per parameter of the DDP gradient buffer: fp32 with fp32 weights or grad_reduce_in_fp32, else
    the weights' dtype."""
    dtype = cfg.precision.params_dtype
    return DTYPE_BYTES["fp32" if dtype == "fp32" or cfg.optimizer.grad_reduce_in_fp32 else dtype]


def layer_terms(r: Resolved, moe: bool, lo: Mesh | None = None, xp: Any = SCALARS) -> dict[str, Any]:
    """Activation bytes of one decoder layer for one micro-batch on one rank, by term. ``lo``: the layout and
    batch (``r``'s, or numpy columns of many: ``xp`` then numpy's operations)."""
    cfg, a = r.cfg, r.arch
    lo = lo or Mesh.of(r)
    s, b, tp = r.batch.seq_length, lo.mbs, lo.tp
    flash = r.impl.attention == "flash"  # fused attention keeps no score matrix; unfused keeps the probabilities
    tokens = s * b / lo.cp
    rows = xp.where(lo.sp, tokens / tp, tokens)
    e = 4 if cfg.precision.params_dtype == "fp32" else 2
    q = gemm_input_bytes(cfg.precision, e)
    h = a.h
    t: dict[str, float] = {"attn_norm": rows * h * e, "qkv_linear": rows * h * q}
    if a.mla:
        n, qk, pe, v = a.heads, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim
        ql, kvl = a.q_lora_rank or 0, a.kv_lora_rank
        t["mla_down"] = tokens * (2 * ql + 2 * kvl + pe) * e
        t["core_attn"] = tokens * n * (2 * (qk + pe) + v) / tp * e
        q_width, heads = n * v, n
    else:
        t["core_attn"] = tokens * (a.q_width + 2 * a.kv_width) / tp * e
        q_width, heads = a.q_width, a.heads
    # unfused, 16-bit scores: the local spec's torch softmax keeps its fp32 output beside the 16-bit probabilities;
    # TE's unfused attention runs the fused masked-softmax kernel (16-bit in and out, keys up to 16384) and keeps
    # the probabilities alone
    fused_softmax = r.impl.te and s <= 16384
    softmax = s * (e + 4 if e < 4 and not fused_softmax else e)
    t["core_attn_internal"] = tokens * heads / tp * (4 if flash else softmax)
    # the output, kept by the attention; delayed scaling's projection keeps a quantized copy too
    delayed = bool(cfg.precision.fp8) and cfg.precision.fp8_recipe == "delayed"
    t["attn_proj"] = tokens * q_width / tp * (e + q * delayed)
    t["mlp_norm"] = rows * h * e
    t["mlp_input"] = rows * h * q
    glu = 2 if a.glu else 1
    # unfused (torch ops, no bias_activation_fusion), a GLU's product keeps the gate's activation beside its input
    unfused = r.impl.activation == "unfused" and a.glu
    if not moe:
        t["mlp"] = tokens * a.ffn / tp * ((glu * (2 if a.glu_clamp else 1) + unfused) * e + q)  # clamped: as below
        return t
    ro = cfg.routing
    capacity = ro.moe_expert_capacity_factor if ro.moe_pad_expert_input_to_capacity and ro.moe_expert_capacity_factor else 1.0
    routed = rows * a.topk * capacity  # token copies this rank sends to experts
    t["router"] = rows * a.experts * 2 * 4
    t["expert_fc1"] = routed * lo.etp * h * q
    t["expert_act_in"] = routed * glu * a.moe_ffn * e
    t["moe_act"] = routed * a.moe_ffn * q
    if a.glu_clamp:  # the clamped copy the fused activation keeps, beside fc1's output that the clamps keep
        t["moe_act_clamped"] = routed * glu * a.moe_ffn * e
    if unfused:  # the gate's activation (kept by the product) and the product (kept by the probabilities' weighting)
        t["moe_act_unfused"] = routed * 2 * a.moe_ffn * e
    t["expert_probs"] = routed * 4
    if a.shared_ffn:
        t["shared_experts"] = tokens * (glu + 1 + unfused) * a.shared_ffn / tp * e
    return t


def recompute_drops(recompute: Any) -> frozenset[str]:
    """The activation terms a ``recompute`` node's selective recompute removes (none for other granularities)."""
    return _dropped_by(recompute.recompute_granularity == "selective",
                       tuple(recompute.recompute_modules or ["core_attn"]), ())


def gemm_input_bytes(precision: Any, e: int) -> float:
    """Bytes per element of what a GEMM keeps of its input for the backward pass: in an FP8 / FP4 recipe
    Transformer Engine keeps the quantized copy (1 byte, MXFP8 and NVFP4 one scale per 32 or 16 elements; NVFP4
    half a byte), else the activation dtype."""
    if precision.fp4:
        return 0.5 + 1 / 16
    if precision.fp8:
        return 1 + (1 / 32 if precision.fp8_recipe == "mxfp8" else 0)
    return e


def kept_bytes(terms: tuple[dict[str, float], dict[str, float]], drop: frozenset[str]) -> tuple[float, ...]:
    """(dense layer, MoE layer, the same with ``drop``'s terms removed): activation bytes per layer and micro-batch
    from :func:`layer_terms`' (dense, MoE) terms."""
    dense, moe = terms
    full_dense, full_moe = sum(dense.values()), sum(moe.values())
    return (full_dense, full_moe, full_dense - sum(v for k, v in dense.items() if k in drop),
            full_moe - sum(v for k, v in moe.items() if k in drop))


def dropped(recompute: Any, offload: Any) -> frozenset[str]:
    """The activation terms a ``recompute`` node and an ``offload`` node remove together."""
    return _dropped_by(recompute.recompute_granularity == "selective", tuple(recompute.recompute_modules or ["core_attn"]),
                       tuple(offload.offload_modules) if offload.fine_grained_activation_offloading else ())


@functools.lru_cache(maxsize=None)
def _dropped_by(selective: bool, recomputed: tuple[str, ...], offloaded: tuple[str, ...]) -> frozenset[str]:
    """The activation terms that recompute (selective, its modules) and offload (its modules) remove."""
    drop: set[str] = set()
    for module in recomputed if selective else ():
        drop.update(RECOMPUTE_DROPS.get(module, ()))
    for module in offloaded:
        drop.update(OFFLOAD_DROPS.get(module, ()))
    return frozenset(drop)


def in_flight_chunks(pp: Any, vpp: Any, pp_rank: Any, microbatches: Any, xp: Any = SCALARS) -> tuple[Any, Any]:
    """(model-chunk micro-batches held at the peak, chunks per rank) on pipeline rank ``pp_rank``:
    the schedule's warmup forwards plus the one whose backward follows (Megatron's
    ``get_pp_rank_microbatches``). EP overlap adds a layer, not a micro-batch: :meth:`Estimator._activations`.
    One rank's numbers, or columns of them (``xp``: :mod:`moe_hydra.core.columns`; ``vpp`` 1 for none)."""
    vpp = 1 if vpp is None else vpp
    interleaved = xp.and_(pp > 1, vpp > 1)
    warmup = 2 * (pp - pp_rank - 1) + (vpp - 1) * pp
    chunks = xp.where(pp == 1, xp.minimum(1, microbatches),
                      xp.where(interleaved, xp.minimum(warmup + 1, microbatches * vpp),
                               xp.minimum(pp - pp_rank, microbatches)))
    return chunks, xp.where(interleaved, vpp, 1)


@dataclass(frozen=True, slots=True)
class Stages:
    """What the activations read of a pipeline rank (:class:`~moe_hydra.core.pipeline.RankLayers`): its numbers, or
    columns of many ranks' (the layout search's)."""

    pp_rank: Any
    layers: Any  # decoder layers held, over all its chunks
    moe: Any  # of them MoE layers
    mtp: Any  # MTP blocks
    loss: Any  # whether it computes the loss

    @classmethod
    def of(cls, a: Arch, r: RankLayers) -> "Stages":
        return cls(r.pp_rank, len(r.layers), (r.mask & a.moe_mask).bit_count(), r.mtp, r.loss)


class Estimator:
    """The estimate for one config; :meth:`stages` evaluates it per pipeline stage."""

    def __init__(self, r: Resolved, lo: Mesh | None = None, xp: Any = SCALARS):
        """``lo``: the layout and batch, ``r``'s; or numpy columns of many (``xp`` numpy's operations), the
        estimate's numbers then columns too (the layout search's)."""
        cfg, a = r.cfg, r.arch
        self.cfg, self.lo, self.a = cfg, r.layout, a
        lo = lo or Mesh.of(r)
        self.pp, self.vpp, self.microbatches = lo.pp, lo.vpp, lo.m
        self.terms = (layer_terms(r, False, lo, xp), layer_terms(r, True, lo, xp) if a.experts else {})
        self.recompute(cfg.recompute)
        e = 4 if cfg.precision.params_dtype == "fp32" else 2
        tokens = r.batch.seq_length * lo.mbs / lo.cp
        rows = xp.where(lo.sp, tokens / lo.tp, tokens)
        self.hidden = rows * a.h * e  # one stored hidden state (full-recompute checkpoint)
        # final norm input + output-layer input + fp32 logits of the vocab-parallel cross-entropy
        logits = tokens * xp.each(a.padded_vocab, lo.tp) / lo.tp
        self.loss = 2 * self.hidden + logits * 4
        # the 16-bit logits (forward) or their gradient (backward) beside them; fp32 logits are their own copy
        self.logits_transient = logits * e if e < 4 else 0.0
        self.allowance = allowance(cfg)
        self.torch_adam = r.impl.optimizer == "torch" and cfg.optimizer.optimizer == "adam"
        self.workspaces = workspaces(r, lo)
        self._fixed_allowance = sum(v for k, v in self.allowance.items() if k != "fragmentation")

    def recompute(self, node: Any) -> None:
        """Estimate with this ``recompute`` node (what it keeps of each layer; the layout search climbs its ladder
        on one estimator)."""
        self.cfg = replace(self.cfg, recompute=node)
        self.full_dense, self.full_moe, self.dense_layer, self.moe_layer = kept_bytes(
            self.terms, dropped(node, self.cfg.offload))

    def static(self, ranks: list[RankParams]) -> list[tuple[float, float, float, float, float]]:
        """(weights, gradients, optimizer, optimizer step, workspaces) bytes per stage; recompute and activations
        do not change them."""
        dense_shard, expert_shard = self.shards(self.lo.dp, self.lo.cp, self.lo.edp)
        return [self.states(p.total, p.dense, p.expert, dense_shard, expert_shard) for p in ranks]

    def shards(self, dp: Any, cp: Any, edp: Any, xp: Any = SCALARS) -> tuple[Any, Any]:
        """The ranks the dense and the expert optimizer states are sharded over (DP x CP, EDP, per distributed
        optimizer instance; 1 without the distributed optimizer)."""
        o = self.cfg.optimizer
        if not o.use_distributed_optimizer:
            return 1, 1
        inst = o.num_distributed_optimizer_instances
        return xp.maximum(1, dp * cp // inst), xp.maximum(1, edp // inst)

    def states(self, total: Any, dense: Any, expert: Any, dense_shard: Any, expert_shard: Any,
               workspaces: Any = None) -> tuple[Any, Any, Any, Any, Any]:
        """(weights, gradients, optimizer, optimizer step, workspaces) bytes of a rank holding these parameters:
        numbers, or columns of many ranks'. ``workspaces``: this estimator's unless given (a column)."""
        cfg, off = self.cfg, self.cfg.offload
        on_device = 1 - off.optimizer_offload_fraction if off.optimizer_cpu_offload else 1
        state = _state_bytes(cfg) * on_device
        step = 4 * on_device if self.torch_adam else 0  # fp32 bytes per parameter of the shard
        shard = dense / dense_shard + expert / expert_shard
        return (total * weight_bytes(cfg.precision), total * grad_bytes(cfg), state * shard, step * shard,
                self.workspaces if workspaces is None else workspaces)

    def _activations(self, r: RankLayers, overlap: bool | None = None) -> tuple[float, float, float]:
        """(activation bytes, micro-batches in flight, the bytes EP overlap adds) of a pipeline rank; ``overlap``:
        EP overlap on or off (None: as configured)."""
        if overlap is None:
            overlap = self.cfg.overlap.overlap_moe_expert_parallel_comm
        return self.activations(Stages.of(self.a, r), overlap)

    def activations(self, r: Stages, overlap: bool, xp: Any = SCALARS) -> tuple[Any, Any, Any]:
        """(activation bytes, micro-batches in flight, the bytes EP overlap adds) of pipeline ranks: one rank's
        numbers, or columns (this estimator's per-layer bytes, ``pp``, ``vpp`` and ``microbatches`` then columns
        too, one row per rank). With EP overlap Megatron-Core runs the next micro-batch's forward beside the oldest
        one's backward, layer i of one with layer N-1-i of the other (its combined 1F1B step, after one more warmup
        forward): what is held grows by one layer of one micro-batch."""
        a, rc = self.a, self.cfg.recompute
        chunks, vpp = in_flight_chunks(self.pp, self.vpp, r.pp_rank, self.microbatches, xp)
        n_dense = r.layers - r.moe
        mtp_layer = xp.where(r.mtp > 0, self.moe_layer if a.mtp_is_moe else self.dense_layer, 0.0)
        mtp = r.mtp * (mtp_layer + 4 * self.hidden)
        per_mb = n_dense * self.dense_layer + r.moe * self.moe_layer + mtp
        live = 0.0
        if rc.recompute_granularity == "full":  # on ranks that hold layers
            group = rc.recompute_num_layers or 1
            layers = xp.maximum(r.layers, 1)  # (a rank without layers keeps what is above)
            avg_full = (n_dense * self.full_dense + r.moe * self.full_moe) / layers
            avg_kept = (n_dense * self.dense_layer + r.moe * self.moe_layer) / layers
            if rc.recompute_method == "block":
                recomputed = xp.minimum(layers, group * vpp)
                full = recomputed * self.hidden + (layers - recomputed) * avg_kept
            else:
                full = -(-layers // group) * self.hidden
            per_mb = xp.where(r.layers > 0, full + mtp, per_mb)
            live = xp.where(r.layers > 0, xp.minimum(group, layers) * avg_full, 0.0)  # one recomputed group's backward
        stage_mbs = chunks / vpp
        act = per_mb * stage_mbs + live
        # each micro-batch's backward at once
        act = act + xp.where(r.loss, self.loss * (1 + r.mtp) + self.logits_transient, 0.0)
        next_layer = xp.where(r.layers > 0, xp.where(r.moe > 0, self.moe_layer, self.dense_layer), 0.0)
        return act + overlap * next_layer, stage_mbs, next_layer

    def stages(self, split: tuple[RankLayers, ...], ranks: list[RankParams],
               static: list[tuple[float, float, float, float, float]] | None = None) -> list[StageMemory]:
        out = []
        for r, states in zip(split, static or self.static(ranks)):
            act, mbs, _ = self._activations(r)
            weights, grads, opt, step, ws = states
            out.append(StageMemory(r.pp_rank, weights, grads, opt, act, mbs,
                                   self.allowance_total(_estimated(states, act)), step, ws))
        return out

    def allowance_total(self, estimated: float) -> float:
        return self._fixed_allowance + self.allowance["fragmentation"] * estimated


def _estimated(states: tuple[Any, Any, Any, Any, Any], activations: Any, xp: Any = SCALARS) -> Any:
    """A stage's bytes before the allowance: its states and workspaces, and the larger of its activations and
    the optimizer step's temporary (the step follows the backward pass)."""
    weights, grads, opt, step, ws = states
    return weights + grads + opt + xp.maximum(activations, step) + ws


def allowance(cfg: Any) -> dict[str, float]:
    """Declared bytes for what the estimate cannot see (``memory.*``); fragmentation is a fraction."""
    m, gib = cfg.memory, GIB
    return {
        "cuda_context": m.cuda_context_gib * gib,
        "nccl": m.nccl_gib * gib,
        "flex_dispatcher": m.flex_dispatcher_gib * gib if cfg.dispatcher.moe_token_dispatcher_type == "flex" else 0.0,
        "cuda_graphs": m.cuda_graphs_gib * gib if cfg.kernels.cuda_graph_impl != "none" else 0.0,
        "fragmentation": m.fragmentation,
    }


def estimate(r: Resolved, ranks: list[RankParams]) -> list[StageMemory]:
    """Per pipeline stage, the memory of one of its ranks."""
    return Estimator(r).stages(r.split, ranks)


def _gib(x: float) -> float:
    return round(x / GIB, 6)


def summary(r: Resolved, stages: list[StageMemory], ranks: list[RankParams]) -> dict[str, Any]:
    """``plan.json``'s ``memory``: the most-loaded rank's breakdown (GiB), every stage, the verdict."""
    cfg = r.cfg
    worst = max(stages, key=lambda s: s.total)
    p = ranks[worst.pp_rank]
    capacity = cfg.hardware.memory_gib
    allow = allowance(cfg)
    est = worst.total - worst.allowance
    state = _state_bytes(cfg)
    return {
        "unit": "GiB",
        "most_loaded_pp_rank": worst.pp_rank,
        "total": _gib(worst.total),
        "weights": _gib(worst.weights),
        "gradients": _gib(worst.gradients),
        "optimizer": _gib(worst.optimizer),
        "activations": _gib(worst.activations),
        "optimizer_step": _gib(worst.optimizer_step),
        "workspaces": _gib(worst.workspaces),
        "allowance": _gib(worst.allowance),
        "breakdown": {
            "params_dense": p.dense, "params_expert": p.expert,
            "in_flight_microbatches": round(worst.in_flight, 3),
            "allowance": {k: (_gib(v) if k != "fragmentation" else _gib(v * est)) for k, v in allow.items()},
            "optimizer_bytes_per_param_before_sharding": state,
        },
        "per_stage": [{"pp_rank": s.pp_rank, "weights": _gib(s.weights), "gradients": _gib(s.gradients),
                       "optimizer": _gib(s.optimizer), "activations": _gib(s.activations),
                       "optimizer_step": _gib(s.optimizer_step), "workspaces": _gib(s.workspaces),
                       "in_flight_microbatches": round(s.in_flight, 3), "allowance": _gib(s.allowance),
                       "total": _gib(s.total)} for s in stages],
        "capacity": capacity,
        "margin": None if capacity is None else round(capacity - worst.total / GIB, 3),
        "excluded": list(EXCLUDED),
        "counter": "moe_hydra.planning.memory (Bridge accounting + MoE activation terms), most-loaded pipeline stage",
        "attention": r.impl.attention,
        "optimizer_impl": r.impl.optimizer,
    }


def fits(summary_: dict[str, Any]) -> bool | None:
    """True / False against the device memory; None when the hardware declares none (CPU)."""
    return None if summary_["capacity"] is None else summary_["margin"] >= 0
