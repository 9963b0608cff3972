"""The machine's own rates, measured where the job runs: the parts ``stage=calibrate`` is built from (issue 36).

Each measurement times one operation with real torch on the job's device and process group, the warm-up calls
discarded, and keeps every sample: :class:`Measurement` holds them with their median, min and max and the rate the
step model reads (the median's). What is measured, and how a rate is defined:

- :func:`gemm`: ``A (m x k) @ B (k x n)`` in the given dtype; 2 m n k FLOPs a call (the FLOPs Megatron-Core's
  counter gives a GEMM); TFLOP/s.
- :func:`memory_bandwidth`: ``y.copy_(x)``, which reads and writes every byte once: 2 x the tensor's bytes a call;
  GB/s (what the kernels between the GEMMs move runs at this).
- :func:`collective`: one collective over a process group, ``nbytes`` the size of each rank's buffer — the input of
  all_reduce, reduce-scatter and all_to_all_single, the output of all-gather, the message of a
  send/receive ring — as nccl-tests sizes them; its algorithm bandwidth (bytes / time) and its bus bandwidth, which
  is the algorithm bandwidth times :func:`bus_factor` (nccl-tests' ``doc/PERFORMANCE.md``: 2 (n-1)/n for an
  all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/receive), so that it compares with
  the link's bandwidth whatever the group's size. Every rank times the same calls, after a barrier; a call's time
  is the slowest rank's (what the step waits for), gathered to every rank.

Times are wall clock (``time.perf_counter``) around the call, after ``torch.cuda.synchronize`` on a GPU (so the
kernel's time is in it); a step's also on a GPU apart: the host's time to enqueue it and the device's (CUDA events
around it, as the job times a step). Imports
torch inside the functions, as the rest of the job.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moe_hydra.core import calibrated_step as cs

WARMUP = 2  # calls discarded before timing: allocator, kernel selection, first-touch pages
REPEATS = 7  # timed calls
NEW_ROW_COUNTS = 24  # expert row counts :func:`new_row_cost` times, each new and then again
NEW_ROW_STRIDE = 13  # rows between two of them
ONEDNN_CACHE = 1024  # oneDNN's primitive cache, kernels, when ONEDNN_PRIMITIVE_CACHE_CAPACITY is not set

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


@dataclass
class Measurement:
    """One operation timed ``len(seconds)`` times: ``work`` is what a call does in ``unit`` (FLOPs, bytes), so the rate
    is ``work / median``; ``params`` says which operation (shape, dtype, group size, ...)."""

    kind: str
    params: dict[str, Any]
    seconds: list[float]
    work: float
    unit: str
    warmup: int = WARMUP  # calls discarded before timing

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def rate(self, scale: float = 1.0) -> float:
        """``work`` per second at the median time, over ``scale`` (1e12: TFLOP/s, 1e9: GB/s)."""
        return self.work / self.median_s / scale

    def rates(self) -> dict[str, float]:
        """The rates its kind is read by: a GEMM's TFLOP/s, a copy's GB/s, a collective's algorithm and bus
        bandwidth (GB/s)."""
        if self.kind == "gemm":
            return {"tflops": self.rate(1e12)}
        if self.kind == "step":
            return {"tokens_per_s": self.rate()}
        if self.kind == "new_rows":
            return {}
        if self.kind == "collective":
            algbw = self.rate(1e9)
            return {"algbw_gb_per_s": algbw,
                    "busbw_gb_per_s": algbw * bus_factor(self.params["op"], self.params["group_size"])}
        return {"gb_per_s": self.rate(1e9)}

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.params, "median_s": self.median_s, "min_s": min(self.seconds),
                "max_s": max(self.seconds), "samples": len(self.seconds), "warmup_discarded": self.warmup,
                "work": self.work, "unit": self.unit, **self.rates()}


def timed(call: Callable[[], Any], sync: Callable[[], None] = lambda: None, warmup: int = WARMUP,
          repeats: int = REPEATS) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``call`` after ``warmup`` untimed ones; ``sync`` waits for the device
    before and after each (a no-op on the CPU)."""
    for _ in range(warmup):
        call()
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _sync(device: Any) -> Callable[[], None]:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def gemm(m: int, n: int, k: int, dtype: Any, device: Any, repeats: int = REPEATS) -> Measurement:
    """``(m x k) @ (k x n)``: 2 m n k FLOPs a call."""
    import torch

    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    seconds = timed(lambda: torch.matmul(a, b), _sync(device), repeats=repeats)
    return Measurement("gemm", {"m": m, "n": n, "k": k, "dtype": str(dtype).replace("torch.", "")}, seconds,
                       2.0 * m * n * k, "FLOP")


def new_row_cost(h: int, ffn: int, glu: bool, dtype: Any, device: Any, first_rows: int,
                 count: int = NEW_ROW_COUNTS) -> Measurement:
    """An expert's GEMMs (``h`` -> ``ffn`` -> ``h``; with ``glu`` fc1 twice as wide and SwiGLU between, else GeLU)
    forward and backward at a row count the process has not run, ``count`` of them from ``first_rows`` up (beyond
    every count its steps routed; after :data:`WARMUP` calls at one count below them, discarded), each less the
    same call again (the median of two): what a step pays for each expert row count it meets for the first time.
    On a CPU a bf16 GEMM is oneDNN's, its kernel made for each shape and kept in a cache of recent ones; on a GPU,
    or in fp32 on a CPU (MKL), nothing is made per shape and this comes out near 0. ``seconds``: each row count's
    extra."""
    import torch
    import torch.nn.functional as F

    sync = _sync(device)
    w1 = torch.randn(ffn * (2 if glu else 1), h, dtype=dtype, device=device).mul_(0.02).requires_grad_()
    w2 = torch.randn(h, ffn, dtype=dtype, device=device).mul_(0.02).requires_grad_()

    def act(y: Any) -> Any:
        if glu:
            gate, up = y.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(y)

    def call(m: int) -> float:
        x = torch.randn(m, h, dtype=dtype, device=device, requires_grad=True)
        g = torch.ones(m, h, dtype=dtype, device=device)
        sync()
        t0 = time.perf_counter()
        F.linear(act(F.linear(x, w1)), w2).backward(g)
        sync()
        return time.perf_counter() - t0

    for _ in range(WARMUP):  # the process's first such call pays for more than its shape (up to 0.3 s here)
        call(first_rows - 1)
    extra = []
    for i in range(count):
        m = first_rows + NEW_ROW_STRIDE * i
        new = call(m)
        extra.append(new - statistics.median(call(m) for _ in range(2)))
    return Measurement("new_rows", {"hidden": h, "ffn": ffn, "glu": glu, "dtype": str(dtype).replace("torch.", ""),
                                    "rows": [first_rows, first_rows + NEW_ROW_STRIDE * (count - 1)]}, extra, 1.0,
                       "row count")


def memory_bandwidth(numel: int, dtype: Any, device: Any, repeats: int = REPEATS) -> Measurement:
    """``y.copy_(x)``: reads and writes the tensor's bytes once each."""
    import torch

    x = torch.randn(numel, device=device).to(dtype)
    y = torch.empty_like(x)
    seconds = timed(lambda: y.copy_(x), _sync(device), repeats=repeats)
    return Measurement("memory_bandwidth", {"numel": numel, "dtype": str(dtype).replace("torch.", "")}, seconds,
                       2.0 * x.numel() * x.element_size(), "byte")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth for ``op`` over ``n`` ranks."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(COLLECTIVES)}")
    if op == "send_recv":
        return 1.0
    if n <= 1:
        return 0.0
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


def collective(op: str, nbytes: int, group: Any = None, dtype: Any = None, device: Any = None,
               repeats: int = REPEATS) -> Measurement:
    """``op`` over ``group`` (None: the default group) with ``nbytes`` a rank (rounded down to whole elements, a
    multiple of the group's size); every rank must call it with the same arguments. Send/receive: each rank sends
    to the next in a ring and receives from the one before (a pipeline's boundary, both directions at once)."""
    import torch
    import torch.distributed as dist

    dtype = dtype or torch.float32
    device = device or torch.device("cpu")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    size = torch.tensor([], dtype=dtype).element_size()
    numel = max(nbytes // size // n, 1) * n
    x = torch.ones(numel, dtype=dtype, device=device)
    if op == "all_reduce":
        def call():
            dist.all_reduce(x, group=group)
    elif op == "all_gather":  # nbytes is the gathered output: each rank contributes 1/n of it
        part, out = x[: numel // n].clone(), torch.empty_like(x)

        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13's name

        def call():
            gather(out, part, group=group)
    elif op == "reduce_scatter":
        out = torch.empty(numel // n, dtype=dtype, device=device)

        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def call():
            scatter(out, x, group=group)
    elif op == "all_to_all":
        out = torch.empty_like(x)

        def call():
            dist.all_to_all_single(out, x, group=group)
    elif op == "send_recv":
        out = torch.empty_like(x)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
        to, frm = ranks[(rank + 1) % n], ranks[(rank - 1) % n]

        def call():
            if n > 1:
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, to, group),
                                               dist.P2POp(dist.irecv, out, frm, group)])
                for r in reqs:
                    r.wait()
    else:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(COLLECTIVES)}")
    sync = _sync(device)
    dist.barrier(group=group)
    seconds = torch.tensor(timed(call, sync, repeats=repeats), dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)  # a call takes as long as its slowest rank
    nbytes_used = numel * size
    return Measurement("collective", {"op": op, "bytes": nbytes_used, "group_size": n,
                                      "dtype": str(dtype).replace("torch.", "")}, seconds.tolist(), float(nbytes_used),
                       "byte")


# ------------------------------------------------------------------------------------------------ the stage's job

CALIBRATION_VERSION = cs.VERSION
CALIBRATION_FILE = "calibration.json"
MICRO_BATCHES = (1, 2, 4)  # micro-batch sizes whose tokens the steps and GEMMs are measured at (>= 3 shapes)
DEPTHS = (1, 3)  # decoder layers on each pipeline stage of the shrunken models whose steps are measured
ROUNDS = 2  # passes over the layouts, each a round of every layout's steps (:func:`steps`)
STEP_WARMUP = 3  # steps discarded on a new model: its first allocate its buffers and the optimizer's states
CPU_COLLECTIVE_BYTES = tuple(1 << p for p in range(12, 23, 2))  # 4 KiB .. 4 MiB a rank
GPU_COLLECTIVE_BYTES = tuple(1 << p for p in range(16, 31, 2))  # 64 KiB .. 1 GiB a rank


def gemm_shapes(a: Any, seq_length: int, micro_batches: tuple[int, ...] = MICRO_BATCHES
                ) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of the model's GEMMs (one rank, no model parallelism) at each micro-batch's tokens: the
    attention projections, the dense MLP, a routed expert at its rows (tokens x top-k / experts) and the logits
    (over the padded vocabulary, as Megatron-Core's output layer)."""
    glu = 2 if a.glu else 1
    q = a.heads * a.head_dim
    out = []
    for b in micro_batches:
        rows = b * seq_length
        out += [("qkv", rows, q + 2 * a.groups * a.head_dim, a.h), ("proj", rows, a.h, q),
                ("fc1", rows, glu * a.ffn, a.h), ("fc2", rows, a.h, a.ffn),
                ("logits", rows, a.padded_vocab(), a.h)]
        if a.experts:
            expert_rows = max(rows * a.topk // a.experts, 1)
            out += [("expert_fc1", expert_rows, glu * a.moe_ffn, a.h), ("expert_fc2", expert_rows, a.h, a.moe_ffn)]
    return out


def machine(device: Any, world: int) -> dict[str, Any]:
    """What the measurements hold for: the device kind and count, the host, the software."""
    import platform

    import torch

    from moe_hydra.core import versions

    gpu = getattr(device, "type", "cpu") == "cuda"
    return {"device": torch.cuda.get_device_name(device) if gpu else platform.processor() or platform.machine(),
            "device_type": "cuda" if gpu else "cpu", "processes": world, "host": platform.node(),
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "megatron_core": versions.installed_mcore_version(),
            "cuda": torch.version.cuda if gpu else None,
            # the kernels oneDNN keeps made (a CPU's bf16 GEMMs: one a shape), its default unless set
            "onednn_primitive_cache_capacity": None if gpu else int(
                os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY") or os.environ.get("DNNL_PRIMITIVE_CACHE_CAPACITY")
                or ONEDNN_CACHE)}


def shrunk(r: Any, layers: int, micro_batch_size: int, seq_length: int, microbatches: int,
           parallel: dict[str, Any] | None = None, settings: dict[str, dict[str, Any]] | None = None) -> Any:
    """The plan ``r`` with ``layers`` decoder layers on each pipeline stage (the model's layer kinds in their order,
    repeated when the model has fewer), micro-batches of ``micro_batch_size`` sequences of ``seq_length`` tokens and
    ``microbatches`` of them a step: one of the steps :func:`steps` measures. ``parallel``: other ``parallel``
    fields (another layout); ``settings``: other values of config groups (``{"recompute": {...}}``). Its widths and
    the rest of its settings are ``r``'s; its pipeline split even (no custom first or last stage)."""
    from moe_hydra.core.arch import parse_moe_layer_freq
    from moe_hydra.core.resolved import resolve

    cfg = r.cfg
    par = replace(cfg.parallel, **{"pipeline_model_parallel_layout": None, "num_layers_in_first_pipeline_stage": None,
                                   "num_layers_in_last_pipeline_stage": None, **(parallel or {})})
    m, total = cfg.model, layers * par.pipeline_model_parallel_size * (par.virtual_pipeline_model_parallel_size or 1)
    freq = m.moe_layer_freq
    if not isinstance(freq, int):
        kinds = parse_moe_layer_freq(freq, m.num_layers)
        freq = [int(kinds[i % len(kinds)]) for i in range(total)]
    model = replace(m, num_layers=total, moe_layer_freq=freq, seq_length=seq_length,
                    max_position_embeddings=max(m.max_position_embeddings or 0, seq_length))
    dp = cfg.hardware.nodes * cfg.hardware.devices_per_node // (
        par.tensor_model_parallel_size * par.context_parallel_size * par.pipeline_model_parallel_size)
    train = replace(cfg.train, micro_batch_size=micro_batch_size, seq_length=seq_length,
                    global_batch_size=micro_batch_size * dp * microbatches)
    groups = {g: replace(getattr(cfg, g), **values) for g, values in (settings or {}).items()}
    return resolve(replace(cfg, model=model, train=train, parallel=par, **groups), impl=r.impl)


def step_shapes(seq_length: int) -> list[tuple[int, int, int, int]]:
    """(layers a stage, micro-batch size, sequence length, micro-batches a step) of the steps :func:`steps`
    measures on each layout: each depth of :data:`DEPTHS` at micro-batches of 1, 2 and 4 sequences and at one
    sequence two and four times as long, one micro-batch a step; at micro-batches of 1 and 2 sequences, two a step;
    and at one sequence, eight a step. Three sequence lengths, because core attention grows with the tokens times the
    keys: at two the term hides in the noise (fitted at 0 on tiny_moe, a 512-token run then came out 3x slower than
    predicted). What is once a step is told apart from what is once a micro-batch by the steps of two and eight, at
    both depths (with two at most, a PP2 run of four a step came out 12 % short on tiny_moe). Depths 1 and 3, and
    eight a step, so that a run is predicted within the measured range or near it: an error in the difference of
    two measured depths (or micro-batch counts) grows with the distance the prediction reaches beyond them (from
    depths 1 and 2 a 4-layer run reads 3x the difference, from 1 and 3 1.5x; from up to 4 micro-batches, 5 of a PP2
    schedule's slots, a run of 8 reads 9). Each term stays measured by at least two steps, so that every step can
    be predicted by the others (the held-out check)."""
    out = [(d, b, seq_length, 1) for d in DEPTHS for b in MICRO_BATCHES]
    out += [(d, 1, k * seq_length, 1) for d in DEPTHS for k in (2, 4)]
    return out + [(d, b, seq_length, m) for d in DEPTHS for b, m in ((1, 2), (2, 2), (1, 8))]


def variant_shapes(seq_length: int) -> list[tuple[int, int, int, int]]:
    """The steps a variant (another recompute level, another dispatcher) is measured at on each layout, at the deeper
    depth: micro-batches of 1 and 2 sequences, and one sequence two and four times as long. Four, at three sequence
    lengths: what a variant adds per token is told from what it adds per token and key (core attention's work,
    which grows with the sequence; :func:`moe_hydra.core.calibrated_step.variant_terms`), also with one step held
    out."""
    d = DEPTHS[-1]
    return [(d, 1, seq_length, 1), (d, 2, seq_length, 1), (d, 1, 2 * seq_length, 1), (d, 1, 4 * seq_length, 1)]


def layouts(r: Any) -> list[dict[str, Any]]:
    """The ``parallel`` fields of each layout :func:`steps` measures (``calibrate.layouts``): the plan's first; with
    ``all``, then every TP, PP, EP and ETP of the job's processes (CP 1, no VPP, an even split) the rules let the job
    run on the shrunken model."""
    from moe_hydra.core.versions import mcore_facts
    from moe_hydra.planning import rules
    from moe_hydra.planning.search import Candidate

    lo, mbs = r.layout, r.batch.micro_batch_size
    own = {**Candidate(lo.tp, lo.cp, lo.pp, lo.vpp, lo.ep, lo.etp, mbs, "even").fields(),
           "sequence_parallel": lo.sp}  # the plan's, as it is set
    if r.cfg.calibrate.layouts.value == "plan":
        return [own]
    world, experts = lo.world_size, r.arch.experts or 1
    divs = [d for d in range(1, world + 1) if world % d == 0]
    out, mcore = [own], mcore_facts()
    for tp in divs:
        for pp in divs:
            for ep in (d for d in divs if experts % d == 0):
                for etp in divs:
                    if world % (tp * pp) or world % (etp * ep * pp):
                        continue
                    fields = Candidate(tp, 1, pp, None, ep, etp, mbs, "even").fields()
                    if fields not in out and not rules.check(shrunk(r, DEPTHS[0], mbs, r.batch.seq_length, 1,
                                                                    fields), mcore):
                        out.append(fields)
    return out


def variants(r: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(group, option, its values) of each variant :func:`steps` measures on every layout (``calibrate.variants``):
    the options of each group other than the plan's own; the dispatcher only for a MoE model. A selective recompute
    keeps the most of its preset's modules the rules allow here (``moe_act`` needs grouped-GEMM experts, which a CPU
    has not: ``[core_attn, layernorm]`` there)."""
    from itertools import combinations

    from moe_hydra.core import presets
    from moe_hydra.core.versions import mcore_facts
    from moe_hydra.planning import rules

    out, seq = [], r.batch.seq_length
    for group in r.cfg.calibrate.variants:
        if group == "dispatcher" and not r.arch.experts:
            continue
        for option in cs.VARIANT_GROUPS[group]:
            values = {k.split(".", 1)[1]: v for k, v in presets.preset(group, option).items()}
            modules = values.get("recompute_modules") or []
            for keep in range(len(modules), 0, -1):
                legal = next((list(c) for c in combinations(modules, keep) if not rules.check(
                    shrunk(r, DEPTHS[0], 1, seq, 1, None, {group: {**values, "recompute_modules": list(c)}}),
                    mcore_facts())), None)
                if legal is not None:
                    values["recompute_modules"] = legal
                    break
            other = replace(r.cfg, **{group: replace(getattr(r.cfg, group), **values)})
            if cs.group_config(other, group) != cs.group_config(r.cfg, group):
                out.append((group, option, values))
    return out


def steps(job: Any, say: Callable[[str], None], reference: Any = None, which: list[int] | None = None
          ) -> list[dict[str, Any]]:
    """The model's training step, as the job times it (Megatron-Core's blocks, forward and backward through its
    schedule, the optimizer step; the slowest rank's time), on shrunken models: on each layout of :func:`layouts`, at
    every shape of :func:`step_shapes` with the plan's settings, and at :func:`variant_shapes` (some of them) with each
    variant of :func:`variants`, its model stepped right after the layout's own in each round, its pair (one the rules
    refuse on a layout is left out there, and said). :data:`ROUNDS` passes over the layouts, every other one in the
    opposite order, each a round of every layout's steps (:class:`LayoutSteps`): this CPU's speed drifts by tens of
    percent over minutes, and measured once in sequence the layouts in the middle of a calibration came out 15-20 %
    slower than an hour earlier (tiny_moe: EP 2 and PP 2, measured third and fourth of six; the first 5 % faster), so
    that runs on them were predicted up to 0.30 too slow; in passes there and back every layout's steps straddle the
    calibration, and ``between_rounds`` says how far its rounds differ. ``which``: the indices of the layouts to
    measure (:func:`parts`), None every one. Before the first round, a pass over the first layout's first model,
    untimed: the first model a process steps ran its shapes 1.3-4x slower than in the second round, for all of its
    blocks (tiny_moe, DP2, four calibrations: one 128-token sequence 76 ms then 29, a fresh run 34), the models after
    it as in their second round (the pass over every model of the layout took 7-10 s a launch, over the first 1.5 s,
    and the others' first rounds still came out as their second: a mean ln(round 1 / round 2) of -0.002 on tiny_moe's
    DP2). ``reference`` (:class:`Reference`) is read after each model's blocks in a round: the machine's speed while
    they were measured, which a run's reading is compared with. Returns, per layout:
    its ``parallel`` fields, the resolved plan of its first step, and its measurements (a variant's with its ``group``,
    ``option`` and ``config``)."""
    lays = [LayoutSteps(job, fields, say, reference) for i, fields in enumerate(layouts(job.r))
            if which is None or i in which]
    lays[0].round(0, warm=True)
    per_round = -(-job.r.cfg.calibrate.step_repeats // ROUNDS)
    for n in range(ROUNDS):
        for lay in lays if n % 2 == 0 else reversed(lays):
            lay.round(per_round)
    return [lay.result(say) for lay in lays]


class LayoutSteps:
    """One layout's steps: the models it builds (a depth of :data:`DEPTHS`, or a variant's at its depth), the
    timers stepped on them in order, and what each measured so far. :meth:`round` makes the layout's process groups,
    builds each model in turn, steps its timers once more and lets it go: a round of :func:`steps`."""

    def __init__(self, job: Any, fields: dict[str, Any], say: Callable[[str], None], reference: Any = None):
        from moe_hydra.core.versions import mcore_facts
        from moe_hydra.planning import rules

        r = job.r
        seq = r.batch.seq_length
        longest = max(s for _, _, s, _ in step_shapes(seq))
        self.job, self.fields, self.say, self.reference = job, fields, say, reference
        self.routing: list[dict[str, Any]] = []  # the warm-up steps' rows per expert (:meth:`StepTimer.routed`)
        self.first = shrunk(r, DEPTHS[0], 1, seq, 1, fields)
        self.models = {("", "", d): shrunk(r, d, 1, longest, 1, fields) for d in DEPTHS}  # built from these plans
        at_variants, others = variant_shapes(seq), []
        for group, option, values in variants(r):
            refused = rules.check(shrunk(r, DEPTHS[0], 1, seq, 1, fields, {group: values}), mcore_facts())
            if refused:
                say(f"{group}={option} on {self.first.layout.describe()}: left out ({refused[0].message})")
                continue
            others.append((group, option, values))
            for d in dict.fromkeys(shape[0] for shape in at_variants):
                self.models[(group, option, d)] = shrunk(r, d, 1, longest, 1, fields, {group: values})
        self.timers = []
        for shape in step_shapes(seq):  # the layout's own; at a variant shape, each variant's too
            self.timers.append(StepTimer(("", "", shape[0]), shrunk(r, *shape, fields), {}))
            for group, option, values in others if shape in at_variants else ():
                v = shrunk(r, *shape, fields, {group: values})
                self.timers.append(StepTimer((group, option, shape[0]), v, {"group": group, "option": option,
                                                                     "config": cs.group_config(v.cfg, group)}))

    def round(self, timed: int, warm: bool = False) -> None:
        """The layout's process groups made; then one model at a time (its depth's, or a variant's), built, first
        stepped :data:`STEP_WARMUP` times at its largest shape (its buffers and the optimizer's states allocated:
        :func:`warmup_timers`) on new batches, discarded but for their rows per expert (:meth:`StepTimer.routed`), then
        a block per timer of it in their order: one untimed step at its shape, then ``timed`` timed ones; the model let
        go before the next is built. Blocks, because a step right after another shape's (other activation sizes) runs
        slower than the same step repeated, as a run repeats it: measured one step a round, every shape came out 10-35 %
        slower than the real runs it predicts (tiny_moe, 2 processes). One model at a time, because with a layout's five
        built at once (two depths, three variants) its steps came out 1.16-1.52x slower than fresh runs of the same
        shapes, its first round too, while a calibration of two models stepped them within 0.94-1.10x. After the first
        model's warm-up, one untimed step at each of its shapes: the first blocks after a layout's groups were made came
        out slow where the layout was measured among others (PP2 in the middle of four calibrations of every layout, its
        first block 0.44-0.69 (ln, each block over the machine's reference) above calibrations of PP2 alone, its later
        ones nearer; measured first, 0.07; with the step, in the middle, 0.29). After each model's blocks, the
        machine's reference, once for them all (read after each block it took 1.3 s of a 17 s round). The groups let
        go after. ``warm``: the first model alone, its warm-up and one untimed step a timer of it, nothing recorded
        (:func:`steps`' pass before its rounds)."""
        t0 = time.perf_counter()
        release_model_parallel()
        self.job.for_plan(self.first).init_model_parallel()
        models = list(self.models.items())[:1] if warm else list(self.models.items())
        for i, (key, plan) in enumerate(models):
            timers = [t for t in self.timers if t.model == key]
            built = Built(self.job, plan)
            for t in timers:
                t.on(built)
            for t in warmup_timers(timers):
                series = t.routed(STEP_WARMUP)
                if series and series["counts"] and not warm:
                    self.routing.append(series)
            if i == 0 and not warm:  # the layout's process groups just made: a pass over its first model's shapes
                for t in timers:
                    t.step()
            for t in timers:
                t.step()  # the first after a switch
                if warm:
                    continue
                for _ in range(timed):
                    t.record()
                t.rounds += 1
            if self.reference is not None and not warm:
                index = index_of(self.reference.read())
                for t in timers:
                    t.references.append(index)
            built.free()
            for t in timers:
                t.off()
        which = "warm-up pass (untimed)" if warm else f"round {self.timers[0].rounds} of {ROUNDS}"
        shapes = sum(1 for t in self.timers if t.model in dict(models))
        self.say(f"{which} on {self.first.layout.describe()}: {shapes} shapes on {len(models)} models, "
                 f"one at a time, {shapes * timed} timed steps in {time.perf_counter() - t0:.1f} s")

    def result(self, say: Callable[[str], None]) -> dict[str, Any]:
        """The layout's ``parallel`` fields, the resolved plan of its first step and a measurement row per timer."""
        rows = [t.row(say) for t in self.timers]
        apart = [x["between_rounds"] for x in rows]
        say(f"{self.first.layout.describe()}: its rounds' medians differ by a median |ln| of "
            f"{statistics.median(apart):.3f} (worst {max(apart):.3f}) over {len(rows)} steps")
        return {"parallel": self.fields, "resolved": self.first, "measurements": rows, "routing": self.routing}


def warmup_timers(timers: list[StepTimer]) -> list[StepTimer]:
    """The timer each model is first stepped on, in the models' order: its shape of the most tokens a micro-batch
    (the largest activations: the process's heap grows to what the timed steps need), of those the fewest
    micro-batches a step (the cheapest)."""
    def largest(t: StepTimer) -> tuple[int, int]:
        b = t.r.batch
        return b.micro_batch_size * b.seq_length, -b.micro_batches_per_step

    return [max((t for t in timers if t.model == model), key=largest)
            for model in dict.fromkeys(t.model for t in timers)]


def release_model_parallel() -> None:
    """Every process group Megatron-Core made destroyed, and its state reset: what the next layout starts from.
    ``destroy_model_parallel`` forgets the groups but destroys only its ``*_GLOO`` ones, and a gloo group keeps its
    connections and three threads a rank until it is destroyed (on a CPU every group is one): a calibration of six
    layouts left some 300 threads a rank, and each layout's steps ran slower than the last's (tiny_moe, the same PP2
    layout measured four times in one process: 170, 177, 188, 188 ms a step; its groups destroyed, 178, 176, 176,
    174). ``parallel_state._global_process_group_list`` lists each group ``create_group`` made this rank a member
    of (``None`` stands for the default group, which stays); ``destroy_model_parallel`` skips those already gone.
    A destroyed group's threads end only with its last reference, and two of Megatron-Core's caches outlive the
    models: ``RotaryEmbedding.forward`` is an ``lru_cache`` whose key holds the context-parallel group, so every
    model stepped kept a group alive (three threads a rank a model; with the recompute variants' models the PP2
    layout measured last stepped 231 ms against 168 first, cleared 183 against 174), and the MoE loss tracker
    holds the last step's reduce groups. Both are emptied first."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    for rotary in (RotaryEmbedding, YarnRotaryEmbedding):
        rotary.forward.cache_clear()
    get_moe_layer_wise_logging_tracker().clear()
    for group in ps._global_process_group_list or ():
        if group is not None:
            dist.destroy_process_group(group)
    ps._global_process_group_list = None
    ps.destroy_model_parallel()


class Built:
    """A shrunken model of one depth (and settings), built, wrapped in Megatron-Core's DDP and given its optimizer
    on this rank, to be stepped at several shapes (:meth:`timer`): its micro-batch, sequence (up to the one it was
    built for) and micro-batches a step change, the model does not. Its optimizer steps at a learning rate of 0:
    every step does the optimizer's work and leaves the weights, so that the router sends a batch's tokens to the
    same experts every time it is stepped (:class:`StepTimer`)."""

    def __init__(self, job: Any, r: Any):
        self.job = job.for_plan(r)
        self.tcfg = self.job.transformer_config()
        self.model, self.optimizer = self.job.wrap_and_optimizer(self.tcfg, self.job.build_model(self.tcfg))
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0

    def timer(self, r: Any, **extra: Any) -> StepTimer:
        """Steps of shrunken plan ``r`` (this model's depth and settings); ``extra`` goes into its row."""
        return StepTimer(None, r, extra).on(self)

    def free(self) -> None:
        """The model and its optimizer let go. Megatron-Core's DDP hooks each parameter's gradient accumulator with a
        closure over the wrapper, and the model keeps the last step's autograd graph, which reaches those
        accumulators (the MoE token dispatcher holds its routing probabilities): a cycle through torch's C++ graph
        that Python's collector cannot see, so every model stayed alive, its optimizer's states too, until the
        process ended (tiny_moe: 1.1 -> 1.5 GB a rank over six layouts). The wrapper lets go of its module, which
        breaks the cycle."""
        import gc

        for chunk in self.model:
            del chunk.module
        del self.model, self.optimizer
        gc.collect()
        _trim_heap()


def _trim_heap() -> None:
    """The memory a freed model leaves in glibc's heap handed back to the system (``malloc_trim``), so the next
    model's allocations start from pages as a fresh process's do. Without it every layout's second round stepped
    slower than its first in a full calibration, and the layouts measured late slower than fresh runs (tiny_moe, PP2
    after the other layouts and their variants: 1.2x): over all 168 step rows the median ln(round 2 / round 1), less
    the machine's own move between them (the reference), came to 0.072, 0.069 and 0.051 in three calibrations, with
    the trim to 0.016, 0.028 and 0.008. Nothing where the C library has no ``malloc_trim`` (musl, macOS)."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's own symbols: its C library's
    if trim is not None:
        trim(0)


class StepTimer:
    """One shape's steps on one of a layout's models (``model``: its key in :attr:`LayoutSteps.models`), over every
    round: each on mock tokens, timed as the job times a step (``Job._timed``), after a barrier; :meth:`on` binds it
    to the round's build of its model; :meth:`row` reduces its steps to the slowest rank's. Every step is on one
    batch (the first micro-batches) on weights held (:class:`Built`), so each expert gets the same rows every step:
    on a CPU a bf16 GEMM is oneDNN's, its kernel made (JIT) for each new shape, and a run's steady steps find most
    of theirs made, where a new batch a step measured every shape as a run's first steps, 0.2 (ln) slower than its
    steady ones (docs/calibrate.md, What it measures)."""

    def __init__(self, model: Any, r: Any, extra: dict[str, Any]):
        from moe_hydra.job.data import MockData

        self.model, self.r, self.extra, self.built = model, r, extra, None
        self.seconds, self.calls, self.rounds = [], 0, 0  # timed steps (rounds of them), steps made, rounds done
        self.host, self.device = [], []  # a GPU's: the host's time to enqueue the step, the CUDA events' span
        self.references: list[float] = []  # the machine's reference read after each round's block (its index, s)
        b = r.batch
        self.data = MockData(r.cfg.model.vocab_size, b.seq_length, b.micro_batch_size, b.global_batch_size,
                             b.micro_batches_per_step, r.cfg.data.seed)

    def on(self, built: Built) -> StepTimer:
        """Steps from now on ``built``'s model (this shape's depth and settings)."""
        from megatron.core import parallel_state as ps

        self.built, self.job = built, built.job.for_plan(self.r)
        self.job.memory_phases = None
        self.forward_step = self.job._forward_step(self.data, built.tcfg)
        self.dp_rank = ps.get_data_parallel_rank()
        return self

    def off(self) -> None:
        """Bound to no model (its round's build let go)."""
        self.built = self.forward_step = None

    def step(self, batch: int = 0) -> tuple[float, float | None, float | None]:
        """One step's seconds on this rank: wall, and on a GPU the host's and the device's (CUDA events); on the
        shape's one batch (``batch`` another: the warm-up's, :meth:`routed`)."""
        import torch.distributed as dist
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        # Megatron-Core's per-layer MoE loss tracker is global, sized by the layers of the model that first saves
        # into it: the next step may be another depth's model
        get_moe_layer_wise_logging_tracker().clear()
        batches = [self.data.batch(batch, self.dp_rank, mb) for mb in range(self.r.batch.micro_batches_per_step)]
        self.calls += 1
        dist.barrier()
        wall_ms, host_ms, device_ms = self.job._timed(self.built.model, self.built.optimizer, self.forward_step,
                                                      batches)[:3]
        if device_ms is None:
            return wall_ms / 1e3, None, None
        return wall_ms / 1e3, host_ms / 1e3, device_ms / 1e3

    def routed(self, steps: int) -> dict[str, Any] | None:
        """``steps`` untimed steps on new batches (the ones after the shape's own), each MoE layer's rows per expert
        counted on this rank (its tokens): a series :func:`moe_hydra.core.calibrated_step.routing_spread` reads.
        None for a dense model (the steps still made)."""
        stats = self.job._router_stats(self.built.model)
        counts, tokens = [], 0
        for i in range(steps):
            if stats is not None:
                stats.reset()
            self.step(batch=1 + i)
            moe = [j for j, n in enumerate(stats.slots.tolist()) if n] if stats is not None else []
            if moe:  # this rank's stage has MoE layers
                tokens = int(stats.slots[moe[0]].item()) // self.r.arch.topk
                counts.append([x for j in moe for x in stats.counts[j].tolist()])
        if stats is None:
            return None
        stats.close()
        return {"tokens": tokens, "counts": counts}

    def record(self) -> None:
        """One timed step."""
        wall, host, device = self.step()
        self.seconds.append(wall)
        if device is not None:
            self.host.append(host)
            self.device.append(device)

    def row(self, say: Callable[[str], None]) -> dict[str, Any]:
        """The measurement row: each step the slowest rank's; each round's median, and ``steady_s``, the lower of
        them, which the fit reads (:func:`fit_steps`)."""
        import torch
        import torch.distributed as dist

        r, b = self.r, self.r.batch
        slowest = torch.tensor(self.seconds, dtype=torch.float64, device=self.job.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
        slowest = slowest.tolist()
        layers = max(len(x.layers) for x in r.split)
        m = Measurement("step", {"layout": r.layout.describe(), "layers": layers, "pp": r.layout.pp,
                                 "micro_batch_size": b.micro_batch_size, "seq_length": b.seq_length,
                                 "microbatches": b.micro_batches_per_step},
                        slowest, float(b.tokens_per_step), "token", warmup=self.calls - len(self.seconds))
        each = len(slowest) // max(self.rounds, 1)
        medians = [statistics.median(slowest[i:i + each]) for i in range(0, len(slowest), each)]
        rounds = {"each_s": slowest, "round_medians_s": medians, "steady_s": min(medians),
                  "between_rounds": math.log(max(medians) / min(medians))}
        apart = {}
        if self.device:  # a GPU: where the step's time went, the host's enqueueing against the device's kernels
            apart = {"host_median_s": statistics.median(self.host), "device_median_s": statistics.median(self.device)}
        say(f"step on {r.layout.describe()}: {layers} layer(s) a stage, micro-batch {b.micro_batch_size} x "
            f"{b.seq_length} tokens, {b.micro_batches_per_step} a step"
            + (f", {r.cfg.recompute.name} recompute" if r.cfg.recompute.recompute_granularity else "")
            + f", {r.cfg.dispatcher.name}: {m.median_s * 1e3:.1f} ms"
            + (f" (device {apart['device_median_s'] * 1e3:.1f} ms, host {apart['host_median_s'] * 1e3:.1f} ms)"
               if apart else ""))
        ref = {"reference_index_s": self.references} if self.references else {}
        return {**m.as_dict(), **rounds, **apart, **ref, **self.extra}


def fit_steps(measured: list[dict[str, Any]], r: Any) -> dict[str, Any]:
    """calibration.json's ``step`` from :func:`steps`' rows: per layout, the form fitted on its plan-settings steps
    (:func:`moe_hydra.core.calibrated_step.derive`) and what each variant adds to its coefficients.

    A row's step is its ``steady_s``: of its rounds' medians the lower. A round's block is a few steps, and what
    disturbs this machine (another tenant, a model just switched) lasts longer than a block and only ever adds time,
    so a round came out a median 0.05-0.17 (|ln|) above the other and up to 1.6x, where a run's window of 40 steps
    settles. Fitted on the rows' overall medians instead, four held-out benchmarks (2026-12-06, 15-30
    configurations each) came to 0.175 / 0.357 / 0.389, 0.145 / 0.304 / 0.342, 0.117 / 0.255 / 0.657 and 0.176 /
    0.410 / 0.549 (median / p90 / worst |ln|); on the lower rounds, 0.098 / 0.305 / 0.454, 0.091 / 0.204 / 0.310,
    0.108 / 0.219 / 0.437 and 0.097 / 0.441 / 0.491, the measured best layout predicted in 15 of 18 groups against
    14 (docs/calibrate.md)."""

    def shape(row: dict[str, Any]) -> cs.Shape:
        return cs.Shape(row["pp"], row["microbatches"], row["layers"], row["micro_batch_size"] * row["seq_length"],
                        row["seq_length"])

    fitted = []
    for lay in measured:
        own = [x for x in lay["measurements"] if "group" not in x]
        entry = {"layout": cs.layout_of(lay["resolved"]), "parallel": lay["parallel"],
                 "settings": {g: {"option": getattr(r.cfg, g).name, "config": cs.group_config(r.cfg, g)}
                              for g in cs.VARIANT_GROUPS},
                 **cs.derive([shape(x) for x in own], [x["steady_s"] for x in own]), "variants": []}
        options = dict.fromkeys((x["group"], x["option"]) for x in lay["measurements"] if "option" in x)
        own_at = {shape(x): x["steady_s"] for x in own}  # a variant's pair: the layout's own step at its shape
        for group, option in options:
            rows = [x for x in lay["measurements"] if x.get("group") == group and x.get("option") == option]
            entry["variants"].append({"group": group, "option": option, "config": rows[0]["config"],
                                      **cs.variant_terms(entry["coefficients"], [shape(x) for x in rows],
                                                          [x["steady_s"] for x in rows],
                                                          [own_at[shape(x)] for x in rows])})
        fitted.append(entry)
    every = [p["held_out_abs_ln"] for e in fitted for p in e["points"]]
    every += [p["held_out_abs_ln"] for e in fitted for v in e["variants"] for p in v["points"]]
    return {"form": cs.FORM, "held_out_method": "leave one step out: each measured step predicted by the fit (or the "
            "variant's deltas) of the others on its layout", "held_out": cs.summary(every),
            "holds": cs.holds(r), "layouts": fitted}


def expert_rows(rows: list[dict[str, Any]], series: list[dict[str, Any]], machine: dict[str, Any]
                ) -> dict[str, Any] | None:
    """calibration.json's ``step.expert_rows``: what a run's step pays for the expert row counts it meets for the
    first time (:func:`moe_hydra.core.calibrated_step.new_rows_term`). A run's router sends each expert a different
    number of rows every step, and on a CPU a bf16 GEMM's kernel is made for each new one (oneDNN) and kept among
    the :data:`ONEDNN_CACHE` made last; at 1024 tokens a micro-batch tiny_moe's EP 2 meets some 5 row counts a step
    it has no kernels for, at some 4 ms each, where the calibration's steps, on one batch each, meet none. From the
    calibration: ``cost_s``, one row count's cost at each ETP's expert width (:func:`new_row_cost`); ``routing``,
    how the rows spread (:func:`moe_hydra.core.calibrated_step.routing_spread` of the warm-up steps' counts);
    ``cache_row_counts``, the row counts the cache holds (its kernels over
    :data:`~moe_hydra.core.calibrated_step.KERNELS_PER_ROW_COUNT`; None on a GPU). None for a dense model."""
    costs = {str(x["etp"]): x["median_s"] for x in rows if x.get("kind") == "new_rows"}
    routing = cs.routing_spread(series)
    if not costs or routing is None:
        return None
    capacity = machine.get("onednn_primitive_cache_capacity")
    return {"cost_s": costs, "routing": routing,
            "cache_row_counts": capacity // cs.KERNELS_PER_ROW_COUNT if capacity else None,
            "of": "cost_s: new_rows measurements' median (s a row count); routing: the warm-up steps' rows per "
                  "expert on new batches, rank 0's tokens"}


PART = "calibrate_part"  # a job spec's key: what this launch of the job's processes measures (:func:`parts`)


def parts(r: Any) -> list[dict[str, Any]]:
    """What each launch of the job's processes measures when a calibration is launched once a layout (the local and
    warm launchers: :func:`moe_hydra.commands.run._run_calibrate`): the indices of :func:`layouts` it steps
    (``layouts``; one each, in their order) and whether it also measures the rates (``rates``: the GEMMs, the memory
    bandwidth and the collectives; the first). A layout measured after others in one process stepped slower than
    measured alone, and slower than the runs it predicts: tiny_moe PP2, each block of steps over the machine's
    reference, a median 0.065-0.215 (ln) above calibrations of PP2 alone in four calibrations of every layout, its
    first blocks 0.29-0.69, where measured first 0.019; the same layout measured four times over in one process
    stepped alike every time, so what slows it is the layouts before it, not the process's age. A calibration of
    one layout predicted fresh runs right after it within 0.03-0.09 (docs/calibrate.md)."""
    return [{"layouts": [i], "rates": i == 0} for i in range(len(layouts(r)))]


def measure(spec: dict[str, Any], job: Any, which: list[int] | None = None, rates: bool = True
            ) -> dict[str, Any] | None:
    """One rank's share of ``stage=calibrate`` in this process (``job``: this rank's
    :class:`moe_hydra.job.train.Job` of the plan, not yet started): the model's step at shrunken depths on the
    layouts ``which`` (:func:`steps`; None: every one), the machine's reference after each model's blocks, and with
    ``rates`` the GEMMs at the model's shapes, the memory bandwidth and every collective over all the job's processes
    at sizes across the range. Rank 0 returns what it found (:func:`write` fits it), the others None."""
    import torch
    import torch.distributed as dist

    from moe_hydra.job.compat import cpu_has_bf16

    r = spec["resolved"]
    job.init_distributed()  # the run's: process group, threads, CPU shims, the plan's meshes
    rank, world, device, gpu = job.rank, job.world, job.device, job.on_gpu
    t0 = time.perf_counter()
    # the GEMMs' dtype is what the job's run: bf16, in fp32 on a CPU without bf16 GEMMs (moe_hydra.job.compat)
    dtype = torch.bfloat16 if gpu or cpu_has_bf16() else torch.float32

    def say(text: str) -> None:
        if rank == 0:
            announce(text)

    rows: list[dict[str, Any]] = []
    ref = Reference(device)
    try:
        measured = steps(job, say, ref, which)
        each = [index_of(x) for x in ref.readings]
        say(f"the machine's reference (fixed work read after each model's steps): {len(each)} readings, "
            f"{min(each) * 1e3:.1f}..{max(each) * 1e3:.1f} ms, median {statistics.median(each) * 1e3:.1f} ms")
        if rates:
            release_model_parallel()
            job.init_model_parallel()  # the plan's meshes again
            for name, m, n, k in gemm_shapes(r.arch, r.batch.seq_length):
                rows.append({**gemm(m, n, k, dtype, device).as_dict(), "gemm": name})
            say(f"{len(rows)} GEMMs at the model's shapes ({str(dtype).replace('torch.', '')}): "
                f"{min(x['tflops'] for x in rows):.3g}..{max(x['tflops'] for x in rows):.3g} TFLOP/s")
            if r.arch.experts:
                a = r.arch
                beyond = max(b * s for _, b, s, _ in step_shapes(r.batch.seq_length)) * world + 1
                for i, etp in enumerate(sorted({x["expert_tensor_parallel_size"] for x in layouts(r)})):
                    # each width at row counts of its own: a GEMM's kernels for a row count made at one width
                    # partly serve another (tiny_moe's, after the same counts at twice its width: 1.3 ms, not 3-4)
                    cost = new_row_cost(a.h, a.moe_ffn // etp, a.glu, dtype, device,
                                        beyond + i * NEW_ROW_STRIDE * NEW_ROW_COUNTS)
                    rows.append({**cost.as_dict(), "etp": etp})
                    say(f"an expert's GEMMs at a row count not run before (ETP {etp}): "
                        f"{cost.median_s * 1e3:+.2f} ms over the same again")
            for numel in ((1 << 22, 1 << 26) if gpu else (1 << 20, 1 << 23)):
                rows.append(memory_bandwidth(numel, dtype, device).as_dict())
            say(f"memory bandwidth: {rows[-1]['gb_per_s']:.3g} GB/s")
            if world > 1:
                for op in COLLECTIVES:
                    for nbytes in (GPU_COLLECTIVE_BYTES if gpu else CPU_COLLECTIVE_BYTES):
                        rows.append(collective(op, nbytes, device=device).as_dict())
                    say(f"{op} over {world} processes: {rows[-1]['busbw_gb_per_s']:.3g} GB/s bus bandwidth at "
                        f"{rows[-1]['bytes']} B")
    finally:
        release_model_parallel()
        dist.destroy_process_group()
    if rank != 0:
        return None
    return {"machine": machine(device, world), "layouts": measured, "rates": rows, "reference": ref.readings,
            "seconds": time.perf_counter() - t0}


def announce(text: str) -> None:
    """A line of the calibration's progress on the console."""
    print(f"calibrate: {text}", flush=True)


def write(r: Any, implementation: Any, found: list[dict[str, Any]], out_dir: Path, seconds: float,
          processes: str) -> dict[str, Any]:
    """calibration.json from what each launch's rank 0 found (:func:`measure`; the first's machine): the step fitted
    on every layout's rows (:func:`fit_steps`), every measurement, the machine's reference over all the readings,
    ``seconds`` the calibration took and how (``launch_seconds``: each launch's, from its process group to its
    last measurement; the rest is starting them); written to ``out_dir`` and returned."""
    from moe_hydra.core import io

    measured = [lay for part in found for lay in part["layouts"]]
    rows = [x for lay in measured for x in lay["measurements"]] + [x for part in found for x in part["rates"]]
    step = fit_steps(measured, r)
    step["expert_rows"] = expert_rows(rows, [s for lay in measured for s in lay["routing"]], found[0]["machine"])
    record = {"calibration_version": CALIBRATION_VERSION, "machine": found[0]["machine"],
              "implementation": implementation, "model": r.cfg.model.name, "step": step, "measurements": rows,
              "reference": reference_summary([x for part in found for x in part["reference"]]), "seconds": seconds,
              "launch_seconds": [part["seconds"] for part in found],
              "method": {"warmup_discarded": WARMUP, "repeats": REPEATS, "step_warmup_discarded": STEP_WARMUP,
                         "step_repeats": r.cfg.calibrate.step_repeats, "clock": "time.perf_counter, after "
                         "torch.cuda.synchronize on a GPU", "collective_time": "the slowest rank's",
                         "step_time": "the slowest rank's, as the job times a step", "processes": processes,
                         "step_order": f"{ROUNDS} passes over the layouts, every other one in the opposite order, "
                                       f"each a round of a layout's steps: its models one at a time, each built, "
                                       f"{STEP_WARMUP} steps on new batches discarded (their rows per expert "
                                       f"kept: expert_rows; the layout's first model: then a step at "
                                       f"each of its shapes), then a block per shape: a step untimed, then "
                                       f"ceil(step_repeats / {ROUNDS}) timed; before the first round, the "
                                       f"process's first model warmed up and a step at each of its shapes, untimed",
                         "step_data": "a shape's every step on one batch (its first micro-batches), the optimizer "
                                      "at a learning rate of 0: each expert gets the same rows every step",
                         "step_fitted": "a row's steady_s: the lower of its rounds' medians",
                         "step_host_device": "on a GPU, rank 0's host_median_s (the host enqueueing the step) and "
                                             "device_median_s (CUDA events around it)"}}
    io.write_json(record, out_dir / CALIBRATION_FILE)
    for lay in step["layouts"]:
        held = lay["held_out"]
        announce(f"step on {cs.describe_layout(lay['layout'])} fitted on {held['points']} steps: held out "
                 f"(each step predicted by the others) median |ln| {held['median']:.3f}, p90 {held['p90']:.3f}, "
                 f"worst {held['worst']:.3f}" + "".join(f"; {v['group']}={v['option']}: the layers' work x"
                                                        f"{1 + v['layers_factor']:.2f}, "
                                                        f"{v['extra_per_layer_token_seq']:+.3g} s per token and key "
                                                        f"(worst {v['held_out']['worst']:.3f})"
                                                        for v in lay["variants"]))
    announce(f"{len(rows)} measurements in {seconds:.1f} s -> {out_dir / CALIBRATION_FILE}")
    return record


ONE_PROCESS = "every layout in one process"
PER_LAYOUT = "a launch of the job's processes a layout (parts)"


def worker(spec: dict[str, Any], job: Any) -> dict[str, Any] | None:
    """One rank of ``stage=calibrate``: with ``spec[PART]`` (:func:`parts`) what that launch measures, rank 0's
    findings returned (:func:`measure`); without, the whole calibration in this process (a Slurm job's ranks), rank 0
    writing ``calibration.json`` and returning it."""
    part = spec.get(PART)
    if part is not None:
        return measure(spec, job, part["layouts"], part["rates"])
    t0 = time.perf_counter()
    found = measure(spec, job)
    if found is None:
        return None
    return write(spec["resolved"], spec["plan"].get("implementation"), [found], Path(spec["out_dir"]),
                 time.perf_counter() - t0, ONE_PROCESS)


# ------------------------------------------------------------------ the machine's reference

REFERENCE_PROBES = ("host", "gemm", "memory")
REFERENCE_HOST_CALLS = 50
REFERENCE_GEMM = (256, 1024, 256)  # m, n, k
REFERENCE_GEMM_CALLS = 10
REFERENCE_COPY_NUMEL = 1 << 22  # 16 MiB of fp32: more than a core's share of this machine's caches
REFERENCE_COPY_CALLS = 5
# what a reading is: two readings compare only when this is the same
REFERENCE_DEFINITION = {
    "host": f"{REFERENCE_HOST_CALLS} fwd+bwd of 8 Linear(16, 16) on 4 rows",
    "gemm": f"{REFERENCE_GEMM_CALLS} x {'x'.join(map(str, REFERENCE_GEMM))} (m n k) fp32",
    "memory": f"{REFERENCE_COPY_CALLS} copies of {REFERENCE_COPY_NUMEL} fp32",
    "time": f"each probe's calls after {WARMUP} untimed, the slowest rank's; index: geometric mean of the probes' "
            "medians over the readings"}


class Reference:
    """The machine's speed as a calibration or a run found it: one fixed piece of work read between its steps.

    A calibration predicts the machine as it was while it measured. On a shared or throttled machine that is not the
    machine a later run finds: on this 2-vCPU VM the same step moves by up to 0.37 (|ln|) within 20 minutes with
    nothing changed, and GEMMs, copies and the interpreter move with it (``benchmarks/machine_drift.py``). The
    reference is work no config changes:

    - ``host``: :data:`REFERENCE_HOST_CALLS` forward and backward calls of eight 16-wide linear layers (module calls
      and op dispatch, most of a small model's step on a CPU);
    - ``gemm``: :data:`REFERENCE_GEMM_CALLS` GEMMs at :data:`REFERENCE_GEMM` (m, n, k), fp32, as :func:`gemm`;
    - ``memory``: :data:`REFERENCE_COPY_CALLS` copies of :data:`REFERENCE_COPY_NUMEL` fp32 numbers, as
      :func:`memory_bandwidth`.

    Its tensors are made once, with the object: a reading allocates nothing (made afresh at each reading, 50 MiB
    filled with random numbers between two blocks of steps, the glibc allocator's heap moved under the steps).

    ``stage=calibrate`` reads it after each model's blocks of steps (:meth:`LayoutSteps.round`), a run after every
    ``contract.reference_every``-th step of its window (outside the timed steps; off by default: it is work between
    them). Every rank of the default group reads at once, after a barrier; a probe's time is the slowest rank's.
    :meth:`summary` is what calibration.json and results.json record; :func:`moe_hydra.core.calibrated_step.carried`
    carries a prediction from a calibration's reading to a run's."""

    def __init__(self, device: Any):
        import torch

        m, n, k = REFERENCE_GEMM
        self.device, self.sync = device, _sync(device)
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)]).to(device)
        self.x = torch.randn(4, 16, device=device)
        self.a, self.b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        self.c = torch.empty(m, n, device=device)
        self.src = torch.randn(REFERENCE_COPY_NUMEL, device=device)
        self.dst = torch.empty_like(self.src)
        self.readings: list[dict[str, float]] = []

    def read(self) -> dict[str, float]:
        """One reading: each probe's seconds, the slowest rank's."""
        import torch
        import torch.distributed as dist

        dist.barrier()
        found = torch.tensor([sum(timed(lambda: self.layers(self.x).sum().backward(), self.sync,
                                        repeats=REFERENCE_HOST_CALLS)),
                              sum(timed(lambda: torch.matmul(self.a, self.b, out=self.c), self.sync,
                                        repeats=REFERENCE_GEMM_CALLS)),
                              sum(timed(lambda: self.dst.copy_(self.src), self.sync, repeats=REFERENCE_COPY_CALLS))],
                             dtype=torch.float64, device=self.device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        reading = {"t": time.time(), **dict(zip(REFERENCE_PROBES, found.tolist()))}
        self.readings.append(reading)
        return reading

    def summary(self) -> dict[str, Any] | None:
        """Each probe's median, min and max (s) over the readings, ``index_s`` (:func:`index_of` their medians) and
        ``each`` reading (with its ``time.time``); None without a reading."""
        return reference_summary(self.readings)


def reference_summary(readings: list[dict[str, float]]) -> dict[str, Any] | None:
    """:meth:`Reference.summary` of ``readings`` (a calibration's, over its launches)."""
    if not readings:
        return None
    probes = {k: {"median_s": statistics.median(x[k] for x in readings),
                  "min_s": min(x[k] for x in readings), "max_s": max(x[k] for x in readings)}
              for k in REFERENCE_PROBES}
    index = index_of({k: p["median_s"] for k, p in probes.items()})
    return {"index_s": index, "readings": len(readings), "probes": probes, "definition": REFERENCE_DEFINITION,
            "each": readings}


def index_of(reading: dict[str, float]) -> float:
    """One number for a reading of the reference: the geometric mean of its probes' seconds."""
    return math.exp(statistics.fmean(math.log(reading[k]) for k in REFERENCE_PROBES))
