"""``profile=window``: trace the declared steps on every rank and write ``profile.json``.

Every rank runs ``torch.profiler`` (CPU activities; CUDA's too on a GPU) from the first profiled step to the
last, marks each step's timed part with a ``moe_hydra.step N`` annotation (:mod:`moe_hydra.core.walls`),
exports its trace (Chrome/Perfetto JSON, gzip-compressed, ``profile/trace.rank<R>.json.gz``: open it in
https://ui.perfetto.dev or chrome://tracing) and splits the window into the Three Walls from that file. Rank 0
gathers every rank's walls and writes ``profile.json`` next to ``results.json``.

With ``profile.tool=nsys`` the launcher runs each rank under ``nsys profile`` with a ``cudaProfilerApi`` capture
range; here the window opens and closes that range (``cudaProfilerStart``/``cudaProfilerStop``) and annotates the
steps as NVTX ranges, and the walls are read from the ``.nsys-rep`` files with Nsight's own tools.

The profiled steps are run and timed like the others; they lie after ``contract.window`` unless
``profile.steps`` says otherwise, and then ``profile.json`` and ``results.json`` say the window was perturbed.

``profile.json``:
    profile_version    1
    tool, activities   torch.profiler and what it recorded (CPU; CPU and CUDA) | nsys
    steps              [first, last] profiled; ``window`` the contract's; ``perturbs_window`` whether they overlap
    counter            how the walls were measured
    slowest_rank       the rank whose profiled steps took longest, with its walls (moe_hydra.core.walls)
    spread             each wall's median / min / max over ranks
    ranks              every rank's walls, per step too, and its top compute and communication
    step_time_ms       profiled vs unprofiled: the timed steps' mean inside the profile and in the window, and
                       their ratio (the profiler's perturbation)
    traces             the trace files, relative to the run directory
    overhead_s         rank 0's wall time spent exporting and analysing its trace (after the last step)
"""

from __future__ import annotations

import contextlib
import gzip
import json
import time
from pathlib import Path
from typing import Any

from moe_hydra.core import walls
from moe_hydra.core.io import write_json

PROFILE_VERSION = 1
FILE = "profile.json"


def trace_path(out_dir: Path, rank: int) -> Path:
    return out_dir / "profile" / f"trace.rank{rank}.json.gz"


class Window:
    """One rank's profiler over the resolved plan's ``profile_steps``: :meth:`begin` before each step,
    :meth:`annotate` around its timed part, :meth:`end` after it; :meth:`walls` once the loop is over."""

    def __init__(self, steps: tuple[int, int] | None, tool: str, on_gpu: bool, out_dir: Path, rank: int, top: int):
        self.steps, self.tool, self.on_gpu, self.rank, self.top = steps, tool, on_gpu, rank, top
        self.out_dir, self.path = out_dir, trace_path(out_dir, rank)
        self.profiler = None
        self.active = False
        self.overhead_s = 0.0
        self.analysed: dict[str, Any] | None = None

    def begin(self, step: int) -> None:
        if self.steps is None or step != self.steps[0]:
            return
        import torch

        if self.tool == "nsys":
            torch.cuda.profiler.start()
        else:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
            self.profiler = profile(activities=activities, record_shapes=False, with_stack=False)
            self.profiler.__enter__()
        self.active = True

    def annotate(self, step: int):
        """The step's span in the trace: a ``moe_hydra.step N`` annotation (an NVTX range under nsys)."""
        if not self.active:
            return contextlib.nullcontext()
        if self.tool == "nsys":
            import torch

            return torch.cuda.nvtx.range(f"{walls.STEP}{step}")
        from torch.profiler import record_function

        return record_function(f"{walls.STEP}{step}")

    def end(self, step: int, last_step: bool = False) -> None:
        """After ``step``: close the window at its last step, or at the run's last (``last_step``, e.g. stopped)."""
        if not self.active or (step != self.steps[1] and not last_step):
            return
        self.active = False
        t0 = time.perf_counter()
        import torch

        if self.tool == "nsys":
            torch.cuda.profiler.stop()
            return
        self.profiler.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self.path))  # .gz: torch compresses it
        self.profiler = None
        with gzip.open(self.path, "rt") as f:
            events = json.load(f)["traceEvents"]
        alone = torch.distributed.get_world_size() == 1
        self.analysed = {"rank": self.rank, **walls.breakdown(events, self.top, alone)}
        self.overhead_s = time.perf_counter() - t0

    def write(self, gathered: list[dict[str, Any] | None], records: list[Any], window: list[int],
              out_dir: Path) -> dict[str, Any] | None:
        """Rank 0: ``profile.json`` from every rank's walls (``gathered``); its summary for results.json."""
        if self.steps is None or self.tool == "nsys":
            return None if self.steps is None else {"tool": "nsys", "steps": list(self.steps),
                                                    "perturbs_window": overlaps(self.steps, window),
                                                    "traces": "profile/nsys.rank<R>.nsys-rep"}
        ranks = [g for g in gathered if g]
        if not ranks:
            return None
        profiled = [r.time_ms for r in records if self.steps[0] <= r.step <= self.steps[1]]
        measured = [r.time_ms for r in records if window[0] <= r.step <= window[1]]
        mean = (lambda xs: sum(xs) / len(xs) if xs else None)
        p, m = mean(profiled), mean(measured)
        doc = {
            "profile_version": PROFILE_VERSION,
            "tool": "torch.profiler",
            "activities": ["CPU", "CUDA"] if self.on_gpu else ["CPU"],
            "steps": list(self.steps),
            "window": list(window),
            "perturbs_window": overlaps(self.steps, window),
            "counter": "interval union of the trace's events within each step's moe_hydra.step annotation "
                       "(moe_hydra.core.walls); ms summed over the profiled steps",
            **walls.summarize(ranks),
            "step_time_ms": {"profiled": p, "window": m, "ratio": p / m if p and m else None,
                             "counter": "the timed steps (results.json step_times_ms) inside the profile and in "
                                        "the measured window"},
            "traces": [str(trace_path(Path("."), r["rank"])) for r in ranks],
            "overhead_s": round(self.overhead_s, 3),
        }
        write_json(doc, out_dir / FILE)
        s = doc["slowest_rank"]
        return {"tool": doc["tool"], "file": FILE, "steps": doc["steps"], "perturbs_window": doc["perturbs_window"],
                "slowest_rank": s["rank"], **{k: s[k] for k in walls.PARTS}}


def overlaps(steps: tuple[int, int] | list[int], window: list[int]) -> bool:
    return steps[0] <= window[1] and window[0] <= steps[1]
