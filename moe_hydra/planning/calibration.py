"""The step-time model's calibration: the measured-runs dataset, its rows planned, the fit, the held-out figures.

Each row of benchmarks/data/measured_runs.yaml is a published or measured run: its source (repository, file,
commit, release), the setting as moe_hydra overrides, and the published figures. A row is planned as
``stage=plan`` plans it (the same rules, memory estimate and step-time terms, at the row's own recompute,
dispatcher, EP overlap and CUDA graphs) and compared with its measured step time (a row whose recompute is not
published climbs the search's recompute ladder to the least that fits): the published one, or GBS x seq /
(tokens/s/GPU x GPUs), or, where only TFLOP/s/GPU is published by a source that uses Megatron-Core's counter,
FLOPs/token x GBS x seq / (TFLOP/s x GPUs).

**Fit.** The free fractions of ``step_model`` (:data:`FREE`) are fitted by scipy's least squares on log step time,
within physical bounds, the hardware rates held near what kernels are measured at (:data:`PRIOR`), the better of
two starts; the other fields are priors the dataset does not decide. **Held out**: fitted on every source but one
and judged on the rows of the one left out, for each source in turn (:func:`cross_validate`; a source is one
release's table, so the other releases of the same recipes stay in the fit).

**The record.** :func:`record` is what ``moe_hydra/core/step_model_fit.json`` holds (the schema's defaults and
the step model's held-out figures read it, :mod:`moe_hydra.core.step_model_fit`), written by
``python benchmarks/step_model_calibration.py --fit --write``: the fit rounded (:func:`rounded`), the priors, the
held-out figures, the spot checks (the step time of one row per source and GPU at the defaults, :func:`spot_rows`,
and the held-out errors of one source, :data:`SPOT_FOLD`, refitted on the others), and the fingerprint of this
module, the step model and the dataset (:data:`moe_hydra.core.step_model_fit.FINGERPRINTED`).
tests/test_calibration.py checks the fingerprint and recomputes the spot checks instead of refitting.

Rows are composed from their overrides by the caller's ``compose`` (overrides -> the typed config, as
``python -m moe_hydra`` composes them: :func:`moe_hydra.launch.compose.compose_typed`); this layer composes nothing.
Pure: the standard library, PyYAML and scipy (imported by :func:`fit`); no torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from moe_hydra.core import flops, overrides, step_model_fit
from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import Config, StepModelConfig
from moe_hydra.planning import memory, plan, rules, search
from moe_hydra.planning.step_model import COVERAGE, StepModel

Compose = Callable[[Sequence[str]], Config]

DATA = step_model_fit.ROOT / "benchmarks" / "data" / "measured_runs.yaml"  # the checkout's (not in the wheel)
# the source whose held-out errors the tests recompute (one fit, ~2 s): MoE rows on five GPU kinds
SPOT_FOLD = "mz-qwen3"
# gpu column -> (hardware preset, GPUs per node)
HARDWARE = {"a100": ("a100_sxm", 8), "h100": ("h100_sxm", 8), "h200": ("h200_sxm", 8), "b200": ("b200", 8),
            "b300": ("b300", 8), "gb200": ("gb200_nvl72", 4), "gb300": ("gb300_nvl72", 4)}
# fitted: name -> (lower, upper); the rest of StepModelConfig stays at its priors
FREE = {
    "gemm_efficiency": (0.3, 1.0),
    "low_precision_gemm_efficiency": (0.15, 1.0),
    # flash attention: FlashAttention-2 reports 50-73 % of the A100's peak forward + backward, FlashAttention-3 up to
    # 75 % of the H100's forward; the floor is half that (below it the fit spends attention on what it cannot place)
    "attention_efficiency": (0.35, 0.75),
    "expert_rows_half": (0.0, 8192.0),
    "nvlink_efficiency": (0.1, 1.0),
    "scaleout_efficiency": (0.2, 1.0),
    "host_ms_per_moe_layer": (0.0, 30.0),
    "ep_overlap_efficiency": (0.0, 1.0),
    "cuda_graph_host_fraction": (0.0, 1.0),
    "gpu_ms_per_moe_layer": (0.0, 5.0),
    # unfused attention (no TE, or attention_backend unfused / local): HBM bytes per score between its GEMMs (vTrain's
    # A100 runs and the H200 slice both run it)
    "unfused_attention_bytes_per_score": (4.0, 200.0),
    # a chunk's four NCCL p2p operations (forward and backward send and receive) take tens of microseconds each
    "pipeline_ms_per_chunk": (0.0, 1.0),
}
# What the hardware's kernels and collectives sustain, measured outside this dataset: name -> (value, sd of its log).
# The fit is a maximum a posteriori estimate under these priors: the MoE rows alone cannot tell the dense GEMM rate
# from the terms beside it (fitted freely on every source but vTrain's, the bf16 GEMM rate ran from 0.43 of the peak
# with the GPT-OSS rows to 0.95 without them), so a fraction the data does not pin stays near what kernels measure.
PRIOR = {
    # of the best-shape matmul rate the hardware preset declares (hardware.matmul_tflops_*: mamf-finder's
    # measurements, 0.73-0.87 of the datasheet peak): a layer's GEMMs, smaller and with epilogues, at about 0.8 of it
    "gemm_efficiency": (0.8, 0.2),
    # FP8 / MXFP8 GEMMs: the quantisation kernels around them, and block scaling's extra work
    "low_precision_gemm_efficiency": (0.65, 0.3),
    # FlashAttention-2: 50-73 % of the A100's peak forward + backward; FlashAttention-3: 75 % of the H100's forward
    "attention_efficiency": (0.55, 0.25),
    # NCCL's bus bandwidth inside a node: about 0.75-0.8 of the unidirectional NVLink rate on A100 / H100 (nccl-tests)
    "nvlink_efficiency": (0.75, 0.25),
    # NCCL over InfiniBand / RoCE: 0.8-0.9 of the line rate for large collectives, less for the all-to-all
    "scaleout_efficiency": (0.8, 0.25),
    # unfused attention's HBM bytes per score, counted: forward, the first GEMM writes it (2 B), the fused scale, mask
    # and softmax reads and writes it (4), dropout reads it and writes it and its mask (5), the second GEMM reads it
    # (2); backward about as much again (17). Not decided by the MoE rows: without it a fold left only the H200
    # slice to set the rate vTrain's A100 runs need
    "unfused_attention_bytes_per_score": (30.0, 0.5),
}
# a row's typical |ln| error: what weighs a prior against the data (each source counting once, its rows err together)
ROW_SD = 0.15
# the recipe settings under a row's ``other`` that moe_hydra expresses -> their override (the rest are recorded only)
OTHER = {
    "use_precision_aware_optimizer": "optimizer.use_precision_aware_optimizer",
    "main_grads_dtype": "optimizer.main_grads_dtype",
    "exp_avg_dtype": "optimizer.exp_avg_dtype",
    "exp_avg_sq_dtype": "optimizer.exp_avg_sq_dtype",
    "use_distributed_optimizer": "optimizer.use_distributed_optimizer",
    "moe_router_force_load_balancing": "routing.moe_router_force_load_balancing",
    "moe_router_fusion": "kernels.moe_router_fusion",
    "delay_wgrad_compute": "overlap.delay_wgrad_compute",
    "fine_grained_activation_offloading": "offload.fine_grained_activation_offloading",
    "offload_modules": "offload.offload_modules",
    "overlap_grad_reduce": "overlap.overlap_grad_reduce",
    "grad_reduce_in_fp32": "optimizer.grad_reduce_in_fp32",
    "attention_backend": "kernels.attention_backend",
    "fp8_dot_product_attention": "precision.fp8_dot_product_attention",
}


# ---------------------------------------------------------------------------------------------- the dataset

def load(path: Path = DATA) -> dict[str, Any]:
    """The dataset: ``sources`` (id -> provenance) and ``runs`` (rows)."""
    import yaml

    return yaml.safe_load(path.read_text())


def overrides_of(row: dict[str, Any], compose: Compose, arch: Any = None) -> list[str]:
    """A row's setting as moe_hydra overrides, from its table columns and recipe settings (+ ``extra_overrides``).
    Where the row names no pipeline layout and its layers do not divide the stages, the recipes' split
    (:func:`moe_hydra.planning.search.pipeline_split`) of ``arch``, the row's model (composed from the other
    overrides when not given: the layout overrides do not change it)."""
    preset, per_node = HARDWARE[row["gpu"]]
    n = row["num_gpus"]
    out = [f"model={row['model']}", f"hardware={preset}",
           f"hardware.nodes={n // per_node}" if n >= per_node else f"hardware.devices_per_node={n}",
           f"precision={row['precision']}", f"model.seq_length={row['seq_length']}",
           f"train.global_batch_size={row['global_batch_size']}"]
    if row.get("mtp_num_layers") is not None:
        out.append(overrides.override("model.mtp_num_layers", row["mtp_num_layers"] or None))
    out += row.get("extra_overrides") or []
    out.append(f"dispatcher={row.get('dispatcher') or 'alltoall'}")
    if row.get("ep_overlap"):
        out.append("overlap.overlap_moe_expert_parallel_comm=true")
    out += _recompute(row.get("recompute"))
    graph = row.get("cuda_graph") or {}
    if graph.get("impl", "none") != "none":
        out += [f"kernels.cuda_graph_impl={graph['impl']}",
                overrides.override("kernels.cuda_graph_scope", list(graph.get("scope") or []))]
    other = row.get("other") or {}
    if other.get("optimizer", "").startswith("dist_muon"):
        out.append("optimizer.optimizer=muon")
    if row["source"].startswith("bridge-"):
        # Bridge's benchmark mode keeps the gradient buffer in bf16 (grad_reduce_in_fp32 = False in every release's
        # scripts/performance/configs/<model>/*_llm_pretrain.py, and perf_recipes/_common.py from r0.6.0)
        out.append("optimizer.grad_reduce_in_fp32=false")
    if row["source"].startswith(("bridge-", "mz-")):
        # both overlap the gradient reduce-scatter and the parameter all-gather with compute: Bridge's
        # CommOverlapConfig and perf configs (comm_overlap.overlap_grad_reduce = True), the ModelZoo's benchmarking
        # configs (--overlap-grad-reduce --overlap-param-gather)
        out += ["overlap.overlap_grad_reduce=true", "overlap.overlap_param_gather=true"]
    out += [overrides.override(key, other[name]) for name, key in OTHER.items() if name in other
            # distributed Muon shards its state itself (the row's use_distributed_optimizer=false is Adam's flag)
            and not (name == "use_distributed_optimizer" and other.get("optimizer", "").startswith("dist_muon"))]
    vpp = row.get("virtual_pipeline_model_parallel_size")
    vpp = vpp if vpp and vpp > 1 else None
    tp, pp = row["tensor_model_parallel_size"], row["pipeline_model_parallel_size"]
    split = row.get("pipeline_layout")
    if split is None:
        arch = arch or resolve(compose(out)).arch
        split = search.pipeline_split(arch, pp, vpp) or "even"
    c = search.Candidate(tp, row["context_parallel_size"], pp, vpp, row["expert_model_parallel_size"],
                         row.get("expert_tensor_parallel_size") or 1, row.get("micro_batch_size") or 1, split)
    out += c.overrides()  # sequence parallelism with TP, as the search plans it, unless the row says otherwise
    if row.get("sequence_parallel") is False and tp > 1:
        out.append("parallel.sequence_parallel=false")
    return out


def _recompute(rc: Any) -> list[str]:
    if rc is None:  # not published: the row climbs the search's recompute ladder (Row)
        return []
    if rc == "none" or (isinstance(rc, dict) and rc.get("granularity") == "selective" and not rc.get("modules")):
        return ["recompute=none"]
    if rc["granularity"] == "full":
        return ["recompute=full", *(overrides.override(f"recompute.recompute_{k}", rc[k])
                                    for k in ("method", "num_layers") if rc.get(k) is not None)]
    return ["recompute=selective", overrides.override("recompute.recompute_modules", list(rc["modules"]))]


def measured_step(row: dict[str, Any], source: dict[str, Any], flops_per_token: float) -> tuple[float | None, str]:
    """(seconds per step, from which figure) of a row; None where it publishes no time."""
    p = row["published"]
    tokens = row["global_batch_size"] * row["seq_length"]
    if p.get("step_time_s"):
        return p["step_time_s"], "step_time_s"
    if p.get("tokens_per_s_per_gpu"):
        return tokens / (p["tokens_per_s_per_gpu"] * row["num_gpus"]), "tokens_per_s_per_gpu"
    if p.get("tflops_per_gpu") and "MCore num_floating_point_operations" in source.get("counter", ""):
        seconds = flops_per_token * tokens / (p["tflops_per_gpu"] * 1e12 * row["num_gpus"])
        return seconds, "tflops_per_gpu (Megatron-Core's counter)"
    return None, "no time published"


def candidate_of(cfg: Any) -> search.Candidate:
    """The layout search's candidate for a config's layout."""
    p = cfg.parallel
    split = p.pipeline_model_parallel_layout or ("account" if p.account_for_embedding_in_pipeline_split else "even")
    return search.Candidate(p.tensor_model_parallel_size, p.context_parallel_size, p.pipeline_model_parallel_size,
                            p.virtual_pipeline_model_parallel_size, p.expert_model_parallel_size,
                            p.expert_tensor_parallel_size or 1, cfg.train.micro_batch_size, split)


class Row:
    """One dataset row planned at its own settings: rules, memory, step-time terms (re-evaluated per fraction set)."""

    def __init__(self, row: dict[str, Any], source: dict[str, Any], compose: Compose):
        self.row, self.source, self.name = row, source, row["name"]
        # what moe_hydra cannot express: evaluated (memory, time) without it, left out of the figures
        self.excluded = "Megatron FSDP (moe_hydra plans the distributed optimizer only)" if row.get("fsdp") else None
        self.cfg = compose(["stage=plan", *row["overrides"]])
        if row.get("recompute") is None:  # not published: the least recompute that fits, as the search chooses
            s = search.Search(self.cfg)
            c = candidate_of(self.cfg)
            self.cfg = s.config(c, s.evaluate(c).recompute)
        self.r = resolve(self.cfg)
        self.refused: list[str] = []
        try:
            a = plan.assess(self.r)
        except rules.LayoutError as e:
            self.refused = [f"[{v.rule}] {v.message}" for v in e.violations]
            a = None
        if a is not None:
            self.worst = max(a.ranks, key=lambda x: x.total)
            self.peak_gib = a.peak.total / memory.GIB
            self.allowance_gib = a.peak.allowance / memory.GIB
            cap = self.cfg.hardware.memory_gib
            self.fits = cap is None or self.peak_gib <= cap
        fl = flops.flops_per_token(self.r.arch, self.r.batch.seq_length, self.r.layout.tp)
        self.measured, self.measured_from = measured_step(row, source, fl.total)
        self.flex = self.cfg.dispatcher.moe_token_dispatcher_type == "flex"

    @property
    def settings_guessed(self) -> bool:
        """A MoE row whose source publishes no dispatcher (the Bridge tables whose release's perf configs do not
        reproduce the row): its dispatcher, recompute and CUDA graphs are moe_hydra's defaults, not the run's."""
        return bool(self.r.arch.experts) and self.row.get("dispatcher") is None

    @property
    def timed(self) -> bool:
        return self.measured is not None and not self.refused and not self.excluded and self.cfg.hardware.arch != "cpu"

    def step(self, k: StepModelConfig) -> float:
        model = StepModel(self.r.with_settings(step_model=k))
        return model.step(self.r, self.worst.dense, self.worst.expert, self.cfg.recompute, self.flex,
                          self.cfg.overlap.overlap_moe_expert_parallel_comm)

    def error(self, k: StepModelConfig) -> float:
        return math.log(self.step(k) / self.measured)


def rows(compose: Compose, data: dict[str, Any] | None = None) -> list[Row]:
    """Every row of the dataset (:data:`DATA` unless given), planned."""
    data = data or load()
    return [Row(row, data["sources"][row["source"]], compose) for row in data["runs"]]


# ---------------------------------------------------------------------------------------------- fit and judge

def fit(train: list[Row], k: StepModelConfig) -> StepModelConfig:
    """The free fractions fitted to ``train``: robust least squares on log step time, within :data:`FREE`'s bounds,
    each source weighing the same however many rows it has (vTrain's 109 dense runs do not outvote a release table),
    and :data:`PRIOR`'s hardware rates weighing as what kernels and collectives are measured at. ``k`` gives the
    fields that are not fitted; its free ones are not read (not even as a start)."""
    from scipy.optimize import least_squares

    names = list(FREE)
    lo, hi = zip(*(FREE[n] for n in names))
    per_source: dict[str, int] = {}
    for r in train:
        per_source[r.row["source"]] = per_source.get(r.row["source"], 0) + 1
    weight = [math.sqrt(len(train) / (len(per_source) * per_source[r.row["source"]])) for r in train]
    # a prior's residual: its log distance in sds, as one source's worth of rows of ROW_SD each
    prior = [(names.index(n), math.log(value), ROW_SD * math.sqrt(len(train) / len(per_source)) / sd)
             for n, (value, sd) in PRIOR.items()]

    def residuals(x):
        kk = replace(k, **dict(zip(names, x)))
        return ([w * r.error(kk) for w, r in zip(weight, train)]
                + [scale * (math.log(x[i]) - centre) for i, centre, scale in prior])

    # two starts, the better kept (the loss has local minima): the priors' centres (the middle of the bounds for a
    # fraction without a prior), and the middle of the bounds. Neither is the defaults: they were fitted on every
    # row, so a fraction the training rows do not pin would keep the held-out rows' answer from there
    middle = [(a + b) / 2 for a, b in zip(lo, hi)]
    starts = ([PRIOR[n][0] if n in PRIOR else m for n, m in zip(names, middle)], middle)
    # tolerances 1e-5 (a fraction to 5 digits): scipy's 1e-8 took three times the evaluations and moved no held-out
    # figure by more than 0.0002
    fits = [least_squares(residuals, x0, bounds=(lo, hi), x_scale=[max(abs(v), 1e-2) for v in x0], diff_step=1e-3,
                          loss="soft_l1", f_scale=0.1, ftol=1e-5, xtol=1e-5, gtol=1e-5) for x0 in starts]
    return replace(k, **dict(zip(names, min(fits, key=lambda f: f.cost).x)))


def cross_validate(timed: list[Row], k: StepModelConfig, group=lambda r: r.row["source"]) -> dict[str, float]:
    """Row name -> held-out log error: each group's rows predicted by the fractions fitted on the other groups."""
    held: dict[str, float] = {}
    for g in sorted({group(r) for r in timed}):
        kk = fit([r for r in timed if group(r) != g], k)
        held.update({r.name: r.error(kk) for r in timed if group(r) == g})
    return held


def summary(errors: list[float]) -> dict[str, float]:
    """median, 90th percentile and worst |ln(predicted / measured)|, and the rows they are over."""
    a = sorted(abs(e) for e in errors)
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    return {"rows": len(a), "median": statistics.median(a), "p90": p90, "worst": a[-1]}


def ranking_error(timed: list[Row], errors: dict[str, float]) -> dict[str, float]:
    """|ln| error of the ratio of two rows' step times, over every pair of rows of one model, cluster and source
    (what choosing between layouts needs, :func:`pairs_of`): median and 90th percentile."""
    pairs = [predicted - measured for predicted, measured in pairs_of(timed, errors)]
    return summary(pairs) if pairs else {"rows": 0}


ORDER_CONFIDENCE = 0.95  # two layouts are tied when the model orders them right with less than this probability


def pairs_of(timed: list[Row], errors: dict[str, float]) -> list[tuple[float, float]]:
    """(predicted, measured) ln ratio of every pair of rows of one model, cluster and source (the pairs of
    :func:`ranking_error`), the predictions held out (``errors``: row name -> ln(predicted / measured))."""
    groups: dict[tuple, list[Row]] = {}
    for r in timed:
        # rows of other batches and sequences compare by the same ratio of errors
        groups.setdefault((r.row["source"], r.row["model"], *(r.row.get("extra_overrides") or ()), r.row["gpu"],
                           r.row["num_gpus"]), []).append(r)
    out = []
    for g in groups.values():
        for i, a in enumerate(g):
            for b in g[i + 1:]:
                measured = math.log(a.measured / b.measured)
                out.append((measured + errors[a.name] - errors[b.name], measured))
    return out


def order_width(pairs: Sequence[tuple[float, float]], confidence: float = ORDER_CONFIDENCE) -> dict[str, Any]:
    """How well a model orders pairs as a function of their predicted ln ratio ``d``: P(wrong order | d) =
    Phi(-|d| / sigma), the probit of a pair error of spread sigma, fitted by maximum likelihood on whether each
    pair was ordered right (``pairs``: (predicted, measured) ln ratios; a measured tie is never wrong). The pairs
    near the boundary decide sigma, not the tails of the error. ``tie_ratio``: the predicted ratio below which the
    order is right with less than ``confidence``, exp(z sigma) at sigma's one-sided ``confidence`` upper bound
    (the profile likelihood's), so a few pairs give a wide ratio; and the share ordered wrong among the pairs
    predicted further apart and closer than it."""
    import numpy as np
    from scipy import optimize, stats

    d = np.abs([p for p, _ in pairs])
    wrong = np.array([p * m < 0 for p, m in pairs], dtype=float)

    def nll(log_sigma: float) -> float:
        p = np.clip(stats.norm.cdf(-d / math.exp(log_sigma)), 1e-12, 1 - 1e-12)
        return float(-(wrong * np.log(p) + (1 - wrong) * np.log1p(-p)).sum())

    lo, hi = math.log(1e-4), math.log(10.0)
    best = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded")
    limit = best.fun + stats.chi2.ppf(2 * confidence - 1, 1) / 2
    upper = hi if nll(hi) <= limit else optimize.brentq(lambda s: nll(s) - limit, best.x, hi)
    ratio = math.exp(stats.norm.ppf(confidence) * math.exp(upper))
    apart = d >= math.log(ratio)
    return {"confidence": confidence, "pairs": len(pairs), "wrong": int(wrong.sum()),
            "sigma": round(math.exp(best.x), 4), "sigma_upper": round(math.exp(upper), 4),
            "tie_ratio": round(ratio, 4),
            "wrong_apart": round(float(wrong[apart].mean()), 3) if apart.any() else None,
            "wrong_within": round(float(wrong[~apart].mean()), 3) if (~apart).any() else None}


def ordering(timed: list[Row], held: dict[str, float], confidence: float = ORDER_CONFIDENCE) -> dict[str, Any]:
    """Each kind's :func:`order_width` of its held-out pairs (every kind's pairs where it has none)."""
    out = {}
    for kind, of_kind in by_kind(timed).items():
        mine = pairs_of(of_kind, held)
        out[kind] = {**order_width(mine or pairs_of(timed, held), confidence), "of": kind if mine else "every kind"}
    return out


def by_kind(timed: list[Row]) -> dict[str, list[Row]]:
    """The MoE rows and the dense ones, under the held-out figures' keys (``moe``, ``dense``)."""
    return {kind: [r for r in timed if bool(r.r.arch.experts) == moe]
            for kind, moe in (("moe", True), ("dense", False))}


MIN_SOURCES = 3  # a kind with fewer sources takes its interval from every source's rows


def source_quantile(errors: list[tuple[str, float]], coverage: float = COVERAGE) -> float:
    """The |ln| width that holds ``coverage`` of the rows when each source weighs the same (each row 1 / its
    source's rows): the pooled empirical distribution of Dunn, Wasserman and Ramdas, "Distribution-free prediction
    sets for two-layer hierarchical models" (2022), whose unit is the source, not the row. Rows of one source err
    together (one release's table, one recipe's settings), so a source of 100 rows would otherwise set the width
    for all. Without the finite-sample term (coverage x (1 + 1/S)): with 7 MoE sources it asks for the worst error
    seen, a x6 range no one could choose with."""
    count: dict[str, int] = {}
    for source, _ in errors:
        count[source] = count.get(source, 0) + 1
    weighted = sorted((abs(e), 1.0 / (count[source] * len(count))) for source, e in errors)
    total = 0.0
    for e, w in weighted:
        total += w
        if total >= coverage - 1e-9:
            return e
    return weighted[-1][0]


def intervals(timed: list[Row], held: dict[str, float], coverage: float = COVERAGE) -> dict[str, Any]:
    """Each kind's interval (``moe``, ``dense``): :func:`interval_of` its rows, the width from its own rows' errors,
    or every row's where the kind has fewer than :data:`MIN_SOURCES` sources. Under ``by_arch``, for each hardware
    generation (``hardware.arch``) of the kind: how the kind's interval held its rows leaving each source out
    (``kind``), and where its rows come from at least :data:`MIN_SOURCES` sources, the generation's own interval
    (``own``), which a plan uses (``uses``) only where it meets the held-out standard the kind's is held to
    (:func:`meets`)."""
    def enough(rows: list[Row]) -> bool:
        return len({r.row["source"] for r in rows}) >= MIN_SOURCES

    out: dict[str, Any] = {}
    for kind, of_kind in by_kind(timed).items():
        pool = of_kind if enough(of_kind) else timed
        out[kind] = {**interval_of(of_kind, pool, held, coverage), "of": kind if pool is of_kind else "every source"}
        by_arch = {}
        for arch in sorted({r.cfg.hardware.arch for r in of_kind}):
            rows = [r for r in of_kind if r.cfg.hardware.arch == arch]
            own = {**interval_of(rows, rows, held, coverage), "of": f"{kind} on {arch}"} if enough(rows) else None
            by_arch[arch] = {"kind": interval_of(rows, pool, held, coverage), "own": own,
                             "uses": "own" if own is not None and meets(own) else "kind"}
        out[kind]["by_arch"] = by_arch
    return out


def meets(iv: dict[str, Any]) -> bool:
    """The held-out standard of an interval (issue 69's goals): leaving each source out it held at least
    coverage - 5 points of the rows, no source under 60 %, at a median width (high / low) of at most 3."""
    return (iv["held_out_coverage"] >= iv["coverage"] - 0.05 and min(iv["by_source"].values()) >= 0.6
            and iv["median_width"] <= 3)


def interval_of(rows: list[Row], pool: list[Row], held: dict[str, float], coverage: float) -> dict[str, Any]:
    """The interval of ``rows``: its |ln| width (:func:`source_quantile` of the held-out errors of ``pool``), and the
    coverage measured leaving sources out: each source's rows against the width the other sources of ``pool``
    give (pooled over the rows, each source's, the worst, and the median width high / low). The errors are
    themselves held out (each source's from a fit without it), the width is not refitted per source (jackknife+'s
    shortcut)."""
    errors = [(r.row["source"], held[r.name]) for r in pool]
    by_source, widths, covered = {}, [], 0
    for src in sorted({r.row["source"] for r in rows}):
        width = source_quantile([(s, e) for s, e in errors if s != src], coverage)
        mine = [abs(held[r.name]) for r in rows if r.row["source"] == src]
        hits = sum(e <= width for e in mine)
        by_source[src] = round(hits / len(mine), 3)
        covered += hits
        widths.append(math.exp(2 * width))
    worst = min(by_source, key=by_source.__getitem__)
    return {"coverage": coverage, "log_width": round(source_quantile(errors, coverage), 3),
            "sources": len({s for s, _ in errors}), "rows": len(rows),
            "held_out_coverage": round(covered / len(rows), 3), "by_source": by_source, "worst_source": worst,
            "median_width": round(statistics.median(widths), 2)}


def held_out(timed: list[Row], held: dict[str, float]) -> dict[str, Any]:
    """The held-out figures as ``plan.json`` states them (3 decimals): over every row, each kind's, and the ranking
    error of every pair of one model, cluster and source."""
    def part(of: list[Row]) -> dict[str, Any]:
        s, rank = summary([held[r.name] for r in of]), ranking_error(of, held)
        return {"rows": s["rows"], **{n: round(s[n], 3) for n in ("median", "p90", "worst")},
                "ranking_pairs": rank["rows"], "ranking_median": round(rank["median"], 3),
                "ranking_p90": round(rank["p90"], 3)}

    everything = part(timed)
    return {"scheme": "leave one source out", "sources": len({r.row["source"] for r in timed}),
            **{n: everything[n] for n in ("rows", "median", "p90", "worst")},
            **{kind: part(of_kind) for kind, of_kind in by_kind(timed).items()},
            **{n: everything[n] for n in ("ranking_pairs", "ranking_median", "ranking_p90")},
            "interval": intervals(timed, held), "ordering": ordering(timed, held)}


# The overrides a row's search does not take as given: the layout it chooses, and what the key below names.
LAYOUT_OVERRIDES = ("parallel.", "train.micro_batch_size=", "recompute", "dispatcher=",
                    "overlap.overlap_moe_expert_parallel_comm=")


def search_key(row: Row) -> tuple:
    """What a row's layout search is a function of: every override but its layout (the model's sizes, the cluster,
    the batch, the precision, the kernels), its micro batch, dispatcher and EP overlap. Rows with equal keys share
    one search."""
    cfg = row.cfg
    return (tuple(o for o in row.row["overrides"] if not o.startswith(LAYOUT_OVERRIDES)), cfg.train.micro_batch_size,
            cfg.dispatcher.name, cfg.overlap.overlap_moe_expert_parallel_comm)


# ---------------------------------------------------------------------------------------------- the record

def rounded(x: float) -> float:
    """A fitted value as the record keeps it: 3 significant digits, whole numbers from 100 up, at most 4 decimals
    (pipeline_ms_per_chunk to a tenth of a microsecond: the runs barely pin it). The fit's tolerance is 5 digits;
    the held-out figures do not see the third."""
    return float(round(x, min(4, max(0, 2 - math.floor(math.log10(abs(x))))))) if x else 0.0


def spot_rows(timed: list[Row]) -> list[Row]:
    """The first row of each source and GPU: whose step time at the defaults the record keeps."""
    first: dict[tuple[str, str], Row] = {}
    for r in timed:
        first.setdefault((r.row["source"], r.row["gpu"]), r)
    return list(first.values())


def record(timed: list[Row], k: StepModelConfig, held: dict[str, float], fitted: StepModelConfig,
           root: Path = step_model_fit.ROOT) -> dict[str, Any]:
    """What ``step_model_fit.json`` holds: ``fitted`` (rounded, :func:`rounded`) and the priors (``k``'s other
    fields), the held-out figures of ``held`` (:func:`cross_validate`), the spot checks at the fitted defaults,
    when and at which commit, and the fingerprint."""
    values = {n: rounded(getattr(fitted, n)) for n in FREE}
    priors = {f.name: getattr(k, f.name) for f in dataclasses.fields(StepModelConfig) if f.name not in FREE}
    defaults = replace(k, **values)
    return {
        "about": ("The step-time model's calibration (moe_hydra.planning.calibration): step_model.*'s defaults, "
                  "'fitted' to benchmarks/data/measured_runs.yaml or 'priors' the dataset does not decide, and "
                  "how the fit predicts rows it was not fitted to ('held_out'). Written by `"
                  + step_model_fit.REFIT + "`; tests/test_calibration.py checks the fingerprint and recomputes the "
                  "spot checks."),
        "fitted": values,
        "priors": priors,
        "held_out": held_out(timed, held),
        "spot_checks": {
            "step_s": {r.name: float(f"{r.step(defaults):.4g}") for r in spot_rows(timed)},
            "fold": SPOT_FOLD,
            "fold_errors": {r.name: round(held[r.name], 4) for r in timed if r.row["source"] == SPOT_FOLD},
        },
        "fitted_at": {"date": datetime.date.today().isoformat(), "commit": _head(root)},
        "fingerprint": step_model_fit.fingerprint(values, priors, root),
    }


def _head(root: Path) -> str | None:
    """The checkout's commit (its uncommitted changes to the fingerprinted files are in the fingerprint only)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()

