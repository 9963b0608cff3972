"""A/B statistics on steady-window step times: verdicts, intervals, equivalence, run-to-run noise, sequential looks.

Verdicts: ``faster`` / ``slower`` (the 95 % interval of the relative difference excludes 0, or lies beyond the
floor), ``equivalent`` (a two-one-sided test, TOST: the 90 % interval lies inside +-margin, so each one-sided test
rejects at 5 %) and ``undecided`` (neither). A significant difference wins over equivalence. Equivalence needs a
measured variance (repeated arms, or a measured run-to-run noise); a declared floor is a bound, not a variance,
and never yields ``equivalent``.

Three ways to judge B (candidate) against A (baseline), by what is known of the noise between runs:

:func:`welch` — samples ``a``, ``b`` (steady-window step times of one run per arm, ``unit="steps"``, or one mean
per run of repeated arms, ``unit="runs"``, where the arms' own run means give the between-run variance)::

    d          = mean(b) - mean(a)                     se = sqrt(var(a)/n_a + var(b)/n_b)
    95 % CI    = d +- t(0.975, df) * se                df = Welch-Satterthwaite
    relative   = d / mean(a), CI / mean(a)             (step time; > 0 means B is slower)
    tokens/s   = mean(a) / mean(b) - 1, CI mapped the same way (same tokens per step)
    verdict    = slower / faster when the relative CI lies beyond +-floor; equivalent (floor 0, a margin given)
                 when the 90 % CI lies inside +-margin; else undecided
    MDE        = floor + (t(0.975, df) + t(0.80, df)) * se / mean(a)   smallest effect found 80 % of the time

``floor`` is a declared run-to-run noise (hardware.run_to_run_noise, or compare's --noise-floor) when each arm
is a single run and nothing measured the noise: step times of one run say nothing about how much a second run of
the same config would differ, and on a shared machine whole runs shift. That is the fallback; the two below
measure it.

:func:`measured` — arms of any number of runs with a *measured* between-run standard deviation ``sigma_b``
(relative, from ``python -m moe_hydra.noise``): a run's mean is its config's true mean plus a run effect
(variance sigma_b^2) plus the average of its steps (variance s_w^2 / n, from the run's own steps), so the mean of
an arm of k runs has variance (sigma_b^2 + mean(s_w^2 / n)) / k. That variance is what a second run would differ
by; a floor added to a step-level interval double-counts the steps and ignores how well the noise is known.
The difference of the arm means is tested with Student's t, its degrees of freedom Satterthwaite's from the
noise estimate's (``noise_df``) and the steps' (n - 1 per run).

:func:`run_noise` — the noise itself, from repeated runs of one config: a one-way random-effects ANOVA with the
runs as groups (Searle, Casella and McCulloch, *Variance Components*, ch. 3): MSB, MSW and, for unequal steps per
run, n0 = (N - sum n_i^2 / N) / (k - 1); sigma_w^2 = MSW, sigma_b^2 = max(0, (MSB - MSW) / n0); its 95 % interval
the modified large-sample (MLS) interval of Ting, Burdick, Graybill and Jeyaratnam (1990) for a difference of
expected mean squares (Burdick and Graybill, *Confidence Intervals on Variance Components*, 1992, sec. 3.3),
truncated at 0; its degrees of freedom Satterthwaite's. ``run_to_run_noise`` = sigma_b / grand mean. Runs of
several configs (arms) pool their between-run and within-run sums of squares, runs nested in arms.

:func:`sequential_looks` — repeat=auto's group-sequential test: looks after each round of one run per arm, up
to ``max_repeats`` runs per arm; the difference is tested two-sided and equivalence by TOST, each against
Lan-DeMets O'Brien-Fleming-type alpha spending, alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) at information
fraction t per side (alpha / 2 a side for the two-sided test; Lan and DeMets 1983, Biometrika 70:659). With a
known variance the boundaries come from the recursive numerical integration of Armitage, McPherson and Rowe (1969)
(:func:`spending_bounds`); the variance here is estimated — pooled from the arms' own run means (df = runs - 2)
and, when given, the measured noise (its df) — so each look's t boundary spends its share of alpha on simulated
null paths of that very statistic (:func:`t_bounds`, fixed seed): turning the z boundaries into t at their
nominal levels would give 5.5 % instead of 5 %. Without a measured noise the first look is the second round.
Looking after every round keeps the false-verdict rate at alpha; stopping for equivalence (or for a difference)
only lowers the other error. :func:`simulate` measures both rates.

Futility (``Design.futility``, a loop that only wants "faster": tune's retune): an interim look stops the test
when B's gain is ruled out as large as ``futility`` — the one-sided upper (1 - :data:`FUTILITY_BETA`) t bound of
the gain below it. The stop is non-binding (a look that would have gone on to "faster" is only given up), so the
false-"faster" rate stays at or below alpha; what it costs is power near the futility gain, which
:func:`simulate` measures (Jennison and Turnbull, *Group Sequential Methods*, 2000, ch. 10 on non-binding futility).

Welch's test is chosen over a bootstrap because arms have few samples (a 10-step window, a handful of
repeats), where percentile bootstraps are too narrow. Step times within one run are not independent (drift,
shared-machine noise): with one run per arm and no measured noise the verdict covers within-run noise only,
beyond the declared floor, and says so. Warmup steps never enter.

scipy gives the distributions: Student's t and the normal through ``scipy.special`` (stdtr, stdtrit, ndtr,
ndtri: the functions ``scipy.stats.t`` and ``norm`` call, without their per-call overhead; Welch's interval equals
``scipy.stats.ttest_ind(b, a, equal_var=False).confidence_interval()``, which tests/test_compare.py checks), chi2
and F from ``scipy.stats``, brentq from ``scipy.optimize``; scipy and numpy are imported inside the functions that
use them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

FASTER, SLOWER, EQUIVALENT, UNDECIDED = "faster", "slower", "equivalent", "undecided"
# The equivalence margin a performance engineer accepts without asking: +-5 %, as Megatron-Bridge's performance CI
# (compare.equivalence). Declared, never derived from the noise: a margin that grows with the noise would make a
# noisy machine call everything equivalent.
EQUIVALENCE = 0.05
# A futility stop's one-sided level: the gain it rules out lies above the (1 - beta) upper bound of the measured one.
FUTILITY_BETA = 0.2
POWER = 0.80  # the power the runs_needed estimates plan for
SAME = UNDECIDED  # the name of "neither faster nor slower" before equivalence existed (layout screening's ties)
VERDICTS = (FASTER, SLOWER, EQUIVALENT, UNDECIDED)
ALPHA = 0.05  # the false-verdict rate of every test here: 95 % intervals, TOST at 5 % (its 90 % interval)


@dataclass(frozen=True)
class Effect:
    unit: str  # "steps" (one run per arm) or "runs" (one mean per run: repeated arms or a measured noise)
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
    margin: float | None = None  # the equivalence margin (relative) tested; None: no equivalence test
    eq_p_value: float | None = None  # TOST: the larger of the two one-sided p-values
    eq_ci_low: float | None = None  # the 90 % interval TOST reads
    eq_ci_high: float | None = None
    # undecided with a margin: runs per arm with which the TOST would show equivalence 80 % of the time if the
    # difference is what was measured (None: decided, not tested, or the difference is at the margin already)
    runs_needed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tokens(ma: float, delta: float) -> float:
    return ma / (ma + delta) - 1 if ma + delta > 0 else float("inf")


def _sf(x: float, df: float) -> float:
    """Student's t upper tail (the normal's when df is infinite)."""
    from scipy import special

    return float(special.stdtr(df, -x) if math.isfinite(df) else special.ndtr(-x))


def _ppf(p: float, df: float) -> float:
    """Student's t quantile (the normal's when df is infinite)."""
    from scipy import special

    return float(special.stdtrit(df, p) if math.isfinite(df) else special.ndtri(p))


def _judge(*, unit: str, n_a: int, n_b: int, ma: float, mb: float, se: float, df: float, floor: float,
           margin: float | None, confidence: float, power: float) -> Effect:
    """The verdict and intervals of d = mb - ma with standard error ``se`` on ``df`` degrees of freedom."""
    d = mb - ma
    tested = margin is not None and floor == 0
    if se == 0 or not math.isfinite(se):
        p, lo, hi, mde_t = (0.0 if d else 1.0), d, d, 0.0
        eq_lo = eq_hi = d
        eq_p = (0.0 if abs(d) < margin * ma else 1.0) if tested else None
    else:
        crit = _ppf(0.5 + confidence / 2, df)
        p = 2 * _sf(abs(d) / se, df)
        lo, hi = d - crit * se, d + crit * se
        mde_t = (crit + _ppf(power, df)) * se
        eq_crit = _ppf(confidence, df)  # TOST at the same alpha: the (1 - 2 alpha) interval
        eq_lo, eq_hi = d - eq_crit * se, d + eq_crit * se
        eq_p = max(_sf((d + margin * ma) / se, df), _sf((margin * ma - d) / se, df)) if tested else None
    verdict = SLOWER if lo / ma > floor else FASTER if hi / ma < -floor else UNDECIDED
    if verdict == UNDECIDED and eq_p is not None and eq_p < 1 - confidence:
        verdict = EQUIVALENT
    needed = (runs_needed(max(n_a, n_b), se, margin * ma - abs(d), confidence)
              if verdict == UNDECIDED and tested else None)
    return Effect(unit=unit, n_a=n_a, n_b=n_b, mean_a_ms=ma, mean_b_ms=mb, rel_step_time=d / ma, ci_low=lo / ma,
                  ci_high=hi / ma, rel_tokens_per_s=_tokens(ma, d), tokens_ci_low=_tokens(ma, hi),
                  tokens_ci_high=_tokens(ma, lo), p_value=p, df=df, mde=floor + mde_t / ma, floor=floor,
                  verdict=verdict, margin=margin if tested else None, eq_p_value=eq_p,
                  eq_ci_low=eq_lo / ma if tested else None, eq_ci_high=eq_hi / ma if tested else None,
                  runs_needed=needed)


def runs_needed(n: int, se: float, room: float, confidence: float = 0.95, power: float = POWER) -> int | None:
    """Runs per arm with which a TOST at ``1 - confidence`` a side shows equivalence with ``power``, given the
    standard error ``se`` of the difference at ``n`` per arm (it shrinks as 1/sqrt(runs)) and the ``room`` between
    the measured difference and the margin (margin - |d|, absolute): n ((z_conf + z_(1+power)/2) se / room)^2, normal
    quantiles; the power's quantile is the two-sided one, since near d = 0 both one-sided tests must reject (Chow,
    Shao and Wang, *Sample Size Calculations in Clinical Research*, sec. 3.2). None when there is no room: the
    measured difference is at or beyond the margin."""
    if room <= 0 or not math.isfinite(se):
        return None
    z = _ppf(confidence, math.inf) + _ppf((1 + power) / 2, math.inf)
    return max(n + 1, math.ceil(n * (z * se / room) ** 2))


def welch(a: list[float], b: list[float], unit: str, floor: float = 0.0, confidence: float = 0.95,
          power: float = 0.80, margin: float | None = None) -> Effect:
    """Compare candidate ``b`` with baseline ``a`` (Welch's t); ``margin``: also test equivalence within +-margin
    (relative; only without a floor).

    Raises:
        ValueError: when an arm has fewer than 2 samples.
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"each arm needs at least 2 samples, got {len(a)} and {len(b)}")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a), statistics.variance(b)
    if va == vb == 0:  # no spread: the t statistic is undefined here
        se, df = 0.0, float("inf")
    else:
        se = math.sqrt(va / len(a) + vb / len(b))
        df = _satterthwaite([(va / len(a), len(a) - 1), (vb / len(b), len(b) - 1)])  # Welch-Satterthwaite
    return _judge(unit=unit, n_a=len(a), n_b=len(b), ma=ma, mb=mb, se=se, df=df, floor=floor, margin=margin,
                  confidence=confidence, power=power)


@dataclass(frozen=True)
class RunStat:
    """One run, as the run-level tests read it: the mean of its steady window, and the variance of that mean
    that its steps alone explain (s_w^2 / n, steps taken as independent), with n steps."""

    mean: float
    within: float
    steps: int

    @classmethod
    def of(cls, steps: Sequence[float]) -> RunStat:
        n = len(steps)
        m = math.fsum(steps) / n
        return cls(m, math.fsum((x - m) ** 2 for x in steps) / (n - 1) / n if n > 1 else 0.0, n)


def _satterthwaite(parts: list[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of independent variance estimates, each (estimate, its df)."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if v > 0 and df and math.isfinite(df))
    return total * total / denom if denom > 0 else float("inf")


def measured(a: Sequence[RunStat], b: Sequence[RunStat], noise: float, noise_df: float | None,
             confidence: float = 0.95, power: float = 0.80, margin: float | None = None,
             step_noise: float | None = None, step_df: float | None = None) -> Effect:
    """B against A, arms of any number of runs, with the measured between-run noise ``noise`` (relative sigma_b,
    its degrees of freedom ``noise_df``; None: known exactly) and step-to-step noise ``step_noise`` (relative
    sigma_w, its ``step_df``): a run's mean has variance sigma_b^2 + max(its own s^2 / n, sigma_w^2 / n), sigma_b and
    sigma_w scaled by the arm's mean, and an arm's mean of k runs a k-th of that (docs above). The steps' part is
    the larger of the run's own and the measured one, so a run whose steps happen to be calm does not make its
    mean look surer than the noise measurement says. Unit: runs.

    Raises:
        ValueError: an arm without runs.
    """
    if not a or not b:
        raise ValueError(f"each arm needs a run, got {len(a)} and {len(b)}")
    parts, means, between = [], [], 0.0
    for arm in (a, b):
        k, m = len(arm), statistics.fmean(r.mean for r in arm)
        means.append(m)
        between += (noise * m) ** 2 / k
        for r in arm:
            measured_w = (step_noise * m) ** 2 / max(r.steps, 1) if step_noise is not None else 0.0
            if r.within >= measured_w:
                parts.append((r.within / k**2, max(r.steps - 1, 1)))
            else:
                parts.append((measured_w / k**2, step_df if step_df is not None else float("inf")))
    parts.append((between, noise_df if noise_df is not None else float("inf")))
    df = _satterthwaite(parts)
    var = sum(v for v, _ in parts)
    return _judge(unit="runs", n_a=len(a), n_b=len(b), ma=means[0], mb=means[1], se=math.sqrt(var), df=max(df, 1.0),
                  floor=0.0, margin=margin, confidence=confidence, power=power)


def mean_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of the mean of ``xs`` (at least 2 samples)."""
    from scipy import stats as st

    mean = statistics.fmean(xs)
    if statistics.stdev(xs) == 0:
        return mean, mean, mean
    low, high = st.t.interval(confidence, len(xs) - 1, loc=mean, scale=st.sem(xs))
    return mean, float(low), float(high)


# --------------------------------------------------------------------------- run-to-run noise

@dataclass(frozen=True)
class Noise:
    """The variance components of step times: between runs (sigma_b^2) and between steps of a run (sigma_w^2)."""

    runs: int
    steps: int  # all steps of all runs
    arms: int  # configs the runs belong to (1: repeats of one config)
    grand_mean: float  # ms, every step weighing the same
    msb: float
    msw: float
    n0: float  # the effective steps per run
    df_between: int  # runs - arms
    df_within: int  # steps - runs
    var_between: float  # sigma_b^2, truncated at 0
    var_within: float  # sigma_w^2
    df: float  # Satterthwaite's degrees of freedom of var_between
    var_low: float  # MLS interval of var_between
    var_high: float
    confidence: float

    @property
    def relative(self) -> float:
        """run_to_run_noise: sigma_b / grand mean."""
        return math.sqrt(self.var_between) / self.grand_mean

    @property
    def interval(self) -> tuple[float, float]:
        return math.sqrt(self.var_low) / self.grand_mean, math.sqrt(self.var_high) / self.grand_mean

    @property
    def step_noise(self) -> float:
        """sigma_w / grand mean: how much one step of a run varies."""
        return math.sqrt(self.var_within) / self.grand_mean

    @property
    def run_mean_noise(self) -> float:
        """The standard deviation of one run's mean, relative: sqrt(sigma_b^2 + sigma_w^2 / n0) / grand mean."""
        return math.sqrt(self.var_between + self.var_within / self.n0) / self.grand_mean

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "relative": self.relative, "interval": list(self.interval),
                "step_noise": self.step_noise, "run_mean_noise": self.run_mean_noise}


def mls_interval(ms1: float, df1: float, ms2: float, df2: float, c: float, confidence: float = 0.95
                 ) -> tuple[float, float]:
    """The modified large-sample interval of theta = c (E[MS1] - E[MS2]) (Ting et al. 1990), truncated at 0."""
    from scipy import stats as st

    a = (1 - confidence) / 2  # each side

    def f_inf(q: float, df: float) -> float:  # F(q; df, inf) = chi2(q; df) / df, q the upper tail
        return float(st.chi2.isf(q, df)) / df

    f_hi, f_lo = float(st.f.isf(a, df1, df2)), float(st.f.isf(1 - a, df1, df2))
    g1, h2 = 1 - 1 / f_inf(a, df1), 1 / f_inf(1 - a, df2) - 1
    h1, g2 = 1 / f_inf(1 - a, df1) - 1, 1 - 1 / f_inf(a, df2)
    g12 = ((f_hi - 1) ** 2 - g1**2 * f_hi**2 - h2**2) / f_hi
    h12 = ((1 - f_lo) ** 2 - h1**2 * f_lo**2 - g2**2) / f_lo
    theta = c * (ms1 - ms2)
    v_low = g1**2 * ms1**2 + h2**2 * ms2**2 + g12 * ms1 * ms2
    v_high = h1**2 * ms1**2 + g2**2 * ms2**2 + h12 * ms1 * ms2
    return max(0.0, theta - c * math.sqrt(max(v_low, 0.0))), max(0.0, theta + c * math.sqrt(max(v_high, 0.0)))


def run_noise(arms: Sequence[Sequence[Sequence[float]]], confidence: float = 0.95) -> Noise:
    """The variance components of ``arms`` (configs) -> runs -> steady-window step times (docs above).

    Raises:
        ValueError: fewer than two runs of one config, or no step-to-step degrees of freedom.
    """
    runs = [(list(map(float, r)), ai) for ai, arm in enumerate(arms) for r in arm if len(r)]
    k, n_arms = len(runs), len({ai for _, ai in runs})
    steps = sum(len(r) for r, _ in runs)
    df1, df2 = k - n_arms, steps - k
    if df1 < 1:
        raise ValueError(f"{k} run(s) of {n_arms} config(s): the between-run variance needs two runs of one config")
    if df2 < 1:
        raise ValueError("every run has one step: the step-to-step variance needs two steps in a run")
    grand = statistics.fmean(x for r, _ in runs for x in r)
    ssb = ssw = 0.0
    sum_sq = 0.0  # sum over arms of sum n_i^2 / N_arm
    for ai in {ai for _, ai in runs}:
        members = [r for r, i in runs if i == ai]
        n_arm = sum(len(r) for r in members)
        arm_mean = sum(sum(r) for r in members) / n_arm
        sum_sq += sum(len(r) ** 2 for r in members) / n_arm
        for r in members:
            m = statistics.fmean(r)
            ssb += len(r) * (m - arm_mean) ** 2
            ssw += sum((x - m) ** 2 for x in r)
    msb, msw = ssb / df1, ssw / df2
    n0 = (steps - sum_sq) / df1
    var_b = max(0.0, (msb - msw) / n0)
    df = ((msb - msw) ** 2 / (msb**2 / df1 + msw**2 / df2)) if var_b > 0 else 0.0
    low, high = mls_interval(msb, df1, msw, df2, 1 / n0, confidence)
    return Noise(runs=k, steps=steps, arms=n_arms, grand_mean=grand, msb=msb, msw=msw, n0=n0, df_between=df1,
                 df_within=df2, var_between=var_b, var_within=msw, df=df, var_low=low, var_high=high,
                 confidence=confidence)


# --------------------------------------------------------------------------- group-sequential tests

def spent(t: float, alpha: float = ALPHA) -> float:
    """Lan-DeMets O'Brien-Fleming-type alpha spending of one side at level ``alpha``:
    alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) (a two-sided test spends alpha / 2 on each side, as gsDesign's
    sfLDOF and ldbounds do: K = 5 equally spaced looks at 5 % give 4.877, 3.357, 2.680, 2.290, 2.031)."""
    from scipy import special

    if t <= 0:
        return 0.0
    if t >= 1:
        return alpha
    return float(2 * special.ndtr(special.ndtri(alpha / 2) / math.sqrt(t)))


GRID = 601  # points of the numerical integration (odd: Simpson's rule)


def _exit_probability(c: float, t: float, grid: Any, mass: Any, sd: float, sides: int) -> float:
    """P(the test stops at a look at fraction ``t`` with z bound ``c``, having continued so far): the continuation
    density's ``mass`` on ``grid`` (of S = Z sqrt(t) at the look before) moved on by N(0, sd^2)."""
    import numpy as np
    from scipy import special

    b = c * math.sqrt(t)
    p = float(np.sum(mass * special.ndtr((grid - b) / sd)))
    return p + (float(np.sum(mass * special.ndtr((-b - grid) / sd))) if sides == 2 else 0.0)


@functools.lru_cache(maxsize=512)
def _bounds(fractions: tuple[float, ...], alpha: float, sides: int) -> tuple[float, ...]:
    import numpy as np
    from scipy import optimize, special

    out: list[float] = []
    grid = mass = None  # the continuation density of S_k = Z_k sqrt(t_k) on the grid, times Simpson's weights
    prev_t, prev_spent = 0.0, 0.0
    level = alpha / sides  # two-sided: alpha / 2 spent on each side
    for t in fractions:
        target = sides * (spent(t, level) - prev_spent)
        dt = t - prev_t
        if target <= 1e-15 or dt <= 0:
            out.append(math.inf)
            continue
        sd = math.sqrt(dt)
        if grid is None:  # the first look: S_1 ~ N(0, t_1)
            c = float(-special.ndtri(target / sides))
        else:
            low = 0.0 if sides == 2 else -10.0
            if _exit_probability(low, t, grid, mass, sd, sides) <= target:
                c = low
            else:
                args = (t, grid, mass, sd, sides)
                c = float(optimize.brentq(lambda c, args=args, target=target: _exit_probability(c, *args) - target,
                                          low, 40.0, xtol=1e-10))
        out.append(c)
        b = c * math.sqrt(t)
        lo = -b if sides == 2 else -10 * math.sqrt(t)  # one-sided: the continuation region is S_k < b
        new_grid = np.linspace(lo, b, GRID)
        if grid is None:
            density = np.exp(-new_grid**2 / (2 * t)) / math.sqrt(2 * math.pi * t)
        else:
            z = (new_grid[:, None] - grid[None, :]) / sd
            density = (mass[None, :] * np.exp(-z * z / 2)).sum(axis=1) / (sd * math.sqrt(2 * math.pi))
        weights = np.full(GRID, 2.0)
        weights[1::2], weights[0], weights[-1] = 4.0, 1.0, 1.0
        grid, mass = new_grid, density * weights * (b - lo) / (GRID - 1) / 3
        prev_t, prev_spent = t, spent(t, level)
    return tuple(out)


def spending_bounds(fractions: Sequence[float], alpha: float = ALPHA, sides: int = 2) -> list[float]:
    """z boundaries of a group-sequential test at information fractions ``fractions`` (increasing, the last <= 1),
    spending ``alpha`` by :func:`spent`: two-sided (reject when |Z_k| >= c_k) or one-sided (Z_k >= c_k). Each bound
    depends only on the looks up to it, so a look's bound never changes when later looks come."""
    return list(_bounds(tuple(round(float(f), 12) for f in fractions), float(alpha), int(sides)))


@dataclass(frozen=True)
class Design:
    """repeat=auto's design: at most ``max_repeats`` runs per arm, a false-verdict rate ``alpha``, equivalence
    within +-``margin`` (relative; None: not tested), and a measured between-run ``noise`` (relative sigma_b,
    its ``noise_df``) pooled into the variance (None: the arms' own runs alone)."""

    max_repeats: int = 8
    alpha: float = ALPHA
    margin: float | None = None
    noise: float | None = None
    noise_df: float | None = None
    step_noise: float | None = None  # the measured sigma_w, relative (a floor under the runs' own step variance)
    futility: float | None = None  # the smallest gain worth finding (relative): an interim look ruling it out stops

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Look:
    look: int  # the round after which it was taken (1-based)
    n_a: int
    n_b: int
    fraction: float  # information fraction
    mean_a_ms: float
    mean_b_ms: float
    rel_step_time: float
    ci_low: float  # the repeated 95 % confidence interval (relative): valid whenever the test stops
    ci_high: float
    t: float
    df: float
    bound: float  # |t| at or beyond it: faster / slower
    eq_bound: float | None  # both TOST statistics at or beyond it: equivalent
    verdict: str
    alpha_spent: float = 0.0
    notes: list[str] = field(default_factory=list)
    # the interval the equivalence test read (d +- eq_bound se, relative): inside +-margin is equivalent
    eq_ci_low: float | None = None
    eq_ci_high: float | None = None
    # undecided at the last round with a margin: about how many runs per arm would show equivalence (runs_needed)
    runs_needed: int | None = None
    # stopped early: B's gain of Design.futility ruled out, gain_bound the one-sided upper bound of the gain
    futile: bool = False
    gain_bound: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _t_bound(z: float, df: float, sides: int) -> float:
    """The t boundary at the nominal level of the z boundary ``z`` (two-sided or one-sided)."""
    from scipy import special

    if not math.isfinite(z):
        return math.inf
    p = float(special.ndtr(-z))  # one tail
    return float(-special.stdtrit(df, p)) if math.isfinite(df) else z


MC_PATHS = 50_000  # simulated null paths that calibrate the t boundaries (each look's share of alpha)
MC_MIN_PATHS = 50  # a look that spends fewer paths' worth keeps the z boundary turned into t at its nominal level
MC_MAX_RUNS = 32  # runs per arm beyond which the t boundaries are the z ones turned into t (df large: they agree)
MC_SEED = 20240519
_MC: dict[tuple, tuple[tuple[float, ...], Any]] = {}  # (df0, alpha, sides, looks) -> (bounds, paths still going)


@functools.lru_cache(maxsize=2 * MC_MAX_RUNS + 2)
def _column(arm: int, j: int):
    """Run j of arm ``arm`` on every simulated path: its own stream, so a boundary never depends on how many runs
    an earlier call asked for (the same looks give the same boundaries in every process)."""
    import numpy as np

    return np.random.default_rng([MC_SEED, arm, j]).standard_normal(MC_PATHS)


@functools.lru_cache(maxsize=64)
def _prior(df0: float):
    """The prior variance estimate on every simulated path: chi-square on ``df0`` df over df0 (1 when known)."""
    import numpy as np

    if 0 < df0 < math.inf:
        return np.random.default_rng([MC_SEED, 2, int(df0)]).chisquare(df0, MC_PATHS) / df0
    return np.ones(MC_PATHS)


def t_bounds(looks: Sequence[tuple[int, int, float]], df0: float, alpha: float = ALPHA, sides: int = 2
             ) -> list[float]:
    """t boundaries of the group-sequential test at ``looks`` ((runs of A, runs of B, information fraction) each)
    with the per-run variance pooled from the arms' runs and a prior estimate on ``df0`` degrees of freedom.

    Each look's boundary spends what :func:`spent` allots it, computed on simulated null paths of the very
    statistic the test reads (run means normal, the pooled variance's chi-square parts), so looking after every
    round keeps the rate at alpha with estimated variances too. Converting the z boundaries of
    :func:`spending_bounds` into t at the same nominal level overshoots (5.5 % instead of 5 % with 2 to 14 df);
    it is kept where a look spends too little to simulate (the first looks, which hardly ever stop) and beyond
    :data:`MC_MAX_RUNS` runs. Deterministic: the paths come from a fixed seed."""
    import numpy as np

    df0 = float(math.floor(max(df0, 0.0))) if df0 < 1e5 else math.inf  # rounded down: a touch conservative
    key0 = (df0, round(alpha, 12), sides)
    looks = tuple((int(na), int(nb), round(float(t), 12)) for na, nb, t in looks)
    if (*key0, looks) in _MC:
        return list(_MC[(*key0, looks)][0])
    done = 0
    bounds: tuple[float, ...] = ()
    alive = None
    for j in range(len(looks) - 1, 0, -1):  # the longest prefix already computed
        if (*key0, looks[:j]) in _MC:
            bounds, packed = _MC[(*key0, looks[:j])]
            alive = np.unpackbits(packed, count=MC_PATHS).astype(bool) if packed is not None else None
            done = j
            break
    z = spending_bounds([t for _, _, t in looks], alpha, sides)
    if alive is None and done == 0:
        alive = np.ones(MC_PATHS, bool)
    level = alpha / sides
    v0 = _prior(df0)
    for j in range(done, len(looks)):
        na, nb, t = looks[j]
        prev = looks[j - 1][2] if j else 0.0
        target = sides * (spent(t, level) - spent(prev, level))
        df = (df0 if math.isfinite(df0) else 1e9) + na + nb - 2
        if alive is None or max(na, nb) > MC_MAX_RUNS:
            bounds += (_t_bound(z[j], df, sides),)
            alive = None
            _MC[(*key0, looks[:j + 1])] = (bounds, None)
            continue
        a = np.stack([_column(0, i) for i in range(na)], axis=1)
        b = np.stack([_column(1, i) for i in range(nb)], axis=1)
        ma, mb = a.mean(axis=1), b.mean(axis=1)
        ss = ((a - ma[:, None]) ** 2).sum(axis=1) + ((b - mb[:, None]) ** 2).sum(axis=1)
        pooled = (df0 * v0 + ss) / (df0 + na + nb - 2) if math.isfinite(df0) else v0
        stat = (mb - ma) / np.sqrt(pooled * (1 / na + 1 / nb))
        if sides == 2:
            stat = np.abs(stat)
        m = round(target * MC_PATHS)
        if m < MC_MIN_PATHS:
            c = _t_bound(z[j], df, sides)
        else:
            going = np.sort(stat[alive])[::-1]
            c = float(going[m - 1]) if m <= len(going) else 0.0
        alive = alive & (stat < c)
        bounds += (c,)
        if len(_MC) > 2048:
            _MC.clear()
        _MC[(*key0, looks[:j + 1])] = (bounds, np.packbits(alive))
    return list(bounds)


def sequential_looks(a: Sequence[RunStat | None], b: Sequence[RunStat | None], design: Design) -> list[Look]:
    """The looks of repeat=auto after each round so far: ``a[r]``, ``b[r]`` the runs of round r (None: the run
    failed). Stops at the first look that decides (its verdict faster, slower or equivalent); the last look's
    verdict is the test's ("undecided" until the last round, ``design.max_repeats``). Rounds without a usable
    test (no variance yet) are no look and spend nothing."""
    looks: list[Look] = []
    fractions: list[tuple[int, int, float]] = []
    last_fraction = 0.0
    big_k = design.max_repeats
    for r in range(1, min(len(a), len(b)) + 1):
        xa = [x for x in a[:r] if x is not None]
        xb = [x for x in b[:r] if x is not None]
        final = r >= big_k
        if not xa or not xb:
            continue
        n_a, n_b = len(xa), len(xb)
        ma, mb = statistics.fmean(x.mean for x in xa), statistics.fmean(x.mean for x in xb)
        ss = sum((x.mean - ma) ** 2 for x in xa) + sum((x.mean - mb) ** 2 for x in xb)
        df_own = n_a + n_b - 2
        df0, v0 = 0.0, 0.0
        if design.noise is not None:
            m = (ma + mb) / 2
            w = statistics.fmean(max(x.within, (design.step_noise or 0.0) ** 2 * m * m / max(x.steps, 1))
                                 for x in (*xa, *xb))
            v0 = (design.noise * m) ** 2 + w
            df0 = float(design.noise_df) if design.noise_df is not None else 1e6
        df = df0 + df_own
        if df <= 0:
            continue
        var_run = (df0 * v0 + ss) / df
        fraction = 1.0 if final else min(1.0, (1 / (1 / n_a + 1 / n_b)) / (big_k / 2))
        if fraction <= last_fraction:
            continue
        fractions.append((n_a, n_b, fraction))
        last_fraction = fraction
        crit = t_bounds(fractions, df0, design.alpha, 2)[-1]
        se = math.sqrt(var_run * (1 / n_a + 1 / n_b))
        d = mb - ma
        t = d / se if se > 0 else (math.inf if d > 0 else -math.inf if d < 0 else 0.0)
        verdict = SLOWER if t >= crit else FASTER if t <= -crit else UNDECIDED
        eq_crit = None
        if design.margin is not None:
            eq_crit = t_bounds(fractions, df0, design.alpha, 1)[-1]
            m = design.margin * ma
            inside = (d + m) / se >= eq_crit and (m - d) / se >= eq_crit if se > 0 else abs(d) < m
            if verdict == UNDECIDED and inside:
                verdict = EQUIVALENT
        half = crit * se if math.isfinite(crit) else math.inf
        eq_half = eq_crit * se if eq_crit is not None and math.isfinite(eq_crit) else None
        needed = (runs_needed(max(n_a, n_b), se, design.margin * ma - abs(d), 1 - design.alpha)
                  if final and verdict == UNDECIDED and design.margin is not None else None)
        gain_bound = futile = None
        if design.futility is not None and verdict == UNDECIDED and not final and se > 0:
            from scipy import special

            gain_bound = (-d + float(special.stdtrit(df, 1 - FUTILITY_BETA)) * se) / ma
            futile = gain_bound < design.futility
        looks.append(Look(look=r, n_a=n_a, n_b=n_b, fraction=fraction, mean_a_ms=ma, mean_b_ms=mb,
                          rel_step_time=d / ma, ci_low=(d - half) / ma, ci_high=(d + half) / ma, t=t, df=df,
                          bound=crit, eq_bound=eq_crit, verdict=verdict, alpha_spent=spent(fraction, design.alpha),
                          eq_ci_low=(d - eq_half) / ma if eq_half is not None else None,
                          eq_ci_high=(d + eq_half) / ma if eq_half is not None else None, runs_needed=needed,
                          futile=bool(futile), gain_bound=gain_bound))
        if verdict != UNDECIDED or final or futile:
            break
    return looks


def decided(looks: Sequence[Look], design: Design) -> bool:
    """Whether the looks end the test: a verdict other than undecided, a futility stop, or the last round's look."""
    return bool(looks) and (looks[-1].verdict != UNDECIDED or looks[-1].futile
                            or looks[-1].look >= design.max_repeats)


def simulate(effect: float, design: Design, sigma_b: float, sigma_w: float, steps: int, sims: int = 2000,
             seed: int = 0, prior_runs: int = 0, mean: float = 100.0) -> dict[str, Any]:
    """Operating characteristics of :func:`sequential_looks` on synthetic runs: step times mean x (1 + run effect +
    step noise), run effects N(0, sigma_b^2), steps N(0, sigma_w^2) (both relative), B's mean ``effect`` (relative)
    above A's. ``prior_runs`` > 0: every sequence first measures the noise from that many runs of A's config
    (:func:`run_noise`), as ``python -m moe_hydra.noise`` would, and pools it (``design.noise`` is then replaced).
    Returns the share of each verdict (and of futility stops, ``futile``), the runs per arm used (mean,
    distribution) and, per verdict, the share of campaigns that reached it within each number of runs per arm
    (``verdict_within``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    k = design.max_repeats
    verdicts = {v: 0 for v in VERDICTS}
    used = []
    futile = 0

    def runs(mu: float, count: int):
        shift = rng.normal(0.0, sigma_b, count)
        return mu * (1 + shift[:, None] + rng.normal(0.0, sigma_w, (count, steps)))

    def summarized(x) -> list[RunStat]:
        means, within = x.mean(axis=1), x.var(axis=1, ddof=1) / steps
        return [RunStat(float(m), float(w), steps) for m, w in zip(means, within)]

    for _ in range(sims):
        d = design
        if prior_runs:
            nz = run_noise([runs(mean, prior_runs).tolist()])
            d = replace(design, noise=nz.relative, noise_df=max(nz.df, 1.0), step_noise=nz.step_noise)
        a = summarized(runs(mean, k))
        b = summarized(runs(mean * (1 + effect), k))
        looks = sequential_looks(a, b, d)  # looks after each round, stopping at the first that decides
        verdict = looks[-1].verdict if looks else UNDECIDED
        verdicts[verdict] += 1
        futile += bool(looks) and looks[-1].futile
        used.append((looks[-1].look if looks else k, verdict))
    share = {v: n / sims for v, n in verdicts.items()}
    runs = [n for n, _ in used]
    return {"effect": effect, "sims": sims, "verdicts": share, "futile": futile / sims,
            "runs_per_arm_mean": statistics.fmean(runs),
            "runs_per_arm": {n: runs.count(n) / sims for n in range(1, k + 1)},
            "verdict_within": {v: {n: sum(1 for m, w in used if w == v and m <= n) / sims for n in range(1, k + 1)}
                               for v in VERDICTS},
            "design": design.as_dict(), "sigma_b": sigma_b, "sigma_w": sigma_w, "steps": steps,
            "prior_runs": prior_runs}
