"""Run-to-run noise: measured from repeated runs of one config (``noise.json``), and the noise floor compare uses.

    python -m moe_hydra.noise DIR [DIR ...] [--out DIR] [--pool]

The runs (every complete ``results.json`` under the directories, each counted once, as compare reads them) must be
repeats of one config (one contract; ``--pool`` takes several configs, the runs nested in them). Their
steady-window step times give the between-run variance apart from the step-to-step variance: a one-way
random-effects ANOVA with the runs as groups, its interval the modified large-sample one
(:func:`moe_hydra.core.stats.run_noise`). ``run_to_run_noise`` is sigma_between / grand mean, relative.

``noise.json`` (``noise_version`` 1): ``source`` "measured", ``run_to_run_noise`` and its ``interval`` (95 %),
``df`` (Satterthwaite's, of sigma_between^2), ``step_noise`` (sigma_within / mean), ``run_mean_noise`` (one run
mean's standard deviation, sqrt(sigma_b^2 + sigma_w^2 / n) / mean), ``runs``, ``steps``, ``steps_per_run``,
``grand_mean_ms``, ``run_means_ms``, ``components`` (MSB, MSW, n0, their df, the variances in ms^2),
``hardware`` (the runs' contract section), ``contract`` (``contract_hash``, ``contract_full_hash``, ``digest``),
``declared`` (their hardware.run_to_run_noise), ``dirs``, ``measured_at``.

The noise floor compare uses for arms of one run (:func:`floor_for`), in this order: the arms' own repeats (not
here: compare's Welch on run means); ``--noise FILE``; ``compare.noise_file`` as the runs recorded it
(``.hydra/config.yaml``: the command line or the site file, ``MOE_HYDRA_SITE``) or, for runs that predate it, the
site file's own; else the declared ``hardware.run_to_run_noise``, labelled "declared". A relative
``compare.noise_file`` is taken relative to ``$MOE_HYDRA_SITE`` when that is set, else the current directory.

Reads files only.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.analysis import figures
from moe_hydra.analysis.runs import recorded
from moe_hydra.core import contract as contracts
from moe_hydra.core import io, stats
from moe_hydra.core.errors import Refused
from moe_hydra.core.schema import site_dir, site_settings

NOISE_FILE = "noise.json"
NOISE_VERSION = 1
MEASURED, REPEATS, DECLARED, OPTION = "measured", "repeats", "declared", "--noise-floor"
CONFIG_KEY = "compare.noise_file"

Warn = Callable[[str], None]


@dataclass(frozen=True)
class Floor:
    """The run-to-run noise a comparison used: ``value`` (relative sigma_between, or the declared floor) and where it
    came from (``source``: measured, repeats, declared, --noise-floor)."""

    value: float
    source: str
    file: str | None = None
    interval: tuple[float, float] | None = None
    df: float | None = None
    step_noise: float | None = None
    step_df: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        if self.interval is not None:
            out["interval"] = list(self.interval)
        return {**out, **self.extra}

    def label(self) -> str:
        """"1.9% measured [1.1%, 4.0%]", "20% declared"."""
        text = f"{self.value:.1%} {self.source}"
        return text + (f" [{self.interval[0]:.1%}, {self.interval[1]:.1%}]" if self.interval else "")


# --------------------------------------------------------------------------- measuring

def _window(run: Any) -> list[float]:
    return list(run.window_steps)


def measure(groups: Sequence[Sequence[Any]], dirs: Sequence[Path], relative: bool = False
            ) -> tuple[stats.Noise, dict[str, Any]]:
    """The noise of ``groups`` (configs -> runs, objects with ``window_steps``, ``results`` and ``path``, as
    :func:`moe_hydra.analysis.runs.load` gives them) and the ``noise.json`` record. ``relative``: configs of
    different speeds pooled as relative noise (each config's step times scaled to the grand mean, so a slow config's
    larger absolute spread does not count for more than its share; ``scaled`` in the record says so).

    Raises:
        Refused: fewer than two runs of one config, or runs of one step.
    """
    steps = [[_window(r) for r in g] for g in groups]
    if relative:
        means = [statistics.fmean(x for w in g for x in w) for g in steps]
        grand = statistics.fmean(means)
        steps = [[[x * grand / m for x in w] for w in g] for g, m in zip(steps, means)]
    try:
        noise = stats.run_noise(steps)
    except ValueError as e:
        raise Refused(str(e)) from None
    runs = [r for g in groups for r in g]
    first = runs[0].results
    windows = {tuple(r.results.get("window") or ()) for r in runs}
    declared = {((r.results["contract"].get("hardware") or {}).get("run_to_run_noise")) for r in runs}
    lo, hi = noise.interval
    record = {
        "noise_version": NOISE_VERSION,
        "source": MEASURED,
        "run_to_run_noise": noise.relative,
        "interval": [lo, hi],
        "confidence": noise.confidence,
        "df": noise.df,
        "step_noise": noise.step_noise,
        "run_mean_noise": noise.run_mean_noise,
        "runs": noise.runs,
        "steps": noise.steps,
        "steps_per_run": noise.n0,
        "configs": noise.arms,
        "window": list(windows.pop()) if len(windows) == 1 else None,
        "grand_mean_ms": noise.grand_mean,
        "run_means_ms": [statistics.fmean(w) for g in steps for w in g],
        "scaled": "each config's step times to the grand mean (relative noise pooled)" if relative else None,
        "components": {"msb": noise.msb, "msw": noise.msw, "n0": noise.n0, "df_between": noise.df_between,
                       "df_within": noise.df_within, "var_between_ms2": noise.var_between,
                       "var_within_ms2": noise.var_within},
        "estimator": "one-way random-effects ANOVA, runs as groups (nested in configs): sigma_b^2 = max(0, (MSB - "
                     "MSW) / n0), sigma_w^2 = MSW; interval: modified large-sample (Ting et al. 1990); df: "
                     "Satterthwaite",
        "hardware": first["contract"].get("hardware"),
        "contract": {"contract_hash": first.get("contract_hash"), "contract_full_hash": first.get("contract_full_hash"),
                     "digest": contracts.digest(first["contract"])} if noise.arms == 1 else None,
        "declared": declared.pop() if len(declared) == 1 else sorted(map(str, declared)),
        "dirs": [str(d) for d in dirs],
        "run_dirs": [str(r.path) for r in runs],
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return noise, record


def summary(record: dict[str, Any]) -> str:
    lo, hi = record["interval"]
    return (f"run-to-run noise {record['run_to_run_noise']:.2%} [{lo:.2%}, {hi:.2%}] (sigma_between / mean, 95% "
            f"interval; {record['runs']} runs, {record['steps']} steps, df {record['df']:.1f}); steps "
            f"{record['step_noise']:.2%} (sigma_within / mean); one run's mean {record['run_mean_noise']:.2%}; "
            f"declared hardware.run_to_run_noise {record['declared']}")


# --------------------------------------------------------------------------- reading noise.json

def plot(record: dict[str, Any], path: Path) -> None:
    """noise.png beside noise.json: each run's steady-window mean in run order against the grand mean and one
    sigma_between either side; and the split of one run's mean's spread — sigma_between (run to run) against what
    the steps within a run alone would give a mean of n0 steps (sigma_within / sqrt(n0)). The figures drawn are in
    the PNG's ``Description`` text (JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means, grand = record["run_means_ms"], record["grand_mean_ms"]
    c = record["components"]
    between, within = math.sqrt(c["var_between_ms2"]), math.sqrt(c["var_within_ms2"] / c["n0"])
    fig, (runs_ax, split_ax) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
    runs_ax.plot(range(1, len(means) + 1), means, "o")
    runs_ax.axhline(grand, color="black", linewidth=1)
    runs_ax.axhspan(grand - between, grand + between, color="grey", alpha=0.25, linewidth=0)
    runs_ax.set_xlabel("run")
    runs_ax.set_ylabel("steady-window mean step (ms)")
    lo, hi = record["interval"]
    runs_ax.set_title(f"run-to-run noise {record['run_to_run_noise']:.2%} [{lo:.2%}, {hi:.2%}], "
                      f"{record['runs']} runs")
    split_ax.bar(["run to run\n(sigma_between)", "within a run\n(sigma_within / sqrt(n0))"], [between, within],
                 color=["tab:red", "tab:blue"])
    split_ax.set_ylabel("spread of one run's mean (ms)")
    split_ax.set_title(f"n0 = {c['n0']:.0f} steps a run")
    fig.tight_layout()
    drawn = {"run_means_ms": means, "grand_mean_ms": grand, "sigma_between_ms": between,
             "sigma_within_of_a_mean_ms": within, "run_to_run_noise": record["run_to_run_noise"], "interval": [lo, hi]}
    figures.save(fig, path, "noise", drawn)


def load(path: Path) -> dict[str, Any]:
    """A noise file, checked: source measured, run_to_run_noise a fraction in [0, 1), df positive.

    Raises:
        Refused: missing, not JSON, or against those.
    """
    if not Path(path).exists():
        raise Refused(f"{path}: no such noise file (python -m moe_hydra.noise DIR writes one)")
    text = io.read_named(path, "the noise file")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise Refused(f"{path}: not JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise Refused(f"{path}: not a JSON object")
    value = data.get("run_to_run_noise")
    if data.get("source") != MEASURED:
        raise Refused(f"{path}: source is {data.get('source')!r}, want \"measured\"")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise Refused(f"{path}: run_to_run_noise is {value!r} (want a fraction in [0, 1))")
    df = data.get("df")
    if df is not None and (not isinstance(df, (int, float)) or isinstance(df, bool) or not df >= 0):
        raise Refused(f"{path}: df is {df!r} (want a number >= 0)")
    interval = data.get("interval")
    if interval is not None and not (isinstance(interval, list) and len(interval) == 2 and all(
            isinstance(x, (int, float)) and math.isfinite(x) for x in interval)):
        raise Refused(f"{path}: interval is {interval!r} (want [low, high])")
    return data


def floor_of(data: dict[str, Any], path: Path) -> Floor:
    """The measured noise of a loaded noise file, as a :class:`Floor`. Its df: the file's (Satterthwaite's), else
    runs - 1; at least 1 (a zero estimate says little about the next run)."""
    df = data.get("df")
    runs = data.get("runs")
    if not df:
        df = max(float(runs) - 1, 1.0) if isinstance(runs, (int, float)) else 1.0
    interval = data.get("interval")
    step = data.get("step_noise")
    step_df = (data.get("components") or {}).get("df_within") if isinstance(data.get("components"), dict) else None
    return Floor(value=float(data["run_to_run_noise"]), source=MEASURED, file=str(path),
                 interval=tuple(interval) if interval else None, df=max(float(df), 1.0),
                 step_noise=float(step) if isinstance(step, (int, float)) and math.isfinite(step) and step >= 0
                 else None,
                 step_df=float(step_df) if isinstance(step_df, (int, float)) and step_df > 0 else None,
                 extra={"runs": runs} if isinstance(runs, int) else {})


def resolve_path(text: str) -> Path:
    """``compare.noise_file`` as a path: absolute as it is; relative to ``$MOE_HYDRA_SITE`` when set, else to the
    current directory."""
    p = Path(text).expanduser()
    if p.is_absolute():
        return p
    site = site_dir()
    return (site / p) if site else p


def _site() -> str | None:
    """compare.noise_file in the site file ($MOE_HYDRA_SITE/site/default.yaml), when there is one."""
    compare = site_settings().get("compare")
    value = compare.get("noise_file") if isinstance(compare, dict) else None
    return str(value) if value not in (None, "") else None


def configured(run_dirs: Sequence[Path], warn: Warn) -> Path | None:
    """The noise file the runs were configured with (compare.noise_file, the command line's or the site's), else
    the current site file's; None when neither names one."""
    named = [str(v) for v in (recorded(d, CONFIG_KEY) for d in run_dirs) if v]
    if len(set(named)) > 1:
        warn(f"the runs name different noise files ({', '.join(sorted(set(named)))}); using {named[0]}")
    text = named[0] if named else _site()
    return resolve_path(text) if text else None


def measured_floor(noise_file: Path | None, run_dirs: Sequence[Path], warn: Warn) -> Floor | None:
    """The measured noise compare uses: ``noise_file`` (--noise; a bad one raises :class:`Refused`), else the
    configured one (a bad or missing one is warned about and the declared noise is used), else None."""
    if noise_file is not None:
        return floor_of(load(noise_file), noise_file)
    path = configured(run_dirs, warn)
    if path is None:
        return None
    try:
        return floor_of(load(path), path)
    except Refused as e:
        warn(f"{CONFIG_KEY}: {e}; the declared hardware.run_to_run_noise is used instead")
        return None


def relative_margin(text: str) -> float:
    """--equivalence: "2%" or "0.02", a fraction in (0, 1).

    Raises:
        ValueError: anything else.
    """
    t = text.strip()
    value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    if not 0 < value < 1:
        raise ValueError(f"{text!r} is not a relative margin in (0, 1), e.g. 2% or 0.02")
    return value
