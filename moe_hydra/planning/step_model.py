"""The analytic step time of a layout: what the layout search ranks by and ``stage=plan`` predicts (every term printed).

Per rank and step, M = micro-batches per step, rows = s b / CP (/ TP with sequence parallelism), rates
the hardware's peaks (for GEMMs its measured best-shape matmul rates) times the sustained fractions of
``step_model.*`` (fitted, see below):

    compute   the GEMMs' FLOPs x tokens/step / world, each part at its rate and times what recompute re-runs
              of it (:meth:`StepModel.recompute_factors`, per ``recompute_modules`` entry as Megatron-Core
              checkpoints it): dense GEMMs (attention projections, dense and shared MLPs) at gemm_efficiency x the
              hardware's best-shape bf16 matmul rate (hardware.matmul_tflops_bf16, measured; 0.8 of the peak where
              none is declared), or low_precision_gemm_efficiency x the FP8 one; the logits in bf16 under every
              precision (Megatron-Core's output layer is outside the FP8 context) and never recomputed; core attention
              at attention_efficiency x the bf16 peak (with precision.fp8_dot_product_attention faster by what the
              FP8 GEMMs gain over bf16), a sliding window's layers charged for the keys it admits
              (flops.swa_discounted); where the unfused kind runs (no Transformer Engine, or
              kernels.attention_backend=unfused | local) the full score matrix instead: its two GEMMs over every
              key at the bf16 GEMM rate, and unfused_attention_bytes_per_score through HBM for each score
              (heads x sequence x layers per token) at hbm_efficiency x the HBM bandwidth; routed experts at the
              GEMM rate x r / (r + expert_rows_half), r = rows each expert GEMM gets per micro-batch (EP x ETP x
              rows x top-k / experts): small grouped GEMMs run below the dense rate. Or,
              whichever is slower, the weights streamed from HBM for every micro-batch (12 B per parameter).
              Plus the kernels between the GEMMs, memory-bound: the activation bytes they move per token
              (:func:`elementwise_bytes`) at hbm_efficiency x the HBM bandwidth; and gpu_ms_per_moe_layer per
              MoE layer and micro-batch for its small kernels (router, top-k, permutation indices), which run at
              no GEMM or bandwidth rate. Without sequence parallelism each TP rank also runs the norms and
              residual adds on every token (:func:`replicated_bytes`).
    ep        4 x (MoE layers/rank) x M x rows x h x 2 B per token copy (dispatch + combine, forward +
              backward; x 1.5 when recompute re-runs the MoE layer): the alltoall dispatcher sends top-k x
              (EP-1)/EP copies (one per routed expert), those to peers inside the NVLink domain over NVLink,
              those to other nodes over the scale-out NIC; a flex dispatcher (DeepEP, HybridEP) one copy per other
              rank reached over NVLink (:meth:`StepModel.nvlink_copies`) and one per other node reached over the NIC
              (uniform routing, or the routing groups' node limit; :meth:`StepModel.remote_copies`). With EP
              overlap (overlap_moe_expert_parallel_comm), up to ep_overlap_efficiency of the compute hides it.
    etp       4 x (MoE layers/rank) x M x rows x top-k x h x 2 B x (ETP-1): tokens gathered to and
              scattered from the expert-TP group
    tp        8 x (layers/rank) x M x (s b / CP) x h x 2 B (all-gather / reduce-scatter pairs; x 1.5 with full
              recompute) x a two-level ring's seconds per byte (:meth:`StepModel._collective`)
    cp        3 x (layers/rank) x M x (CP-1) x (s b / CP) x 2 kv x 2 B / TP (the KV ring)
    host      what the GPU waits for the host: host_ms per MoE (dense) layer per micro-batch, forward +
              backward (x 4/3 when recompute re-runs the layer) — kernel launches and the dispatchers'
              device-to-host syncs; x cuda_graph_host_fraction with CUDA graphs of a partial scope, none with a
              whole-iteration graph; sequential experts (no grouped GEMM) add host_ms_per_local_expert per local
              expert. The busy time is max(compute + ep + etp + tp + cp, host); ``host`` is the excess.
    dp        dense params x B over the DP x CP group + expert params x B over the EDP group, B the bytes a
              parameter moves: with the distributed optimizer the gradient reduce-scatter (4 B with
              grad_reduce_in_fp32, else the weights' 2) + the parameter all-gather (2 B, 1 with FP8 parameter
              gather), without it the gradient all-reduce (2 x the gradient's bytes); each at its two-level
              ring's seconds per byte; with overlap_grad_reduce only what the backward pass (2/3 of compute)
              cannot hide, and at least the last bucket (1 / (M x VPP) of it)
    bubble    (PP-1) / (VPP x M) x busy
    p2p       2 x VPP x M x rows x h x 2 B per stage boundary, scale-out when PP crosses nodes; with the
              interleaved schedule's overlap_p2p_comm (Megatron-LM's default, and Megatron-Bridge's whenever
              VPP > 1) each send and receive runs under the next chunk's compute, so only the pipeline's fill and
              drain wait for theirs: (PP-1) / (VPP x M) of them, the bubble's share of the step. Plus, whenever
              PP > 1, pipeline_ms_per_chunk for each model chunk and micro-batch (VPP x M): the send / receive
              pair's posting and wait, which no overlap hides
    step      the sum

Communication runs at nvlink_efficiency x half the declared bidirectional NVLink bandwidth, or at
scaleout_efficiency x the NIC's. A ring collective over a group that spans nodes runs in two levels: the group's
ranks on a node over NVLink ((g-1)/g of the bytes), then the nodes over their NICs, each rank carrying 1/g of the
bytes ((n-1)/n of that), g the group's ranks per node and n its nodes. Hardware without declared rates gets
nominal ones (1 TFLOP/s, 10 GB/s, 0.01 TB/s), so a ranking still exists.

**Calibration and its error.** The fractions are fitted to the measured runs of
benchmarks/data/measured_runs.yaml (:data:`CALIBRATION`, :mod:`moe_hydra.planning.calibration`), the hardware rates
(GEMM, attention, NVLink, NIC) held near what kernel and NCCL benchmarks measure where the runs do not pin them;
:data:`HELD_OUT` is how well they predict rows they were not fitted to (leave one source out), and every prediction
carries the range that held 90 % of them, each source weighing the same (:func:`interval`); layouts whose predicted
times differ by less than the ratio the held-out pairs were ordered right at with 95 % confidence are ties
(:func:`tie_width`). Both, and ``step_model.*``'s defaults, are read from one file,
``moe_hydra/core/step_model_fit.json`` (:mod:`moe_hydra.core.step_model_fit`), which the calibration writes with
the fingerprint of this module among others: a change here that the file was not refitted for fails
tests/test_calibration.py. The model leaves out routing imbalance, network contention, kernel-level details and
release-to-release software gains: treat it as a ranking aid for choosing what to screen, and refit
``step_model.*`` on your cluster's runs.

Pure: standard library only.
"""

from __future__ import annotations

import math
from typing import Any

from moe_hydra.core import flops, metrics, step_model_fit
from moe_hydra.core.columns import SCALARS, Mesh, numpy_ops
from moe_hydra.core.arch import Arch
from moe_hydra.core.resolved import Resolved
from moe_hydra.planning.memory import grad_bytes, weight_bytes

NOMINAL_TFLOPS, NOMINAL_GB_S = 1.0, 10.0
TERMS = ("compute", "ep", "etp", "tp", "cp", "host", "dp", "bubble", "p2p")


# How the model predicts runs it was not fitted to: |ln(predicted / measured)| of each dataset row predicted by the
# fractions fitted on the other sources (leave one source out), over all rows, the MoE and the dense ones, and of the
# ratio of two rows of one model, cluster and source (what choosing between layouts needs), over all pairs and each
# kind's. Recorded in moe_hydra/core/step_model_fit.json by benchmarks/step_model_calibration.py --fit --write.
HELD_OUT = step_model_fit.held_out()
CALIBRATION = ("sustained fractions fitted (benchmarks/step_model_calibration.py --fit, each source weighing the same, "
               "the hardware rates held near kernel and NCCL benchmarks' figures) "
               f"to {HELD_OUT['rows']} measured runs of benchmarks/data/measured_runs.yaml: Megatron-Bridge "
               "performance summaries 25.11-26.08, Megatron-MoE-ModelZoo Qwen3 (MoE; H100, B200, B300, GB200, GB300; "
               "BF16, FP8, MXFP8), vTrain's dense GPT runs on A100, one H200")


COVERAGE = 0.9  # the nominal coverage of every plan's step-time interval (plan.json: step_time.coverage)


def interval_record(kind: str, arch: str | None = None) -> dict[str, Any]:
    """The interval a prediction of a ``kind`` (``moe``, ``dense``) on hardware generation ``arch`` takes: the
    generation's own (``HELD_OUT["interval"][kind]["by_arch"][arch]["own"]``) where its rows came from enough
    sources and it met the held-out standard (:func:`moe_hydra.planning.calibration.meets`), else the kind's."""
    iv = HELD_OUT["interval"][kind]
    mine = iv["by_arch"].get(arch) or {}
    return mine["own"] if mine.get("uses") == "own" else iv


def interval(seconds: float, kind: str, arch: str | None = None) -> list[float]:
    """The range that holds :data:`COVERAGE` (90 %) of the held-out rows of the model's kind (``moe`` or ``dense``)
    on its hardware generation where the data allow (:func:`interval_record`) around a predicted step time, each
    source weighing the same: x / exp(w) to x exp(w), w the record's ``log_width``. By kind and generation because
    they err differently; by source because the rows of one source err together (the pooled rows' p90 let six runs
    of one source all miss)."""
    spread = math.exp(interval_record(kind, arch)["log_width"])
    return [seconds / spread, seconds * spread]


def coverage(kind: str, arch: str | None = None) -> dict[str, Any]:
    """``plan.json``'s ``step_time`` figures of the interval's coverage: the nominal one, the one measured leaving
    sources out (pooled over the rows), the worst source's, and what the width is taken from."""
    iv = interval_record(kind, arch)
    on_arch = (HELD_OUT["interval"][kind]["by_arch"].get(arch) or {}).get("kind") if iv.get("by_arch") else None
    return {"coverage": iv["coverage"], "held_out_coverage": iv["held_out_coverage"],
            "worst_source_coverage": iv["by_source"][iv["worst_source"]], "interval_sources": iv["sources"],
            # how the kind's interval held the rows of this generation alone (leaving each source out)
            "arch": arch, "held_out_coverage_on_arch": on_arch["held_out_coverage"] if on_arch else None,
            "interval_scheme": f"{iv['coverage']:.0%} of the held-out rows of {iv['of']} ({iv['sources']} sources), "
                               "each source weighing the same; coverage measured leaving each source out"}


def tie_width(kind: str) -> float:
    """The ratio of predicted step times below which the model orders two layouts of a ``kind`` (``moe``,
    ``dense``) right with less than 95 % confidence: ``HELD_OUT["ordering"][kind]["tie_ratio"]``, from whether the
    held-out pairs of the kind were ordered right as a function of their predicted ratio
    (:func:`moe_hydra.planning.calibration.order_width`). Few pairs give a wide ratio (the MoE pairs are 33, 29 of
    them one workload)."""
    return HELD_OUT["ordering"][kind]["tie_ratio"]


def prediction(r: Resolved, dense_params: int, expert_params: int, flops_per_token: float) -> dict | None:
    """``plan.json``'s ``step_time``: the model's step time for a resolved plan on GPU hardware, the range 90 % of
    the held-out rows of its kind (MoE or dense) fall in (:func:`interval`), its terms, what it was calibrated on,
    and the tokens/s/GPU, TFLOP/s/GPU and MFU it implies (None on the CPU preset: the model knows no CPU rates).
    ``dense_params``, ``expert_params``: the most loaded rank's."""
    cfg = r.cfg
    if cfg.hardware.arch == "cpu":
        return None
    flex = cfg.dispatcher.moe_token_dispatcher_type == "flex"
    terms = StepModel(r).terms(r, dense_params, expert_params, cfg.recompute, flex,
                               cfg.overlap.overlap_moe_expert_parallel_comm)
    seconds, world, tokens = terms.pop("step"), r.layout.world_size, r.batch.tokens_per_step
    peak, _ = metrics.peak_tflops(cfg.hardware, cfg.precision)
    tflops = flops_per_token * tokens / (seconds * world * 1e12)
    kind = "moe" if r.arch.experts else "dense"
    return {"seconds": seconds, "interval_s": interval(seconds, kind, cfg.hardware.arch), "interval_of": kind,
            **coverage(kind, cfg.hardware.arch),
            "terms": terms, "calibration": CALIBRATION,
            "held_out": HELD_OUT, "tokens_per_s_per_gpu": tokens / (seconds * world), "tflops_per_gpu": tflops,
            "mfu": tflops / peak if peak else None}


class StepModel:
    """The step-time model for one config (model, hardware, batch, step_model fractions), rates read once."""

    def __init__(self, r: Resolved):
        """Rates from the plan's hardware, precision and ``step_model`` fractions; the model and the batch (the
        layout search's candidates share them) from the plan."""
        cfg, arch = r.cfg, r.arch
        self.arch, self.world = arch, r.layout.world_size
        hw, k = cfg.hardware, cfg.step_model
        self.k = k
        self.nvlink = (hw.nvlink_bandwidth_gb_s or 2 * NOMINAL_GB_S) / 2 * 1e9 * k.nvlink_efficiency
        self.scaleout = (hw.scaleout_bandwidth_gb_s or NOMINAL_GB_S) * 1e9 * k.scaleout_efficiency
        self.hbm = (hw.hbm_bandwidth_tb_s or NOMINAL_GB_S / 1000) * 1e12
        self.domain = hw.nvlink_domain_size
        self.seq, self.gbs = r.batch.seq_length, r.batch.global_batch_size
        self.groups, self.group_topk = cfg.model.moe_router_num_groups, cfg.model.moe_router_group_topk
        self.overlap_grad_reduce = cfg.overlap.overlap_grad_reduce
        self.overlap_p2p = cfg.overlap.overlap_p2p_comm  # effective in the interleaved schedule alone
        self.chunk_s = k.pipeline_ms_per_chunk * 1e-3
        # bytes a parameter moves over DP: the gradient reduce-scatter + the parameter all-gather (distributed
        # optimizer), else the gradient all-reduce (a reduce-scatter + an all-gather of the gradient)
        g = grad_bytes(cfg)
        self.dp_bytes = g + (weight_bytes(cfg.precision) if cfg.optimizer.use_distributed_optimizer else g)
        fl = flops.swa_discounted(arch, self.seq)  # the work the kernels do: a sliding window's keys only
        self.flops = fl
        # seconds per token at the sustained rates: dense GEMMs (at the precision's rate), the logits and core
        # attention (bf16; attention in FP8 with fp8_dot_product_attention); experts apart (their rate depends on
        # the layout)
        bf16 = (hw.peak_tflops_bf16 or NOMINAL_TFLOPS) * 1e12
        # GEMMs at a fraction of the best-shape matmul rate measured on the hardware (0.8 of the peak where none is)
        matmul = (metrics.matmul_tflops(hw, cfg.precision) or NOMINAL_TFLOPS) * 1e12
        low_precision = cfg.precision.fp8 or cfg.precision.fp4
        gemm = matmul * (k.low_precision_gemm_efficiency if low_precision else k.gemm_efficiency)
        self.gemm_s = 1 / gemm
        # the blocks' dense GEMMs (MTP's projection included); the logits apart: Megatron-Core's output layer is a
        # plain ColumnParallelLinear outside the FP8 context, bf16 under every recipe, never recomputed
        self.dense_flops = fl.total - fl.routed_experts - fl.attention_core - fl.logits
        bf16_matmul = metrics.matmul_tflops(hw, metrics.BF16) or NOMINAL_TFLOPS
        bf16_gemm = bf16_matmul * 1e12 * k.gemm_efficiency
        self.logits_s = fl.logits / bf16_gemm
        streamed = self.hbm * k.hbm_efficiency
        if r.impl.attention == "flash":
            self.attention_s = fl.attention_core / (k.attention_efficiency * bf16)
            if cfg.precision.fp8 and cfg.precision.fp8_dot_product_attention:
                # FP8 attention gains over bf16 what the FP8 GEMMs gain over bf16 ones (H100: about 1.6 x, as
                # FlashAttention-3's FP8 forward over its bf16 one)
                self.attention_s /= gemm / bf16_gemm
        else:  # the whole score matrix, mask and window applied to it: its two GEMMs over every key at the dense
            # GEMM rate (twice the causal count), each score through HBM between them
            full = flops.flops_per_token(arch, self.seq).attention_core
            scores = arch.heads * self.seq * arch.blocks
            self.attention_s = 2 * full / bf16_gemm + scores * k.unfused_attention_bytes_per_score / streamed
        self.expert_flops = fl.routed_experts
        # per token, the non-GEMM kernels' HBM traffic
        dense_bytes, moe_bytes = elementwise_bytes(arch, r.impl.activation == "fused")
        self.elementwise_s = (dense_bytes / streamed, moe_bytes / streamed)
        self.replicated_s = replicated_bytes(arch) / streamed
        self.layers, self.moe_layers = arch.blocks, arch.moe_blocks
        # host time per micro-batch and MoE / dense layer (seconds): CUDA graphs replay what they capture (a
        # whole-iteration graph all of it); sequential experts launch each local expert's kernels one by one
        scope = r.impl.cuda_graph_scope
        graphed = 0.0 if scope == ("full_iteration",) else k.cuda_graph_host_fraction if scope else 1.0
        self.host_moe = k.host_ms_per_moe_layer * 1e-3 * graphed
        self.host_dense = k.host_ms_per_dense_layer * 1e-3 * graphed
        self.sequential_experts = r.impl.experts == "sequential"
        self._recompute: dict[tuple, tuple[float, ...]] = {}
        self._remote: dict[tuple[int, int, bool], float] = {}
        self._nvlink_copies: dict[tuple[int, int, bool], float] = {}

    def recompute_factors(self, recompute: Any) -> tuple[float, ...]:
        """(dense GEMMs, core attention, experts, EP/ETP all-to-all, TP, MoE-layer host, dense-layer host): what
        a recompute setting multiplies each by. Selective recompute re-runs the forward of its modules as
        Megatron-Core checkpoints them: ``core_attn`` the attention core, ``mla_up_proj`` MLA's up-projections,
        ``mlp`` the dense MLPs, ``shared_experts`` the shared experts, ``moe`` the whole MoE layer (router,
        dispatch and combine, experts); ``layernorm`` and ``moe_act`` re-run element-wise kernels only. Full
        recompute re-runs every layer's forward (the output layer excepted)."""
        key = recompute_key(recompute)
        found = self._recompute.get(key)
        if found is None:
            found = self._recompute[key] = self._factors(key)
        return found

    def _factors(self, key: tuple) -> tuple[float, ...]:
        a, fl = self.arch, self.flops
        granularity, modules = key[0], set(key[1:])
        layer_dense = fl.dense_mlp + fl.shared_experts + fl.attention_linear
        if granularity == "full":
            extra = layer_dense / 3
            return (1 + extra / self.dense_flops, 4 / 3, 4 / 3, 1.5, 1.5, 4 / 3, 4 / 3)
        if granularity != "selective":
            return (1.0,) * 7
        extra = 0.0
        if "mlp" in modules:
            extra += fl.dense_mlp / 3
        if modules & {"moe", "shared_experts"}:
            extra += fl.shared_experts / 3
        if "mla_up_proj" in modules and a.mla:
            n = a.heads
            up = (a.q_lora_rank or 0) * n * (a.qk_head_dim + a.qk_pos_emb_head_dim) + a.kv_lora_rank * n * (
                a.qk_head_dim + a.v_head_dim)
            extra += 2 * up * self.layers
        moe = "moe" in modules
        return (1 + extra / self.dense_flops, 4 / 3 if "core_attn" in modules else 1.0, 4 / 3 if moe else 1.0,
                1.5 if moe else 1.0, 1.0, 4 / 3 if moe else 1.0, 1.0)

    def remote_copies(self, ep: int, etp: int, flex: bool) -> float:
        """Copies of each token that cross the scale-out network in the all-to-all of an EP x ETP group. The
        alltoall and allgather dispatchers send one per routed expert on another node; the flex dispatchers
        (DeepEP, HybridEP) one per other node routed to, forwarding inside the node over NVLink. Routing
        is taken as uniform, or limited to ``moe_router_group_topk`` groups when the groups fall on nodes."""
        key = (ep, etp, flex)
        if key not in self._remote:
            a, group = self.arch, ep * etp
            nodes = math.ceil(group / self.domain)
            if nodes <= 1:
                copies = 0.0
            elif flex:
                reached = nodes * (1 - (1 - 1 / nodes) ** a.topk)
                if self.groups and self.group_topk and self.groups % nodes == 0:
                    reached = min(reached, self.group_topk)  # node-limited routing
                copies = reached * (nodes - 1) / nodes
            else:
                copies = a.topk * (ep - 1) / ep * (1 - self.domain / group)
            self._remote[key] = copies
        return self._remote[key]

    def nvlink_copies(self, ep: int, etp: int, flex: bool) -> float:
        """Copies of each token that the all-to-all of an EP x ETP group moves over NVLink. The alltoall and
        allgather dispatchers send one per routed expert on another rank of the node (Megatron-Core permutes a token
        into top-k rows, one per expert, before the exchange); the flex dispatchers one per other rank routed to, in
        the node or, forwarded there, in the nodes reached (DeepEP's and HybridEP's dispatch sends a token once to
        each rank that holds any of its experts, the rank's experts sharing it). Routing uniform over the experts."""
        key = (ep, etp, flex)
        if key not in self._nvlink_copies:
            a = self.arch
            if flex:
                local = a.experts // ep  # a rank holds none of a token's top-k distinct experts with this chance
                none = math.comb(a.experts - local, a.topk) / math.comb(a.experts, a.topk)
                copies = (ep - 1) * (1 - none)
            else:
                copies = a.topk * (ep - 1) / ep * min(1.0, self.domain / (ep * etp))
            self._nvlink_copies[key] = copies
        return self._nvlink_copies[key]

    def terms(self, r: Resolved, dense_params: int, expert_params: int, recompute: Any,
              flex: bool = False, ep_overlap: bool = False) -> dict[str, float]:
        """The step-time terms (seconds) of a resolved layout (of this model and batch), from the most loaded
        rank's parameters, and their sum."""
        return dict(zip((*TERMS, "step"), self._terms(Mesh.of(r), dense_params, expert_params,
                                                     self.recompute_factors(recompute), flex, ep_overlap, SCALARS)))

    def step(self, r: Resolved, dense_params: int, expert_params: int, recompute: Any,
             flex: bool = False, ep_overlap: bool = False) -> float:
        """The step time alone (what comparing communication settings needs)."""
        return self._terms(Mesh.of(r), dense_params, expert_params, self.recompute_factors(recompute), flex,
                           ep_overlap, SCALARS)[-1]

    def columns(self, mesh: Mesh, dense_params: Any, expert_params: Any, recompute: Any, flex: bool = False,
                ep_overlap: bool = False) -> tuple[Any, ...]:
        """The terms of :data:`TERMS` and the step, each a numpy column: one row per layout of ``mesh``'s columns
        (the layout search's candidates), the same numbers :meth:`terms` gives each."""
        return self._terms(mesh, dense_params, expert_params, self.recompute_factors(recompute), flex, ep_overlap,
                           numpy_ops())

    def _terms(self, lo: Mesh, dense_params: Any, expert_params: Any, factors: tuple[float, ...], flex: bool,
               ep_overlap: bool, xp: Any) -> tuple[Any, ...]:
        """The terms and the step of one layout (``xp`` :data:`SCALARS`) or of columns of them (numpy's)."""
        a, k, world, domain, nvl, out = self.arch, self.k, self.world, self.domain, self.nvlink, self.scaleout
        dense_f, attention_f, expert_f, a2a_f, tp_f, host_moe_f, host_dense_f = factors
        m, vpp = lo.m, lo.vpp
        seq_rows = self.seq * lo.mbs / lo.cp
        rows = xp.where(lo.sp, seq_rows / lo.tp, seq_rows)
        tokens = self.gbs * self.seq / world
        layers, moe_layers = self.layers / lo.pp, self.moe_layers / lo.pp
        ew_dense, ew_moe = self.elementwise_s
        compute = xp.maximum(tokens * (self.dense_flops * dense_f * self.gemm_s + self.logits_s
                                       + self.attention_s * attention_f + ew_dense * dense_f + ew_moe * expert_f),
                             12 * dense_params * m / self.hbm)
        # without sequence parallelism every TP rank runs the norms and adds in full
        compute = compute + xp.where(xp.and_(lo.tp > 1, xp.not_(lo.sp)),
                                     tokens * self.replicated_s * (lo.tp - 1) * dense_f, 0.0)
        if self.expert_flops:
            per_expert = lo.ep * lo.etp * rows * a.topk / a.experts
            rate = per_expert / (per_expert + k.expert_rows_half) / self.gemm_s
            compute = compute + xp.maximum(tokens * self.expert_flops * expert_f / rate,
                                           12 * expert_params * m / self.hbm)
            compute = compute + k.gpu_ms_per_moe_layer * 1e-3 * moe_layers * m * expert_f  # the MoE layer's small kernels
        per_copy = 4 * moe_layers * m * rows * a.h * 2 * a2a_f  # one token copy: dispatch + combine, fwd + bwd
        ep = xp.where(lo.ep > 1, per_copy * xp.each(self.nvlink_copies, lo.ep, lo.etp, flex) / nvl
                      + per_copy * xp.each(self.remote_copies, lo.ep, lo.etp, flex) / out, 0.0)
        if ep_overlap:  # hidden under another micro-batch's compute
            ep = ep - k.ep_overlap_efficiency * xp.minimum(ep, compute)
        # tokens all-gathered to and reduce-scattered from the expert-TP group, fwd + bwd
        etp = xp.where(lo.etp > 1, 4 * moe_layers * m * rows * a.topk * a.h * 2 * (lo.etp - 1) * a2a_f
                       / xp.where(lo.ep * lo.etp <= domain, nvl, out), 0.0)
        tp_bw = xp.where(lo.tp * lo.cp <= domain, nvl, out)
        tp = 8 * layers * m * seq_rows * a.h * 2 * self._collective(lo.tp, 1, xp) * tp_f
        cp = 3 * layers * m * (lo.cp - 1) * seq_rows * 2 * a.kv_width * 2 / lo.tp / tp_bw
        host_moe = self.host_moe
        if self.sequential_experts and a.experts:  # one expert's kernels after another, each launched
            host_moe = host_moe + k.host_ms_per_local_expert * 1e-3 * a.experts / lo.ep
        host = (host_moe * host_moe_f * moe_layers + self.host_dense * host_dense_f * (layers - moe_layers)) * m
        dense_dp, edp = world // (lo.tp * lo.pp), world // (lo.ep * lo.etp * lo.pp)  # DP x CP, EDP
        dp = self.dp_bytes * (dense_params * self._collective(dense_dp, lo.tp, xp)
                              + expert_params * self._collective(edp, lo.ep * lo.etp, xp))
        gpu = compute + ep + etp + tp + cp
        busy = xp.maximum(gpu, host)
        if self.overlap_grad_reduce:  # bucketed reduce-scatter under the backward pass (2/3 of compute)
            dp = xp.maximum(dp / (m * vpp), dp - 2 / 3 * compute)
        fill = (lo.pp - 1) / (vpp * m)  # the pipeline's fill and drain: the bubble's share of the step
        bubble = fill * busy
        p2p_bw = xp.where(xp.and_(world // lo.pp >= domain, world > domain), out, nvl)
        p2p = xp.where(lo.pp > 1, vpp * (2 * m * rows * a.h * 2 / p2p_bw), 0.0)
        if self.overlap_p2p:  # hidden under the next chunk's compute but in the fill and the drain
            p2p = xp.where(vpp > 1, p2p * fill, p2p)
        # each model chunk's send / receive pair, posted and waited for, forward + backward
        p2p = p2p + xp.where(lo.pp > 1, vpp * m * self.chunk_s, 0.0)
        return compute, ep, etp, tp, cp, busy - gpu, dp, bubble, p2p, busy + dp + bubble + p2p

    def _collective(self, group: Any, stride: Any, xp: Any) -> Any:
        """Seconds per byte a rank of a ``group``-rank ring collective moves, the group's ranks ``stride`` apart (the
        parallel dimensions inside it): the ranks of a node reduce over NVLink, then the nodes over their NICs, each
        rank carrying 1/(its node's ranks) of the data (a two-level all-reduce / reduce-scatter / all-gather)."""
        per_node = xp.maximum(1, xp.minimum(group, self.domain // stride))
        nodes = group // per_node
        return xp.where(group > 1, (per_node - 1) / per_node / self.nvlink
                        + (nodes - 1) / nodes / per_node / self.scaleout, 0.0)


_STREAMED = 2 * 3  # HBM bytes per bf16 activation element a kernel reads or writes, forward + backward
_NORM_AND_ADD = 2 + 3  # elements of h a block's norm (reads and writes h) and residual add (reads 2h, writes h) move


def _activation_elements(a: Arch, fused: bool, routed: bool) -> float:
    """Forward-equivalent elements of an MLP's width (forward + backward elements / 3, :data:`_STREAMED`'s
    convention) that its bias add and activation move. Fused (one kernel): a GLU reads 2 and writes 1, a plain
    activation reads and writes 1; a clamped GLU 6 more (:func:`elementwise_bytes`). Unfused (torch ops, Megatron-Core's
    path without bias_activation_fusion): a GLU's activation of the gate (read 1, write 1) and product with the
    linear half (read 2, write 1), backward the product's (read 3, write 2), the activation's (read 2, write 1) and
    the chunk's gradient concatenated (read 2, write 2): 5 + 12; a plain gelu's bias add and gelu (read 1, write 1
    each), backward (read 2, write 1; the bias gradient reads 1): 4 + 4; routed experts then multiply by the router's
    probabilities (read 1, write 1; backward read 2, write 1); a clamp's two clamps and the offset add (read 1,
    write 1 each; backward the masks read 2, write 1 each). quick_gelu's own three ops are counted as one."""
    if fused:
        return (3 + (6 if a.glu_clamp else 0)) if a.glu else 2
    fwd, bwd = (5, 12) if a.glu else (4, 4)
    if routed:
        fwd, bwd = fwd + 2, bwd + 3
    if a.glu_clamp:
        fwd, bwd = fwd + 6, bwd + 6
    return (fwd + bwd) / 3


def elementwise_bytes(a: Arch, fused_activation: bool = True) -> tuple[float, float]:
    """Bytes per token that the kernels between the GEMMs move through HBM in a step (forward and backward, three
    times the forward's reads and writes of bf16 activations), over every layer: (attention blocks and dense MLPs,
    MoE layers). Per layer: each norm reads and writes h, each residual add reads 2h and writes h, RoPE reads and
    writes the query and key heads it rotates, a (gated) activation reads 2 (3) x its width and writes one; a MoE
    layer's router writes fp32 scores per expert, its permutation copies each token to top-k rows and the
    combine reads them back, weighted, into one; its experts' activation runs on top-k x the expert width. What
    makes a small-hidden, top-8 MoE layer memory-bound where a wide dense layer is not (GEMM FLOPs grow with h^2,
    these with h). A clamped GLU (GPT-OSS) hands the fused activation a clamped copy of its input: Megatron-Core's
    ``weighted_bias_quick_geglu_impl`` chunks it, clamps each half (each reads and writes one width) and concatenates
    them (reads and writes two); in the backward the clamps' masks read the gradient and the input and write one
    width each, and the chunk's gradient is concatenated again: 8 + 10 elements of the width, 6 forward-equivalents
    more than the fused kernel's 3. ``fused_activation``: whether the bias add and activation run fused
    (``Resolved.impl.activation``); unfused, torch's ops move more (:func:`_activation_elements`)."""
    h = a.h
    act, routed_act = (_activation_elements(a, fused_activation, routed) for routed in (False, True))
    if a.mla:
        rope = 2 * (a.heads + 1) * a.qk_pos_emb_head_dim
    else:
        rope = 2 * (a.heads + a.groups) * a.head_dim
    norm_and_add = _NORM_AND_ADD * h
    attention = norm_and_add + rope
    dense_mlp = norm_and_add + act * a.ffn
    moe = (norm_and_add + 4 * a.experts + 2 * (1 + a.topk) * h + routed_act * a.topk * a.moe_ffn
           + act * a.shared_ffn)
    return (_STREAMED * (attention * a.blocks + dense_mlp * a.dense_blocks), _STREAMED * moe * a.moe_blocks)


def replicated_bytes(a: Arch) -> float:
    """Bytes per token (forward and backward, every layer) of the kernels between the GEMMs that sequence parallelism
    splits over the TP group: each block's norm (reads and writes h) and residual add (reads 2h, writes h). Without
    it each TP rank runs them on every token, (TP - 1) x these bytes more than its share (what sequence parallelism
    was introduced to remove: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models")."""
    return _STREAMED * 2 * _NORM_AND_ADD * a.h * a.blocks  # two blocks a layer: attention, MLP / MoE


def recompute_key(recompute: Any) -> tuple:
    """A recompute setting as a hashable key: ("none",), ("full",) or ("selective", *modules). Takes a
    ``recompute`` node, such a key, or the names none | full | selective (the attention core alone)."""
    if isinstance(recompute, tuple):
        return recompute[:1] + tuple(sorted(recompute[1:]))
    if isinstance(recompute, str):
        if recompute not in ("none", "full", "selective"):
            raise ValueError(f"recompute {recompute!r}: none | full | selective, or a recompute node")
        return ("selective", "core_attn") if recompute == "selective" else (recompute,)
    granularity = recompute.recompute_granularity or "none"
    if granularity != "selective":
        return (granularity,)
    return ("selective", *sorted(recompute.recompute_modules or ["core_attn"]))
