"""The step time measured on its own machine: ``stage=calibrate`` times the model's real training step (Megatron-Core's
blocks, forward + backward through its pipeline schedule, the optimizer step) at shrunken depths and several token
shapes, fits the form below, and ``stage=plan`` with ``hardware.calibration=FILE`` reads the fit back (docs/calibrate.md).

A step of a layout with pipeline size PP, M micro-batches per step and l layers on each pipeline stage, a
micro-batch holding t tokens of sequences s long, takes

    T = per_step + per_step_layer l
        + (M + PP - 1) (per_microbatch + per_microbatch_token t + l (per_layer + per_layer_token t + per_layer_token_seq t s))

- ``per_step``, ``per_step_layer``: once a step, the optimizer step and the gradients' reduction over the
  data-parallel group (their work grows with the parameters, so with the layers);
- ``M + PP - 1``: the 1F1B schedule's slots, each one micro-batch's forward and backward on one stage (PP - 1 of
  them the pipeline's fill and drain);
- ``per_microbatch``, ``per_microbatch_token``: the embedding, the logits and the loss of a micro-batch, and its
  fixed host cost (the schedule, the data);
- ``per_layer``, ``per_layer_token``, ``per_layer_token_seq``: one layer's forward and backward — its host cost
  (module calls, kernel launches, the router's syncs), its GEMMs, element-wise kernels and communication (per
  token), its core attention (per token and key).

A MoE model's step adds what the expert row counts it meets for the first time cost (:func:`new_rows_term`: on a
CPU a bf16 GEMM's kernel is made for each new shape), measured apart from the form, which the calibration's steps
on one batch each do not see.

The coefficients are fitted by non-negative least squares on the relative error (each measured point weighs the
same, whatever its time: ``scipy.optimize.nnls``), and judged on points the fit did not see: each point predicted
by the fit of all the others (leave one out). That held-out error, not the fit's, is the interval a plan states.

A calibration holds for what it measured: one model's widths, one implementation, its processes and the settings
that change what a layer runs (:func:`holds`), on each layout it measured (one fit each, ``layouts``); its depth,
micro-batch size, sequence length and micro-batches per step are what the form extrapolates over. The other options
of the variant groups (:data:`VARIANT_GROUPS`: recompute, the dispatcher) are measured on each layout as what they add
to its layers' coefficients, a factor on their work and more per token and key (:func:`variant_terms`), each with
its own held-out error.

Pure: the standard library; numpy and scipy inside :func:`fit`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import statistics
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# calibration.json's version: 2, the model's step measured and fitted (``step``); 3, a variant measured as what it
# adds to the layers' coefficients (``deltas``), not as a factor on their time. A file of an older one is refused.
VERSION = 3
TERMS = ("per_step", "per_step_layer", "per_microbatch", "per_microbatch_token", "per_layer", "per_layer_token",
         "per_layer_token_seq")
FORM = ("T = per_step + per_step_layer l + (M + PP - 1) (per_microbatch + per_microbatch_token t "
        "+ l (per_layer + per_layer_token t + per_layer_token_seq t s))")
# model keys the fit extrapolates over (the rest of the model, its widths, is what it holds for)
MODEL_VARIED = ("name", "num_layers", "seq_length", "max_position_embeddings", "moe_layer_freq")
# config nodes that change what a layer runs: a calibration holds for their values
SETTINGS_HELD = ("precision", "routing", "kernels", "overlap", "offload")
# config groups whose options a calibration measures on each layout, as a factor on the layers' time
VARIANT_GROUPS = {"recompute": ("none", "selective", "full"), "dispatcher": ("alltoall", "allgather")}
LAYOUT_KEYS = ("tp", "cp", "ep", "etp", "pp", "vpp", "dp", "sp")


@dataclass(frozen=True)
class Shape:
    """One measured (or predicted) step: pipeline size, micro-batches per step, layers on a stage, tokens per
    micro-batch, sequence length."""

    pp: int
    microbatches: int
    layers: int
    tokens: int
    seq: int

    @property
    def slots(self) -> int:
        return self.microbatches + self.pp - 1

    def features(self) -> list[float]:
        """The form's terms at this shape, each coefficient's multiplier (in :data:`TERMS`' order)."""
        k, l, t = self.slots, self.layers, self.tokens
        return [1.0, l, k, k * t, k * l, k * l * t, k * l * t * self.seq]


def predict(coefficients: dict[str, float], shape: Shape) -> tuple[float, dict[str, float]]:
    """Seconds a step of ``shape`` takes, and the parts: ``optimizer`` (once a step), ``microbatch`` (embedding,
    logits, loss), ``layers`` (the stage's layers), over the schedule's slots."""
    f = dict(zip(TERMS, shape.features()))
    part = {name: coefficients[name] * f[name] for name in TERMS}
    terms = {"optimizer": part["per_step"] + part["per_step_layer"],
             "microbatch": part["per_microbatch"] + part["per_microbatch_token"],
             "layers": part["per_layer"] + part["per_layer_token"] + part["per_layer_token_seq"]}
    return sum(terms.values()), terms


def fit(shapes: list[Shape], seconds: list[float]) -> dict[str, float]:
    """The coefficients (seconds per unit of each term, >= 0) that best predict ``seconds``, relative error."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.array([[x / s for x in sh.features()] for sh, s in zip(shapes, seconds)])
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(a / scale, np.ones(len(seconds)))
    return {name: float(c) for name, c in zip(TERMS, solution / scale)}


def held_out(shapes: list[Shape], seconds: list[float]) -> list[float]:
    """|ln(predicted / measured)| of each point, predicted by the fit of the others."""
    errors = []
    for i in range(len(shapes)):
        c = fit(shapes[:i] + shapes[i + 1:], seconds[:i] + seconds[i + 1:])
        errors.append(abs(math.log(max(predict(c, shapes[i])[0], 1e-12) / seconds[i])))
    return errors


def summary(errors: list[float]) -> dict[str, Any]:
    """Median, 90th percentile (nearest rank) and worst of held-out |ln| errors."""
    ranked = sorted(errors)
    return {"median": statistics.median(ranked), "p90": ranked[min(len(ranked) - 1, math.ceil(0.9 * len(ranked)) - 1)],
            "worst": ranked[-1], "points": len(ranked)}


def derive(shapes: list[Shape], seconds: list[float]) -> dict[str, Any]:
    """One layout's fit: the coefficients fitted on every point, and their held-out error."""
    errors = held_out(shapes, seconds)
    return {"coefficients": fit(shapes, seconds), "held_out": summary(errors),
            "points": [{**asdict(sh), "seconds": s, "held_out_abs_ln": e}
                       for sh, s, e in zip(shapes, seconds, errors)]}


LAYER_TERMS = ("per_layer", "per_layer_token", "per_layer_token_seq")


MIN_LAYERS_FACTOR = -1.0  # a variant's factor on the layers' work is bounded here: at -1 the layers cost nothing


def variant_terms(coefficients: dict[str, float], shapes: list[Shape], seconds: list[float],
                  paired: list[float]) -> dict[str, Any]:
    """An option of a variant group measured at ``shapes`` (``seconds``), each step paired with the layout's own
    option measured just before it at the same shape (``paired``: the machine's drift between the two cancels):
    what it adds to the layout's coefficients (``coefficients``) of the layers' work (``deltas``, each of
    :data:`LAYER_TERMS`), fitted as two numbers: a factor on the layers' own work (``layers_factor``, of either
    sign, never below :data:`MIN_LAYERS_FACTOR`: on noisy steps whose layers are a small part of the layout's fit
    it came out at -1.3 once, under a loaded CI) and more work per token and key (``extra_per_layer_token_seq``,
    never below 0); least squares on the ratios to the pairs, each step's extra relative to the layout's fit of it;
    and each step predicted from its pair with the two numbers of the others (held out).

    A factor on the whole of a layer's work, because a variant changes all of it alike: a full recompute re-runs
    the forward, its module calls and collectives with its GEMMs (on this CPU with TP 2 it added 32 ms to a 79 ms
    two-layer step of 128 tokens and 36 ms at 512: mostly a fixed cost; taken as a cost per token, a 1024-token run
    came out 0.39 too slow), a dispatcher moves each token's copies faster or slower. More per token and key,
    because a recompute of core attention re-runs the part that grows with the sequence alone: on this CPU a
    selective recompute of it costs 1.2x the step at the plan's sequence and 2.3-2.9x at 4x it, far beyond the
    layers' factor measured at one sequence (which had predicted a 512-token run 43 % short); a variant is measured
    at sequences up to 4x the plan's (:func:`moe_hydra.job.calibrate.variant_shapes`) for it."""
    x = []  # each step's multipliers of the two numbers, relative to the layout's fit of it
    for sh in shapes:
        own, terms = predict(coefficients, sh)
        x.append((terms["layers"] / own, dict(zip(TERMS, sh.features()))["per_layer_token_seq"] / own))
    y = [s / p - 1 for s, p in zip(seconds, paired)]

    def solve(idx: list[int]) -> tuple[float, float]:
        # y = factor x_layers + key x_key: the normal equations, key >= 0 (else the factor alone), factor >= -1
        # (else -1 and the key refitted): a variant cannot make the layers' work negative
        aa, bb = sum(x[i][0] ** 2 for i in idx), sum(x[i][1] ** 2 for i in idx)
        ab = sum(x[i][0] * x[i][1] for i in idx)
        ay, by = sum(x[i][0] * y[i] for i in idx), sum(x[i][1] * y[i] for i in idx)
        det = aa * bb - ab * ab
        factor, key = ay / aa, 0.0
        if det > 1e-12 * aa * bb and (with_key := (by * aa - ay * ab) / det) >= 0:
            factor, key = (ay * bb - by * ab) / det, with_key
        if factor < MIN_LAYERS_FACTOR:
            factor = MIN_LAYERS_FACTOR
            key = max((by - factor * ab) / bb, 0.0) if bb > 0 else 0.0
        return factor, key

    every = list(range(len(shapes)))
    errors = []
    for i in every:
        factor, key = solve([j for j in every if j != i])
        errors.append(abs(math.log(max(paired[i] * (1 + factor * x[i][0] + key * x[i][1]), 1e-12) / seconds[i])))
    factor, key = solve(every)
    deltas = {name: factor * coefficients[name] for name in LAYER_TERMS}
    deltas["per_layer_token_seq"] += key
    return {"deltas": deltas, "layers_factor": factor, "extra_per_layer_token_seq": key,
            "held_out": summary(errors),
            "points": [{**asdict(sh), "seconds": s, "paired_seconds": b, "held_out_abs_ln": e}
                       for sh, s, b, e in zip(shapes, seconds, paired, errors)]}


def with_variants(coefficients: dict[str, float], variants: list[dict[str, Any]]) -> dict[str, float]:
    """A layout's coefficients with what its measured variants add (:func:`variant_terms`), each at least 0."""
    out = dict(coefficients)
    for v in variants:
        for name, delta in v["deltas"].items():
            out[name] = max(out[name] + delta, 0.0)
    return out


def shape_of(r: Any) -> Shape:
    """A resolved plan's step, in the form's terms: its most-loaded pipeline stage's decoder layers."""
    layers = max((len(x.layers) for x in r.split), default=0) if r.split else r.arch.num_layers // r.layout.pp
    return Shape(r.layout.pp, r.batch.micro_batches_per_step, layers, r.batch.micro_batch_size * r.batch.seq_length,
                 r.batch.seq_length)


def holds(r: Any) -> dict[str, Any]:
    """What a calibration measured on ``r`` holds for, whatever its layout: the model's widths, the processes, the
    implementation and the settings that change what a layer runs (:data:`SETTINGS_HELD`)."""
    cfg = r.cfg
    model = {k: v for k, v in asdict(cfg.model).items() if k not in MODEL_VARIED}
    return _plain({"model": model,
                   "processes": {"nodes": cfg.hardware.nodes, "devices_per_node": cfg.hardware.devices_per_node},
                   "implementation": {k: v for k, v in asdict(r.impl).items() if k != "source"},
                   **{name: asdict(getattr(cfg, name)) for name in SETTINGS_HELD}})


def layout_of(r: Any) -> dict[str, Any]:
    """A resolved plan's layout, as a calibration keys its fits."""
    return {k: getattr(r.layout, k) for k in LAYOUT_KEYS}


def describe_layout(lo: dict[str, Any]) -> str:
    """``TP2 CP1 EP1 ETP2 PP1 DP1 SP``: the sizes, VPP when set, SP when on."""
    return " ".join(k.upper() if isinstance(lo.get(k), bool) else f"{k.upper()}{lo[k]}"
                    for k in LAYOUT_KEYS if lo.get(k) not in (None, False))


def group_config(cfg: Any, group: str) -> dict[str, Any]:
    """A variant group's config node as a calibration records it: its values, the option's name left out (a
    config that sets the same values under another name runs the same)."""
    return {k: v for k, v in _plain(asdict(getattr(cfg, group))).items() if k != "name"}


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def estimate(step: dict[str, Any], r: Any) -> tuple[float, dict[str, float], dict[str, Any]] | list[str]:
    """A calibration's ``step`` at plan ``r``: (seconds, terms, what it used: the layout's fit, the variants'
    factors, the held-out error the interval takes), or where the calibration does not hold for ``r``.

    On more processes than were calibrated, a layout is predicted from a calibrated layout of the same model
    parallelism (TP, CP, EP, ETP, PP, VPP, SP) over fewer data-parallel ranks (:func:`scaled_from`): each rank's
    work is the same at the same micro-batches, and ``scaled_out`` in what it used says from which layout; what
    the larger data-parallel groups add (the gradients' reduction) is the caller's to add, from the measured
    collectives (:func:`moe_hydra.planning.step_time.data_parallel_growth`)."""
    calibrated, here = step.get("holds") or {}, holds(r)
    differ = differences({k: v for k, v in calibrated.items() if k != "processes"},
                         {k: v for k, v in here.items() if k != "processes"})
    layout, fitted_layouts = layout_of(r), step.get("layouts") or []
    scaled = None
    if calibrated.get("processes") == here["processes"]:
        fitted = next((x for x in fitted_layouts if x["layout"] == layout), None)
        if fitted is None:
            differ.append(f"layout {describe_layout(layout)} (calibrated: "
                          + ", ".join(describe_layout(x["layout"]) for x in fitted_layouts) + ")")
    else:
        fitted = scaled = scaled_from(fitted_layouts, layout)
        if fitted is None:
            world = _world(calibrated.get("processes") or {})
            differ.append(f"processes {_world(here['processes'])} (calibrated on {world}: a larger machine is "
                          "predicted from a calibrated layout of the same TP, CP, EP, ETP, PP over fewer "
                          "data-parallel ranks, and none of "
                          + ", ".join(describe_layout(x["layout"]) for x in fitted_layouts)
                          + f" is {describe_layout(layout)} with a smaller DP that divides its DP)")
    if differ:
        return differ
    shape = shape_of(r)
    used, worst_p90 = {"layout": describe_layout(layout), "held_out": fitted["held_out"]}, fitted["held_out"]["p90"]
    variants = []
    for group in VARIANT_GROUPS:
        mine, own = group_config(r.cfg, group), fitted["settings"][group]
        if mine == own["config"]:
            continue
        measured = [v for v in fitted.get("variants") or [] if v["group"] == group]
        variant = next((v for v in measured if v["config"] == mine), None)
        if variant is None:
            return [f"{group}={getattr(r.cfg, group).name} (measured on {describe_layout(layout)}: "
                    + ", ".join([own["option"], *(v["option"] for v in measured)]) + ")"]
        variants.append(variant)
        used[group] = {"option": variant["option"], "deltas": variant["deltas"], "held_out": variant["held_out"]}
        worst_p90 = max(worst_p90, variant["held_out"]["p90"])
    seconds, terms = predict(with_variants(fitted["coefficients"], variants), shape)
    rows = new_rows_term(step.get("expert_rows"), r, seconds)
    if rows is not None:
        seconds, terms["new_rows"], used["new_rows"] = seconds + rows["seconds"], rows["seconds"], rows
    if scaled is not None:
        used["scaled_out"] = {"from": describe_layout(scaled["layout"]), "dp": [scaled["layout"]["dp"], layout["dp"]],
                              "processes": [_world(calibrated["processes"]), _world(here["processes"])],
                              "nodes": [calibrated["processes"]["nodes"], here["processes"]["nodes"]]}
    return seconds, terms, {**used, "p90": worst_p90, "shape": asdict(shape)}


# ------------------------------------------------------------------ expert row counts a run meets for the first time

KERNELS_PER_ROW_COUNT = 6  # an expert's GEMMs at one row count: fc1 and fc2 forward, their input and weight gradients
NEGLIGIBLE = 0.005  # a term bounded below this share of the step (every row count new every step) is left at 0
SIMULATIONS = 4  # runs of :func:`new_row_counts`' simulation averaged, each with its own experts' centres
SIMULATED_DRAWS = 200_000  # at most this many rows drawn over the runs (at least one run), so a plan stays quick
RANKS_SIMULATED = 4  # the slowest of at most this many of a plan's ranks


def routing_spread(series: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How a router's rows per expert spread, from ``series`` of steps on one model on new batches (each
    ``{"tokens": tokens a step routed, "counts": [[rows of each (layer, expert)] a step, ...]}``): ``overdispersion``,
    an expert's step-to-step standard deviation over a binomial's (each token choosing it with probability rows /
    tokens), pooled over every (layer, expert) of every series; ``centers_cv``, how far the experts' own means
    spread about their mean (relative; what sampling adds to it taken out). None without a series of two steps."""
    used = [s for s in series if len(s["counts"]) >= 2 and s["tokens"]]
    excess = binomial = 0.0
    for s in used:
        for p in zip(*s["counts"]):
            q = min(statistics.fmean(p) / s["tokens"], 1.0)
            excess += statistics.variance(p)
            binomial += s["tokens"] * q * (1 - q)
    if not binomial:
        return None
    phi2, spread = excess / binomial, []
    for s in used:
        means = [statistics.fmean(p) for p in zip(*s["counts"])]
        grand = statistics.fmean(means)
        if grand > 0:
            q = grand / s["tokens"]
            sampling = phi2 * (1 - q) / (s["tokens"] * q * len(s["counts"]))  # a mean's relative variance
            spread.append(statistics.fmean((m / grand - 1) ** 2 for m in means) - sampling)
    return {"overdispersion": math.sqrt(phi2), "centers_cv": math.sqrt(max(statistics.fmean(spread), 0.0)),
            "series": len(used)}


@functools.lru_cache(maxsize=256)
def new_row_counts(pairs: int, rows: float, share: float, draws: int, window: tuple[int, int], ranks: int,
                   overdispersion: float, centers_cv: float, capacity: int | None, seed: int = 0) -> float:
    """Expected row counts a step of the window (``window``: first and last step, from 1) meets on the slowest of
    ``ranks`` processes that no kernel was made for, by simulation: each process holds ``pairs`` experts (MoE
    layers x local experts), each with its own centre (``rows`` x (1 + ``centers_cv`` z)), and routes ``draws``
    micro-batches a step, an expert's rows a normal draw about its centre with ``overdispersion`` x a binomial's
    standard deviation (``share``: the probability a token chooses it); a row count's kernels are kept in a cache
    of the ``capacity`` row counts used last (None: every one). Averaged over :data:`SIMULATIONS` runs, fewer
    where they would draw more than :data:`SIMULATED_DRAWS` rows. Deterministic (``seed``)."""
    rng, first, last = random.Random(seed), window[0], window[1]
    found = []
    for _ in range(max(1, min(SIMULATIONS, SIMULATED_DRAWS // max(last * draws * pairs * ranks, 1)))):
        slowest = [0] * (last - first + 1)
        for _rank in range(ranks):
            centres = [max(rows * (1 + centers_cv * rng.gauss(0.0, 1.0)), 1.0) for _ in range(pairs)]
            sd = [overdispersion * math.sqrt(c * (1 - share)) for c in centres]
            cache: OrderedDict[int, None] = OrderedDict()
            for step in range(1, last + 1):
                new = 0
                for _mb in range(draws):
                    for c, d in zip(centres, sd):
                        m = max(round(rng.gauss(c, d)), 1)
                        if m in cache:
                            cache.move_to_end(m)
                            continue
                        new += 1
                        cache[m] = None
                        if capacity is not None and len(cache) > capacity:
                            cache.popitem(last=False)
                if step >= first:
                    slowest[step - first] = max(slowest[step - first], new)
        found.append(statistics.fmean(slowest))
    return statistics.fmean(found)


def new_rows_term(rows: dict[str, Any] | None, r: Any, seconds: float) -> dict[str, Any] | None:
    """What a step of plan ``r`` spends on expert row counts it meets for the first time (``seconds``: the step
    without it), from a calibration's ``expert_rows`` (:func:`moe_hydra.job.calibrate.expert_rows`): the cost of one
    row count's kernels, measured at the plan's expert width, times :func:`new_row_counts` in the run's window
    (``Resolved.window``: the declared one, or auto's first) on the slowest of its ranks (up to
    :data:`RANKS_SIMULATED`), each holding its most loaded
    stage's MoE layers x its local experts, each expert's rows a micro-batch its share of the tokens of its EP x ETP
    group (a rank's: the micro-batch over TP with sequence parallelism, over CP). None for a dense model or a
    calibration without the measurement; 0 when even every row count new every step would stay under
    :data:`NEGLIGIBLE` of the step (a GPU's GEMMs: nothing made per shape)."""
    a, lo, b = r.arch, r.layout, r.batch
    if not rows or not a.experts or not rows.get("cost_s") or not rows.get("routing") or not r.split:
        return None
    costs = rows["cost_s"]
    cost = max(costs.get(str(lo.etp), statistics.median(costs.values())), 0.0)
    pairs = max((x.mask & a.moe_mask).bit_count() for x in r.split) * (a.experts // lo.ep)
    draws = b.micro_batches_per_step
    out = {"cost_per_row_count_s": cost, "seconds": 0.0}
    if cost * pairs * draws < NEGLIGIBLE * seconds:
        return {**out, "new_per_step": None, "why_zero": f"under {NEGLIGIBLE:.1%} of the step with every row count new"}
    tokens = b.micro_batch_size * b.seq_length / ((lo.tp if lo.sp else 1) * lo.cp)  # a rank's, a micro-batch
    share = a.topk / a.experts
    routing, capacity = rows["routing"], rows.get("cache_row_counts")
    new = new_row_counts(pairs, tokens * lo.ep * lo.etp * share, share, draws, r.window,
                         min(lo.world_size, RANKS_SIMULATED), round(routing["overdispersion"], 3),
                         round(routing["centers_cv"], 3), capacity)
    return {**out, "seconds": cost * new, "new_per_step": new, "experts_per_rank": pairs,
            "window": list(r.window)}


def scaled_from(fitted: list[dict[str, Any]], layout: dict[str, Any]) -> dict[str, Any] | None:
    """The calibrated layout a larger machine's ``layout`` is predicted from: the same sizes but DP, its DP a
    divisor of ``layout``'s and smaller (the largest such: the least extrapolated); None when none is."""
    same = [x for x in fitted if {k: v for k, v in x["layout"].items() if k != "dp"}
            == {k: v for k, v in layout.items() if k != "dp"}
            and x["layout"]["dp"] < layout["dp"] and layout["dp"] % x["layout"]["dp"] == 0]
    return max(same, key=lambda x: x["layout"]["dp"], default=None)


def _world(processes: dict[str, Any]) -> int:
    return int(processes.get("nodes") or 1) * int(processes.get("devices_per_node") or 1)


def differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested dicts (``a``: the calibration's)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in dict.fromkeys([*a, *b]) for d in differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [f"{prefix.rstrip('.')} ({a!r} calibrated, {b!r} here)"]


def carried(seconds: float, calibrated: dict[str, Any] | None, found: dict[str, Any] | None) -> dict[str, Any] | None:
    """A prediction ``seconds`` carried from the machine as its calibration found it to the machine as a run found
    it: times the ratio of the two readings of the machine's reference (``moe_hydra.job.calibrate.Reference``: the
    run's ``found``, the calibration's ``calibrated``; each a ``Reference.summary``). None when either has no reading
    or the two read different references (then they do not compare)."""
    if not calibrated or not found or calibrated.get("definition") != found.get("definition"):
        return None
    ratio = found["index_s"] / calibrated["index_s"]
    return {"seconds": seconds * ratio, "ratio": ratio, "of": "the plan's step_time.seconds x this run's reference "
            "index_s / its calibration's (the same fixed work read on the machine as each found it)"}


def other_device(machine: dict[str, Any], hardware: Any) -> str | None:
    """How the calibrated machine's device kind differs from the plan's hardware (None: the same kind): a CPU for a
    CPU preset; for a GPU preset, a GPU whose name holds the preset's (``H200`` of "H200 SXM 141GB" in
    "NVIDIA H200")."""
    calibrated = machine.get("device_type")
    if hardware.arch == "cpu":
        return None if calibrated == "cpu" else f"a {machine.get('device')} (hardware={hardware.name} is a CPU)"
    kind = str(hardware.device).split()[0].lower()
    if calibrated != "cuda" or kind not in str(machine.get("device", "")).lower():
        return f"{machine.get('device')} (hardware={hardware.name} is {hardware.device})"
    return None


def other_versions(cal: dict[str, Any], path: str) -> list[str]:
    """A note for each software version the calibration was measured with that differs from this install's (torch,
    megatron-core): the calibration is used, its kernels may have changed since."""
    from moe_hydra.core.versions import installed_mcore_version, installed_version

    machine, notes = cal.get("machine") or {}, []
    for name, here in (("torch", installed_version("torch")), ("megatron_core", installed_mcore_version())):
        there = machine.get(name)
        if there and here and there.split("+")[0] != here.split("+")[0]:
            notes.append(f"hardware.calibration {path} was measured with {name} {there}, this install has {here}: "
                         "its step times may have moved since (calibrate again: stage=calibrate)")
    return notes


def named(cfg: Any) -> str | None:
    """The calibration a plan of ``cfg`` reads: ``hardware.calibration``, but none while ``stage=calibrate`` makes
    one (a site file may name the file that calibration is about to write)."""
    return None if cfg.stage == "calibrate" else cfg.hardware.calibration


def resolve_path(path: str | Path) -> Path:
    """``hardware.calibration`` as a path: absolute as it is; relative to ``$MOE_HYDRA_SITE`` when set (a site
    file names its cluster's calibration), else to the current directory."""
    from moe_hydra.core.schema import site_dir

    p = Path(path).expanduser()
    site = site_dir()
    return p if p.is_absolute() or site is None else site / p


def load(path: str | Path) -> tuple[dict[str, Any], str]:
    """A calibration.json and its sha256, read once per version of the file (the rules and the plan read it, the
    layout search for every candidate). Do not change what it returns.

    Raises:
        ValueError: not readable, or not a calibration with a fitted step (the message says which).
    """
    p = resolve_path(path)
    try:
        stat = p.stat()
    except OSError as e:
        raise ValueError(f"{p}: not readable ({e.strerror or type(e).__name__})") from None
    return _load(str(p.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], str]:
    p = Path(path)
    try:
        raw = p.read_bytes()
        cal = json.loads(raw)
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not readable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(cal, dict) or "calibration_version" not in cal:
        raise ValueError(f"{p}: not a calibration.json (no calibration_version): make one with stage=calibrate")
    version, fitted = cal["calibration_version"], (cal.get("step") or {}).get("layouts")
    if not isinstance(fitted, list) or not isinstance(version, int) or version < VERSION:
        raise ValueError(f"{p}: calibration_version {version!r} holds no step fitted as this "
                         f"version fits it ({VERSION}): calibrate again with this version (stage=calibrate)")
    return cal, hashlib.sha256(raw).hexdigest()
