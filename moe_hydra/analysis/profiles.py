"""Which wall moved: two runs' ``profile.json`` (``profile=window``), wall by wall.

For each wall of the slowest rank (:mod:`moe_hydra.core.walls`: compute, communication and its exposed part,
host, memcpy, idle) the samples are its milliseconds in each profiled step (pooled over an arm's runs); the
difference B − A in ms/step gets Welch's 95 % interval (scipy). A wall **moved** when that interval lies beyond
the noise floor, taken as a share of A's step (the floor of the step-time verdict: hardware.run_to_run_noise for
one run per arm, 0 for repeated arms); otherwise it is **unchanged**. The sentence names the walls that moved,
largest first, with their size, then the unchanged ones: "exposed communication +38.0 ms/step, compute
unchanged".

Reads files only; a profile.json that is unreadable or not of this shape is left out with one warning.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE = "profile.json"
VERSION = 1
# (wall in profile.json, as said); communication is inclusive: exposed communication is its visible part
WALLS = (("compute_ms", "compute"), ("communication_ms", "communication"),
         ("exposed_communication_ms", "exposed communication"), ("host_ms", "host"), ("memcpy_ms", "memcpy"),
         ("idle_ms", "idle"))
NO_PROFILE = "unknown: no profile in {which}; run both arms with profile=window to split the step into its walls"


def read(run_dir: Path, warn: Callable[[str], None]) -> dict[str, Any] | None:
    """The run's profile.json when it has one of this shape; None (warned when present but unusable) else."""
    path = run_dir / FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        warn(f"{path}: unreadable or not JSON ({type(e).__name__}); its walls are left out")
        return None
    problem = _problem(doc)
    if problem:
        warn(f"{path}: {problem}; its walls are left out")
        return None
    return doc


def _problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("profile_version") != VERSION:
        return f"profile_version {doc.get('profile_version')!r}, not {VERSION}"
    per_step = (doc.get("slowest_rank") or {}).get("per_step_ms") if isinstance(doc.get("slowest_rank"), dict) else None
    if not isinstance(per_step, dict):
        return "slowest_rank.per_step_ms missing"
    for key in ("wall_ms", *(k for k, _ in WALLS)):
        values = per_step.get(key)
        if not isinstance(values, list) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in values):
            return f"slowest_rank.per_step_ms.{key} is not a list of finite milliseconds"
    return None


def _samples(profiles: list[dict[str, Any]], key: str) -> list[float]:
    return [v for p in profiles for v in p["slowest_rank"]["per_step_ms"][key]]


def moved(a: list[dict[str, Any]], b: list[dict[str, Any]], floor: float) -> dict[str, Any]:
    """Arm B's walls against arm A's (each a list of profile.json documents): per wall the ms/step of each arm,
    the difference with its 95 % interval and whether it moved; ``summary``, the sentence."""
    from scipy import stats as st

    step_a = statistics.fmean(_samples(a, "wall_ms"))
    out: dict[str, Any] = {}
    for key, said in WALLS:
        xa, xb = _samples(a, key), _samples(b, key)
        ma, mb = statistics.fmean(xa), statistics.fmean(xb)
        d = mb - ma
        if len(xa) < 2 or len(xb) < 2 or statistics.pvariance(xa) == statistics.pvariance(xb) == 0:
            lo = hi = d
        else:
            with warnings.catch_warnings():  # scipy warns of precision loss when an arm's samples are all alike
                warnings.simplefilter("ignore", RuntimeWarning)
                ci = st.ttest_ind(xb, xa, equal_var=False).confidence_interval(0.95)
            lo, hi = float(ci.low), float(ci.high)
        margin = floor * step_a
        out[said] = {"a_ms_per_step": ma, "b_ms_per_step": mb, "delta_ms_per_step": d, "ci_ms_per_step": [lo, hi],
                     "share_of_step": d / step_a if step_a else None, "moved": lo > margin or hi < -margin}
    shown = sorted((w for w in out if out[w]["moved"]), key=lambda w: -abs(out[w]["delta_ms_per_step"]))
    still = [w for w in out if not out[w]["moved"]]
    parts = [f"{w} {out[w]['delta_ms_per_step']:+.1f} ms/step ({out[w]['share_of_step']:+.0%} of the step)"
             for w in shown]
    if still:
        parts.append(f"{', '.join(still)} unchanged")
    return {"walls": out, "floor": floor, "step_ms_a": step_a, "moved": shown, "summary": ", ".join(parts),
            "counter": "the slowest rank's walls per profiled step (profile.json); Welch 95 % interval of B - A, "
                       f"moved when beyond the noise floor of {floor:.0%} of A's step"}
