"""A/B statistics on steady-window step times: Welch's t interval, verdict, minimum detectable effect.

For arms A (baseline) and B (candidate) with samples a, b (steady-window step times in ms, or one
mean per run when an arm was repeated — the run is then the unit):

    d          = mean(b) - mean(a)                     se = sqrt(var(a)/n_a + var(b)/n_b)
    95 % CI    = d +- t(0.975, df) * se                df = Welch-Satterthwaite
    relative   = d / mean(a), CI / mean(a)             (step time; > 0 means B is slower)
    tokens/s   = mean(a) / mean(b) - 1, CI mapped the same way (same tokens per step)
    verdict    = "slower" / "faster" when the relative CI lies beyond +-floor, else "no significant difference"
    MDE        = floor + (t(0.975, df) + t(0.80, df)) * se / mean(a)   smallest effect found 80 % of the time

``floor`` is the run-to-run noise (hardware.run_to_run_noise) when each arm is a single run: step times
of one run say nothing about how much a second run of the same config would differ, and on a shared
machine whole runs shift. With repeated arms the run is the unit, its variance is measured, floor is 0.

Welch's test is chosen over a bootstrap because arms have few samples (a 10-step window, a handful of
repeats), where percentile bootstraps are too narrow. Step times within one run are not independent
(drift, shared-machine noise): with one run per arm the verdict covers within-run noise only, and says
so; repeat the arms for a run-level verdict. Warmup steps never enter.

The test and the interval are scipy's (``scipy.stats.ttest_ind(b, a, equal_var=False)`` and its
``confidence_interval``); scipy is imported inside the functions that use it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

FASTER, SLOWER, SAME = "faster", "slower", "no significant difference"


@dataclass(frozen=True)
class Effect:
    unit: str  # "steps" (one run per arm) or "runs" (repeated arms: one mean per run)
    n_a: int
    n_b: int
    mean_a_ms: float
    mean_b_ms: float
    rel_step_time: float
    ci_low: float
    ci_high: float
    rel_tokens_per_s: float
    tokens_ci_low: float
    tokens_ci_high: float
    p_value: float
    df: float
    mde: float
    floor: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def welch(a: list[float], b: list[float], unit: str, floor: float = 0.0, confidence: float = 0.95,
          power: float = 0.80) -> Effect:
    """Compare candidate ``b`` with baseline ``a``.

    Raises:
        ValueError: when an arm has fewer than 2 samples.
    """
    from scipy import stats as st

    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"each arm needs at least 2 samples, got {len(a)} and {len(b)}")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    d = mb - ma
    if statistics.variance(a) == statistics.variance(b) == 0:  # no spread: scipy's t is undefined here
        df, p, lo, hi, mde_t = float("inf"), (0.0 if d else 1.0), d, d, 0.0
    else:
        test = st.ttest_ind(b, a, equal_var=False)  # Welch; df is Welch-Satterthwaite's
        df, p = float(test.df), float(test.pvalue)
        interval = test.confidence_interval(confidence)
        lo, hi = float(interval.low), float(interval.high)
        se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        mde_t = (st.t.ppf(0.5 + confidence / 2, df) + st.t.ppf(power, df)) * se
    verdict = SLOWER if lo / ma > floor else FASTER if hi / ma < -floor else SAME

    def tokens(delta: float) -> float:
        return ma / (ma + delta) - 1 if ma + delta > 0 else float("inf")

    return Effect(unit=unit, n_a=len(a), n_b=len(b), mean_a_ms=ma, mean_b_ms=mb, rel_step_time=d / ma,
                  ci_low=lo / ma, ci_high=hi / ma, rel_tokens_per_s=tokens(d), tokens_ci_low=tokens(hi),
                  tokens_ci_high=tokens(lo), p_value=p, df=df, mde=floor + mde_t / ma, floor=floor, verdict=verdict)


def mean_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of the mean of ``xs`` (at least 2 samples)."""
    from scipy import stats as st

    mean = statistics.fmean(xs)
    if statistics.stdev(xs) == 0:
        return mean, mean, mean
    low, high = st.t.interval(confidence, len(xs) - 1, loc=mean, scale=st.sem(xs))
    return mean, float(low), float(high)
