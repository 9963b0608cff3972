"""Is a run's window steady? Changepoints in its step times, the class of its series, its steady segment.

The judgment of a series of step times (a run's ``step_times_ms``, after its ``contract.warmup_steps``), in the
manner of Barrett et al., "Virtual Machine Warmup Blows Hot and Cold" (OOPSLA 2017):

1. **Log scale.** The steps are judged as ``ln(time)``, so noise and shifts are relative (a 2 % jitter is the same
   on a 40 ms CPU step and a 4 s GPU step).
2. **Noise.** The series' own: sigma = 1.4826 x the median absolute deviation of its first differences / sqrt(2)
   (a level shift or a stall moves few differences, so they barely move it), at least :data:`NOISE_FLOOR`.
3. **Outliers.** A step more than :data:`OUTLIER_Z` sigma from the median of the :data:`OUTLIER_HALF_WIDTH` steps
   either side, in a run of at most :data:`OUTLIER_RUN` such steps, is a stall (or a hiccup), not a change of level:
   it is listed (``outliers``) and stands in as that median for the search. Three or more in a row are a level.
4. **Changepoints.** PELT (Killick, Fearnhead and Eckley 2012) for changes of the mean, by ``ruptures``
   (``KernelCPD(kernel="linear")``: its C implementation of PELT; the linear kernel's cost is the least-squares cost
   of ``Pelt(model="l2")``, and gives the same changepoints, 100-1000 times faster: 0.03 ms for 100 steps against
   34 ms, which lets ``contract.window=auto`` judge after every step; :func:`pelt`), segments at least
   :data:`MIN_SIZE` steps, penalty :data:`PENALTY` x sigma^2 x ln(n), more for a short series (:func:`penalty`).
5. **Levels.** Neighbouring segments whose means lie within :data:`TOLERANCE` of each other (relative; all the
   merged ones within it) are one level: a change smaller than that is not worth a warning.
   A level of at most :data:`BURST` steps above both its neighbours, or below both, is a burst (a few slow steps
   while another process works, and back): its steps are outliers too, and the search runs again without them.
6. **Class.** ``flat``: one level as long as ``steady_steps``; ``no_steady_state``: the last level is shorter than
   ``steady_steps`` (the series never settled, or not for long enough to tell); ``warmup``: the last level is the
   fastest; ``slowdown``: an earlier level was faster. The **steady segment** is the last level (``[first, last]``,
   1-based steps), when the class is not ``no_steady_state``.
7. **Window.** A window is steady when it lies inside the steady segment; one that reaches before it (into a
   warm-up or an earlier level) or that has no segment is not, and the judgment says which window would be
   (``suggested_window``: the segment).
8. **Drift.** The segment's least-squares line on the log scale: the relative change across the segment
   (``drift``) and the slope over its standard error (``drift_z``): a slow fall or rise inside the noise, which PELT
   places no changepoint in.
9. **Auto.** ``contract.window=auto`` stops on a judgment whose steady segment is also at least half of the steps
   judged, after at least :data:`AUTO_HISTORY` x ``steady_steps`` of them, and does not drift (:func:`settled`).

:data:`PENALTY`, :data:`TOLERANCE` and the outlier rule were set on synthetic series with known truth
(``benchmarks/steady_state.py``: flat, warm-ups of 0-200 steps, shifts, drift, stalls, noise 1-20 %), then checked on
this machine's real runs.

Pure: standard library at import; numpy and ruptures inside :func:`judge`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

FLAT, WARMUP, SLOWDOWN, NO_STEADY_STATE = "flat", "warmup", "slowdown", "no_steady_state"
CLASSES = (FLAT, WARMUP, SLOWDOWN, NO_STEADY_STATE)
AUTO = "auto"  # contract.window=auto: the job steps until the series has a steady segment of contract.steady_steps

STEADY_STEPS = 10  # contract.steady_steps' default: the shortest last level that counts as steady
AUTO_HISTORY = 2  # contract.window=auto judges at least this many x steady_steps steps before it stops (settled())
MIN_SIZE = 3  # the shortest segment the search places
PENALTY = 4.0  # x sigma^2 x ln(n): the cost of one more changepoint (2 is the BIC's; more: fewer false changes)
TOLERANCE = 0.01  # levels whose means differ by less (relative) are one level
SHORT = 10.0  # steps: the penalty's small-sample term (penalty())
NOISE_FLOOR = 1e-3  # sigma's least value (relative): a series of identical times has no noise to scale by
OUTLIER_Z = 5.0  # a step this many sigma from its neighbours' median is an outlier ...
OUTLIER_HALF_WIDTH = 4  # ... of the steps this far either side
OUTLIER_RUN = 2  # ... in a run of at most this many
BURST = 5  # a level of at most this many steps above (or below) both its neighbours is a burst, not a level
DRIFT_Z = 1.0  # contract.window=auto stops on no segment whose trend's slope is more standard errors than this
METHOD = (f"PELT on ln(step time) (ruptures KernelCPD, linear kernel), min segment {MIN_SIZE}, penalty {PENALTY:g} "
          f"sigma^2 ln(n) (1 + {SHORT:g}/n), sigma from the MAD of first differences; outliers beyond "
          f"{OUTLIER_Z:g} sigma of the median of +-{OUTLIER_HALF_WIDTH} steps in runs of <= {OUTLIER_RUN}; levels "
          f"within {TOLERANCE:.0%} merged; levels of <= {BURST} steps above or below both neighbours are bursts "
          f"(outliers); auto stops on no segment whose trend's slope exceeds {DRIFT_Z:g} x its standard error")


@dataclasses.dataclass(frozen=True, slots=True)
class Judgment:
    """What the series says. Steps are 1-based, as in ``results.json``."""

    kind: str  # one of CLASSES (results.json: steady.class)
    segment: tuple[int, int] | None  # the steady segment [first, last]; None for no_steady_state
    changepoints: tuple[int, ...]  # the first step of each level after the first
    levels: tuple[tuple[int, int, float], ...]  # (first, last, mean ms) of each level
    mean_ms: float | None  # the segment's mean step time (every step, outliers too, as step_time_ms is)
    noise: float | None  # the segment's relative standard deviation, its outliers left out
    outliers: tuple[int, ...]  # steps taken for stalls, not levels
    judged: tuple[int, int] | None  # the steps judged: after contract.warmup_steps to the last; None: none
    steady_steps: int
    window: tuple[int, int] | None = None  # the window judged
    window_steady: bool | None = None  # the window lies inside the segment (None: no window given)
    auto: bool = False  # the window was contract.window=auto's (of_results: results.json's window_declared)
    drift: float | None = None  # the relative change across the segment by its trend line (outliers as medians)
    drift_z: float | None = None  # the trend's slope over its standard error; None: no segment

    @property
    def suggested_window(self) -> tuple[int, int] | None:
        """The window that would be steady (the segment), when the judged one is not and there is one."""
        return self.segment if self.window_steady is False else None

    def as_dict(self) -> dict[str, Any]:
        """``results.json``'s ``steady``."""
        return {"class": self.kind, "segment": list(self.segment) if self.segment else None,
                "window": list(self.window) if self.window else None, "window_steady": self.window_steady,
                "suggested_window": list(self.suggested_window) if self.suggested_window else None,
                "changepoints": list(self.changepoints),
                "levels": [{"first": a, "last": b, "mean_ms": m} for a, b, m in self.levels],
                "mean_ms": self.mean_ms, "noise": self.noise, "outliers": list(self.outliers),
                "judged": list(self.judged) if self.judged else None, "steady_steps": self.steady_steps,
                "drift": self.drift, "drift_z": self.drift_z, "method": METHOD}

    def describe(self) -> str:
        """One line: the class, the segment, and the window's verdict with its fix."""
        seg = f"steady from step {self.segment[0]} to {self.segment[1]}" if self.segment else \
            f"no steady segment of {self.steady_steps} steps"
        shifts = f" ({len(self.changepoints)} change{'s' * (len(self.changepoints) != 1)} of level)" \
            if self.changepoints else ""
        head = f"{self.kind}{shifts}, {seg}"
        if self.window is None or self.window_steady is None:
            return head
        w = f"[{self.window[0]}, {self.window[1]}]"
        if self.window_steady:
            return f"{head}; window {w} steady"
        return f"{head}; window {w} NOT steady: {fix(self)}"


def fix(j: Judgment) -> str:
    """What to change so that a run's window is steady."""
    if j.segment is not None:
        return (f"contract.window=[{j.segment[0]},{j.segment[1]}] lies in the steady segment, or "
                f"contract.window=auto finds one")
    if j.auto:
        return (f"the run has no steady segment of {j.steady_steps} steps: run longer, a larger train.train_iters "
                f"(contract.window=auto's cap)")
    return (f"the run has no steady segment of {j.steady_steps} steps: run longer with contract.window=auto "
            f"(it steps until it finds one, up to train.train_iters)")


@functools.lru_cache(maxsize=1)
def _pelt_l2() -> Any:
    """ruptures' compiled PELT for the linear kernel (``ekcpd_pelt_L2``, what ``KernelCPD(kernel="linear")`` calls),
    loaded from its extension module alone: importing the package ``ruptures`` costs half a second (its
    ``__init__`` imports every detector, cost and plot, scipy.stats and matplotlib among them) and starts a thread
    of scipy's OpenBLAS, which a warm server's forked ranks could not inherit; the extension needs numpy alone and
    loads in a millisecond. The same changepoints either way (tests/test_steady.py); where the extension is not
    where this ruptures release keeps it, the public ``KernelCPD``."""
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    name = "ruptures.detection._detection.ekcpd"
    found = importlib.util.find_spec("ruptures")
    where = Path(found.submodule_search_locations[0]) / "detection" / "_detection" if found else None
    ext = next(iter(sorted(where.glob("ekcpd*.so")) if where and where.is_dir() else []), None)
    if ext is None:
        return None
    loader = importlib.machinery.ExtensionFileLoader(name, str(ext))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, str(ext), loader=loader))
    loader.exec_module(module)
    return getattr(module, "ekcpd_pelt_L2", None)


def pelt(y: Any, penalty: float, min_size: int = MIN_SIZE) -> list[int]:
    """The ends of PELT's segments of the series ``y`` (a float array) for changes of the mean, the last ``len(y)``:
    ruptures' ``KernelCPD(kernel="linear", min_size=min_size).fit(y).predict(pen=penalty)``."""
    import numpy as np

    signal = np.ascontiguousarray(np.asarray(y, dtype=float).reshape(-1, 1))
    fast = _pelt_l2()
    if fast is None:
        import ruptures

        return [int(e) for e in ruptures.KernelCPD(kernel="linear", min_size=min_size).fit(signal).predict(
            pen=penalty)]
    path = fast(signal, float(penalty), int(min_size))
    ends, i = [], len(signal)
    while i > 0:
        ends.append(i)
        i = int(path[i])
    return ends[::-1]


def load() -> float:
    """Load what :func:`judge` needs (numpy, ruptures' PELT) now, so that a job's first judgment does not pay for it
    inside its loop; the seconds it took (0 when already loaded)."""
    import time

    start = time.perf_counter()
    import numpy  # noqa: F401

    _pelt_l2()
    return time.perf_counter() - start


def _median(a: Any) -> Any:
    """The median along the last axis, by sorting (numpy's own imports numpy.ma the first time: 15 ms in a rank)."""
    import numpy as np

    a = np.sort(np.asarray(a, dtype=float), axis=-1)
    n = a.shape[-1]
    return (a[..., (n - 1) // 2] + a[..., n // 2]) / 2


def noise_of(y: Sequence[float]) -> float:
    """sigma of a log-scale series from its first differences (robust to shifts and stalls)."""
    import numpy as np

    d = np.diff(np.asarray(y, dtype=float))
    if len(d) < 2:
        return NOISE_FLOOR
    sigma = 1.4826 * float(_median(np.abs(d - _median(d)))) / math.sqrt(2)
    return max(sigma, NOISE_FLOOR)


def _outliers(y, sigma: float):
    """(indices taken for outliers, the series with each replaced by its neighbours' median)."""
    import numpy as np

    n, h = len(y), OUTLIER_HALF_WIDTH
    if n < 2 * h + 1:
        return [], y
    padded = np.pad(y, h, mode="reflect")
    med = _median(np.lib.stride_tricks.sliding_window_view(padded, 2 * h + 1))
    flagged = np.abs(y - med) > OUTLIER_Z * sigma
    out, i = [], 0
    while i < n:
        if flagged[i]:
            j = i
            while j < n and flagged[j]:
                j += 1
            if j - i <= OUTLIER_RUN:
                out += range(i, j)
            i = j
        else:
            i += 1
    if not out:
        return [], y
    clean = y.copy()
    clean[out] = med[out]
    return out, clean


def _levels(bounds: list[tuple[int, int]], y) -> list[tuple[int, int]]:
    """Neighbouring segments merged while all the means merged lie within TOLERANCE (the closest pair first)."""
    import numpy as np

    groups = [[(a, b)] for a, b in bounds]

    def mean(group):
        return float(np.mean(y[group[0][0]:group[-1][1]]))

    while len(groups) > 1:
        gaps = [abs(mean(groups[i]) - mean(groups[i + 1])) for i in range(len(groups) - 1)]
        i = min(range(len(gaps)), key=gaps.__getitem__)
        merged = groups[i] + groups[i + 1]
        means = [float(np.mean(y[a:b])) for a, b in merged]
        if max(means) - min(means) >= math.log1p(TOLERANCE):
            break
        groups[i:i + 2] = [merged]
    return [(g[0][0], g[-1][1]) for g in groups]


def _bursts(levels: list[tuple[int, int]], y) -> tuple[list[int], Any]:
    """Levels of at most :data:`BURST` steps that rise above both their neighbours, or fall below both (a few slow
    steps, and back): their steps' indices, and the series with each as the mean of the level before it. A short
    level between a higher and a lower one is a step of a warm-up (or of a slowdown), and the last level may not be
    over, so neither is a burst."""
    import numpy as np

    means = [float(np.mean(y[a:b])) for a, b in levels]
    burst, y = [], y.copy()
    for i in range(1, len(levels) - 1):
        a, b = levels[i]
        if b - a <= BURST and (means[i] - means[i - 1]) * (means[i] - means[i + 1]) > 0:
            burst += range(a, b)
            y[a:b] = means[i - 1]
    return burst, y


def penalty(sigma: float, n: int) -> float:
    """The cost of a changepoint in a series of ``n`` steps with noise ``sigma``: :data:`PENALTY` x sigma^2 x ln(n),
    raised by (1 + :data:`SHORT` / n) for a short series, whose sigma, from few differences, is itself uncertain
    (without it, 7 % of flat 15-step series showed a change; with it, about what a long series shows)."""
    return PENALTY * sigma ** 2 * math.log(n) * (1 + SHORT / n)


def judge(times_ms: Sequence[float], *, warmup_steps: int = 0, window: Sequence[int] | None = None,
          steady_steps: int = STEADY_STEPS) -> Judgment:
    """The judgment of a run's step times.

    Args:
        times_ms: every step's time (``step_times_ms``), step 1 first; each > 0.
        warmup_steps: the steps before the judged series (``contract.warmup_steps``), never judged.
        window: the declared window ``[first, last]`` (1-based, inclusive), judged against the segment; None: none.
        steady_steps: the shortest last level that counts as steady (``contract.steady_steps``).
    """
    import numpy as np

    times = [float(t) for t in times_ms]
    w0 = min(max(int(warmup_steps), 0), len(times))
    y = np.log(np.asarray(times[w0:], dtype=float))
    n = len(y)
    win = (int(window[0]), int(window[1])) if window is not None else None
    if n == 0:
        return Judgment(NO_STEADY_STATE, None, (), (), None, None, (), None, steady_steps, win,
                        False if win else None)
    sigma = noise_of(y)
    out, clean = _outliers(y, sigma)
    for passes in range(4):  # the search again without the bursts it found, three times at most
        bounds = [(0, n)]
        if n >= 2 * MIN_SIZE:
            ends = pelt(clean, penalty(sigma, n))
            bounds = list(zip([0, *ends[:-1]], ends))
        levels = _levels(bounds, clean)
        burst, without = _bursts(levels, clean)
        if not burst or passes == 3:
            break
        out, clean = sorted(set(out) | set(burst)), without
    step = w0 + 1  # the step of y[0]
    shown = tuple((a + step, b - 1 + step, float(np.mean(np.exp(y[a:b])))) for a, b in levels)
    a, b = levels[-1]
    means = [float(np.mean(clean[s:e])) for s, e in levels]
    if b - a < steady_steps:
        kind = NO_STEADY_STATE
    elif len(levels) == 1:
        kind = FLAT
    elif means[-1] <= min(means[:-1]):
        kind = WARMUP
    else:
        kind = SLOWDOWN
    segment = None if kind == NO_STEADY_STATE else (a + step, b - 1 + step)
    mean_ms = noise = drift = drift_z = None
    if segment:
        mean_ms = float(np.mean(np.exp(y[a:b])))
        kept = [i for i in range(a, b) if i not in set(out)]
        noise = float(np.std(y[kept], ddof=1)) if len(kept) > 1 else 0.0
        drift, drift_z = _drift(clean[a:b])
    steady = None
    if win is not None:
        steady = bool(segment and segment[0] <= win[0] and win[1] <= segment[1])
    return Judgment(kind, segment, tuple(s + step for s, _ in levels[1:]), shown, mean_ms, noise,
                    tuple(i + step for i in out), (step, w0 + n), steady_steps, win, steady, drift=drift,
                    drift_z=drift_z)


def _drift(seg) -> tuple[float, float]:
    """(the relative change across a log-scale segment by its least-squares line, that slope over its standard
    error): a trend test, which sees a ramp inside the noise sooner than halves' means do."""
    import numpy as np

    n = len(seg)
    if n < 4:
        return 0.0, 0.0
    x = np.arange(n, dtype=float) - (n - 1) / 2
    sxx = float(x @ x)
    slope = float(x @ (seg - np.mean(seg))) / sxx
    residual = seg - np.mean(seg) - slope * x
    se = math.sqrt(float(residual @ residual) / (n - 2) / sxx)
    return math.expm1(slope * (n - 1)), abs(slope) / max(se, NOISE_FLOOR / math.sqrt(sxx))


def settled(j: Judgment) -> bool:
    """Whether ``contract.window=auto`` stops on judgment ``j`` of the steps so far: a steady segment that is at
    least half of the steps judged (MSER's rule for a truncation point: in the first half of the series, else the
    run is too short to tell), after at least :data:`AUTO_HISTORY` x ``steady_steps`` steps judged, and with no trend:
    its slope within :data:`DRIFT_Z` standard errors, or a change across it under :data:`TOLERANCE`. A segment of
    ``steady_steps`` alone is not enough: a warm-up's plateau looks steady until the next fall (this CPU's tiny
    model: 50-57 ms for its first 10-15 steps, then 39, then 36), and a slow fall inside a noisy CPU's 20 % looks
    flat to PELT (a profiled sweep's first run: 160 ms falling to 110 over 20 steps; benchmarks/steady_state.py)."""
    if j.segment is None or j.judged is None:
        return False
    judged = j.judged[1] - j.judged[0] + 1
    length = j.segment[1] - j.segment[0] + 1
    still = j.drift_z is None or j.drift_z <= DRIFT_Z or abs(j.drift or 0.0) < TOLERANCE
    return judged >= AUTO_HISTORY * j.steady_steps and 2 * length >= judged and still


def validation(steps: int, steady_steps: int = STEADY_STEPS) -> list[str]:
    """The overrides of a validation run of at least ``steps`` steps (the acceptance gate's 50):
    ``contract.window=auto`` after the warmup that leaves it the history :func:`settled` needs, so its window is the
    first steady segment it can stop on after that many steps."""
    return [f"contract.window={AUTO}", f"contract.warmup_steps={max(steps - AUTO_HISTORY * steady_steps, 0)}"]


def of_results(results: dict[str, Any], steady_steps: int | None = None) -> Judgment:
    """The judgment of a ``results.json`` (one read through :func:`moe_hydra.core.results.read`): its step times
    after its warmup, up to its profiled steps when they follow the window (the profiler's own slowdown is not the
    run's), against the window it measured. A file written before the judgment existed is judged here the same
    way; ``steady_steps``: the file's ``steady.steady_steps``, else :data:`STEADY_STEPS`, unless given."""
    recorded = results.get("steady") if isinstance(results.get("steady"), dict) else {}
    k = steady_steps or recorded.get("steady_steps") or STEADY_STEPS
    window = results.get("window_measured") or results.get("window")
    times = list(results["step_times_ms"])
    profiled = results.get("profile_steps")
    if window and isinstance(profiled, list) and len(profiled) == 2 and profiled[0] > window[1]:
        times = times[:profiled[0] - 1]
    j = judge(times, warmup_steps=int(results.get("warmup_steps") or 0), window=window, steady_steps=int(k))
    return dataclasses.replace(j, auto=results.get("window_declared") == AUTO)
