"""The Three Walls of a profiled window: each step's wall time split, by interval union, into what filled it.

The input is one rank's trace as ``torch.profiler`` exports it (Chrome trace format: complete events, ``"ph":
"X"``, with ``cat``, ``name``, ``pid``, ``tid``, ``ts`` and ``dur`` in microseconds) in which the job marked each
profiled step with a user annotation named ``moe_hydra.step N`` on its main thread (:data:`STEP`), spanning the
timed part of the step (:mod:`moe_hydra.job.train`). Within each step's span, every instant goes to exactly one
of these parts, in this order of precedence, so the exclusive parts sum to the wall:

    compute_ms                  the union of compute: device kernels that are not collectives; on the CPU, the
                                main thread inside an operator (``aten::*``, not autograd's nodes and Functions,
                                which are spans around operators: Python, or a wait on a collective)
    exposed_communication_ms    communication not under compute (what overlap did not hide)
    memcpy_ms                   device copies and memsets not under compute or communication (none on the CPU)
    host_ms                     the device idle while the host works: its recorded operators, runtime calls
                                (launches, syncs) and annotations on any of the rank's threads (autograd runs
                                the backward pass on a thread of its own); on the CPU, the main thread outside any
                                operator (Python, Megatron's schedule, dispatch)
    idle_ms                     neither: the device idle and the host in nothing recorded (always 0 on the CPU,
                                whose main thread is either in an operator or in Python)

and, not exclusive, ``communication_ms``: the union of communication (NCCL, DeepEP and HybridEP kernels;
gloo's collectives, which run on gloo's own threads, and the ``c10d::`` calls that start them).
``exposed_communication_ms`` is ``communication_ms`` less what compute hid. Kernel or operator durations are
never added up to make a wall (concurrent kernels overlap); they only rank the top lists, where an operator
counts its self time (its span less its children's) so nested operators are not counted twice.

Pure: standard library only.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

STEP = "moe_hydra.step "  # + the step number: the annotation of one profiled step
EXCLUSIVE = ("compute_ms", "exposed_communication_ms", "memcpy_ms", "host_ms", "idle_ms")
PARTS = ("wall_ms", "compute_ms", "communication_ms", *EXCLUSIVE[1:])
# device kernels that move data between ranks: NCCL's, DeepEP's and HybridEP's
COMM_KERNEL = re.compile(r"nccl|deep_?ep|hybrid_?ep|all_?to_?all|all_?gather|reduce_?scatter|all_?reduce",
                         re.IGNORECASE)
COMM_HOST = ("gloo:", "nccl:", "c10d::")  # host-side collectives: gloo's work, the calls that start a collective
WRAPPERS = ("autograd::", "Optimizer.", "ProfilerStep", STEP)  # spans around operators, not operators
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver", "python_function", "user_annotation")

Interval = tuple[float, float]


# --------------------------------------------------------------------------- interval arithmetic

def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        elif b > a:
            out.append([a, b])
    return [(a, b) for a, b in out]


def clip(merged: list[Interval], lo: float, hi: float, starts: list[float] | None = None) -> list[Interval]:
    """``merged`` within [lo, hi] (``starts``: the intervals' starts, to search once built)."""
    starts = starts if starts is not None else [a for a, _ in merged]
    i = max(0, bisect_left(starts, lo) - 1)
    j = bisect_right(starts, hi)
    return [(max(a, lo), min(b, hi)) for a, b in merged[i:j] if min(b, hi) > max(a, lo)]


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` less ``b``, both merged."""
    out, j = [], 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k, cur = j, lo
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


# --------------------------------------------------------------------------- one rank

def _span(e: dict[str, Any]) -> Interval:
    return float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0)


def _is_comm_host(name: str) -> bool:
    return name.startswith(COMM_HOST)


def _is_operator(name: str) -> bool:
    """An operator that computes (``aten::mm``, a custom ``ns::op``), not a span around others: autograd's
    nodes and Functions (``MmBackward0``, Megatron's ``_AllToAll``, whose self time is Python or a wait)."""
    return "::" in name and not name.startswith(WRAPPERS)


def classify(events: list[dict[str, Any]], alone: bool = False) -> dict[str, Any]:
    """Sort a trace's complete events into the walls' raw material: ``steps`` {step: span} from the step
    annotations, ``device`` (cuda when the trace holds kernels, else cpu), and the lists of intervals and named
    events of compute, communication, memcpy and host.

    ``alone``: the rank is its job's only one, so its collectives move nothing between ranks (gloo and NCCL
    still run them, as local copies): NCCL's kernels count as compute, gloo's work and the ``c10d::`` calls as
    the host's. With more ranks every collective counts as communication, a group of one rank's too (a trace
    does not say a collective's group; Megatron-Core skips most of those)."""
    steps: dict[int, Interval] = {}
    main = None
    for e in events:  # the host's annotation: on a GPU, the profiler also projects it onto each stream it launched on
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP):
            steps[int(e["name"][len(STEP):])] = _span(e)
            main = (e.get("pid"), e.get("tid"))
    gpu = any(e.get("cat") == "kernel" for e in events)
    kinds: dict[str, list[tuple[Interval, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or not e.get("dur"):
            continue
        cat, name, span = e.get("cat"), str(e.get("name", "")), _span(e)
        on_main = (e.get("pid"), e.get("tid")) == main
        # a GPU's host is the rank's process, every thread: autograd runs the backward pass on a thread of its own
        host = main is not None and e.get("pid") == main[0] if gpu else on_main
        if cat == "kernel":
            kinds["communication" if COMM_KERNEL.search(name) and not alone else "compute"].append((span, name))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            kinds["memcpy"].append((span, name))
        elif _is_comm_host(name) and cat in ("cpu_op", "user_annotation"):
            if not alone:
                kinds["communication"].append((span, name))
            elif host and gpu:
                kinds["host"].append((span, name))
        elif host and cat in HOST_CATEGORIES and not name.startswith(STEP):
            if gpu:
                kinds["host"].append((span, name))
            elif cat == "cpu_op" and _is_operator(name):
                kinds["compute"].append((span, name))
    return {"steps": steps, "device": "cuda" if gpu else "cpu", "main": main, **kinds}


def _self_ms(named: list[tuple[Interval, str]]) -> dict[str, list[float]]:
    """name -> [self ms, calls]: each event's span less its direct children's (one thread's nested operators)."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    stack: list[list[Any]] = []  # [end, name, self]

    def close(item: list[Any]) -> None:
        out[item[1]][0] += item[2] / 1e3
        out[item[1]][1] += 1

    for (a, b), name in sorted(named, key=lambda x: (x[0][0], -x[0][1])):
        while stack and stack[-1][0] <= a:
            close(stack.pop())
        if stack:
            stack[-1][2] -= min(b, stack[-1][0]) - a
        stack.append([b, name, b - a])
    for item in stack:
        close(item)
    return out


def _top(named: list[tuple[Interval, str]], windows: list[Interval], n: int, nested: bool) -> list[dict[str, Any]]:
    """The ``n`` names with the most time inside ``windows``: self time when ``nested`` (operators), else summed
    durations (kernels, collectives)."""
    inside = [(s, name) for s, name in named if any(s[0] < hi and s[1] > lo for lo, hi in windows)]
    if nested:
        totals = _self_ms(inside)
    else:
        totals = defaultdict(lambda: [0.0, 0])
        for (a, b), name in inside:
            totals[name][0] += (b - a) / 1e3
            totals[name][1] += 1
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name, "ms": round(ms, 4), "calls": int(calls)} for name, (ms, calls) in rows]


def breakdown(events: list[dict[str, Any]], top: int = 10, alone: bool = False) -> dict[str, Any]:
    """One rank's walls over its profiled steps: totals (ms), ``per_step_ms`` (each part, step by step),
    ``fractions`` of the wall, and the top compute and communication by time. ``alone``: see :func:`classify`.

    Raises:
        ValueError: the trace holds no step annotation.
    """
    k = classify(events, alone)
    if not k["steps"]:
        raise ValueError(f"no step annotations ('{STEP}N') in the trace")
    merged = {kind: merge(s for s, _ in k.get(kind, ())) for kind in ("compute", "communication", "memcpy", "host")}
    starts = {kind: [a for a, _ in m] for kind, m in merged.items()}
    per_step: dict[str, list[float]] = {p: [] for p in PARTS}
    for step in sorted(k["steps"]):
        lo, hi = k["steps"][step]
        wall = [(lo, hi)]
        c, m, p = (clip(merged[x], lo, hi, starts[x]) for x in ("compute", "communication", "memcpy"))
        host = wall if k["device"] == "cpu" else clip(merged["host"], lo, hi, starts["host"])
        busy = merge(c + m)
        memcpy = subtract(p, busy)
        busy = merge(busy + memcpy)
        host_only = subtract(host, busy)
        idle = subtract(subtract(wall, busy), host_only)
        for part, value in (("wall_ms", hi - lo), ("compute_ms", length(c)), ("communication_ms", length(m)),
                            ("exposed_communication_ms", length(subtract(m, c))), ("memcpy_ms", length(memcpy)),
                            ("host_ms", length(host_only)), ("idle_ms", length(idle))):
            per_step[part].append(value / 1e3)
    totals = {part: sum(values) for part, values in per_step.items()}
    windows = [k["steps"][s] for s in sorted(k["steps"])]
    return {
        "device": k["device"],
        "steps": sorted(k["steps"]),
        **{part: round(v, 4) for part, v in totals.items()},
        "per_step_ms": {part: [round(v, 4) for v in values] for part, values in per_step.items()},
        "fractions": {part[:-3]: round(totals[part] / totals["wall_ms"], 4) if totals["wall_ms"] else 0.0
                      for part in PARTS if part != "wall_ms"},
        "top_compute": _top(k.get("compute", []), windows, top, nested=k["device"] == "cpu"),
        "top_communication": _top(k.get("communication", []), windows, top, nested=False),
    }


# --------------------------------------------------------------------------- all ranks

def summarize(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """profile.json's ``ranks`` (by rank) and ``slowest_rank`` (the rank whose window took longest: the one the
    step waits for), each wall's median/min/max over ranks (``spread``)."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    slowest = max(ranks, key=lambda r: r["wall_ms"])
    spread = {}
    for part in PARTS:
        values = sorted(r[part] for r in ranks)
        spread[part] = {"median": values[len(values) // 2] if len(values) % 2 else
                        (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2,
                        "min": values[0], "max": values[-1], "n": len(values)}
    return {"slowest_rank": slowest, "spread": spread, "ranks": ranks}
