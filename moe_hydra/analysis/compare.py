"""Matched A/B verdicts with their confidence: the runs grouped by their contract with the compared variables
left out, each arm against the baseline arm (``moe-hydra compare``; the command: :mod:`moe_hydra.commands.compare`).

Arms of a group differ only in the variables by construction (the variables swept by the runs' own multirun, or
the ones named); runs that differ in anything else are never compared, and when no group has two arms the
comparison is refused with the contract diff shown. Statistics: :mod:`moe_hydra.core.stats`.

The noise between runs, the one each verdict names (``noise_floor``: value and source), is the best one there is:
arms that were repeated (repeat=0,1,2) give their own — the run is the unit, Welch on the run means; otherwise a
measured run-to-run noise (a noise file: ``--noise FILE``, else ``compare.noise_file`` as the runs or the site
file set it; ``moe-hydra noise`` writes one), with which a run's mean varies by sigma_b^2 + its steps' s^2/n and
the run means are tested against that (:func:`moe_hydra.core.stats.measured`); otherwise the declared
hardware.run_to_run_noise (or --noise-floor), a floor: the window's steps are the samples and a difference counts
only beyond it, since step times say nothing about a second run of the same config.

Verdicts: faster, slower, equivalent (a two-one-sided test within the declared equivalence margin,
``compare.equivalence``, default 5 %; needs a measured variance: repeats or a noise file), undecided (with the
runs per arm that would decide it, when equivalence was tested). An arm that was given a run more
than once gets no verdict (:data:`DUPLICATED`), nor one that holds a run whose window is not steady
(:data:`NOT_STEADY`: :mod:`moe_hydra.core.steady`; its figures are shown, and the fix). Runs profiled with
``profile=window`` (profile.json) say which wall moved (:mod:`moe_hydra.analysis.profiles`), in the notes. A sweep run with repeat=auto (sequential.json) is noted
with its own, sequential verdict.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.analysis import noise as noises
from moe_hydra.analysis import profiles
from moe_hydra.analysis.runs import Run, Warn, contract_value, recorded
from moe_hydra.core import contract as contracts
from moe_hydra.core import stats
from moe_hydra.core.errors import Refused

NOT_ARM_VARIABLES = ("repeat",)  # swept to repeat an arm, not to make one
DUPLICATED = "none: a run was given more than once"  # the verdict of an arm built from duplicated input
NOT_STEADY = "none: a window is not steady"  # the verdict of an arm holding a run whose window is not steady


def _arm_name(run: Run, variables: list[str]) -> str:
    parts = []
    arm = dict(t.split("=", 1) for t in (run.results.get("tracking") or {}).get("job_type", "").split() if "=" in t)
    for v in variables:
        value = contract_value(run, v)
        if value is None:  # a swept key outside the contract (e.g. repeat): the run's own override
            value = arm.get(v)
        if isinstance(value, dict):
            value = value.get("name", json.dumps(value, sort_keys=True))
        parts.append(f"{v}={value}")
    return " ".join(parts)


@dataclass
class Comparison:
    variables: list[str]
    contract_hash: str
    arms: dict[str, list[Run]]
    baseline: str
    effects: dict[str, stats.Effect] = field(default_factory=dict)
    walls: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm -> profiles.moved(), when profiled
    notes: list[str] = field(default_factory=list)
    noise: dict[str, noises.Floor] = field(default_factory=dict)  # arm -> the run-to-run noise its verdict used
    metric: str = contracts.STEP_TIME  # what the verdicts judge (contracts.measure): step time, or tokens/s/GPU


def declared_floor(members: list[Run], noise_floor: float | None) -> float:
    """Run-to-run noise for one-run arms: ``noise_floor``, else the largest hardware.run_to_run_noise (schema: a
    fraction in [0, 1]) of the runs, else 0."""
    if noise_floor is not None:
        return noise_floor
    return max(float(contract_value(r, "hardware.run_to_run_noise") or 0.0) for r in members)


def _repeats(base: list[Run], cand: list[Run], equivalence: float) -> tuple[stats.Effect, noises.Floor]:
    """Repeated arms: Welch on the run means, the arms' own between-run noise (pooled) as the floor's record."""
    a, b = [r.window_mean for r in base], [r.window_mean for r in cand]
    df = len(a) + len(b) - 2
    pooled = math.sqrt((sum((x - sum(a) / len(a)) ** 2 for x in a) + sum((x - sum(b) / len(b)) ** 2 for x in b)) / df)
    run_sd = pooled / (sum(a) / len(a))  # one run's mean, relative: what the Welch test reads
    effect = stats.welch(a, b, "runs", margin=equivalence)
    try:
        nz = stats.run_noise([[r.window_steps for r in base], [r.window_steps for r in cand]])
        floor = noises.Floor(nz.relative, noises.REPEATS, interval=nz.interval, df=nz.df, step_noise=nz.step_noise,
                             extra={"run_mean_noise": run_sd})
    except ValueError:  # windows of one step: no step-to-step variance to take apart
        floor = noises.Floor(run_sd, noises.REPEATS, extra={"run_mean_noise": run_sd})
    return effect, floor


def _measured(base: list[Run], cand: list[Run], noise: noises.Floor, equivalence: float) -> stats.Effect:
    """Arms with a measured run-to-run noise: their run means against sigma_b^2 + s^2/n (stats.measured)."""
    a = [stats.RunStat.of(r.window_steps) for r in base]
    b = [stats.RunStat.of(r.window_steps) for r in cand]
    return stats.measured(a, b, noise.value, noise.df, margin=equivalence, step_noise=noise.step_noise,
                          step_df=noise.step_df)


def _effect(comp: Comparison, name: str, mode: str, noise: noises.Floor | None,
            equivalence: float) -> stats.Effect | None:
    """``name`` against the baseline; None (with a note) when an arm has fewer than 2 samples. ``mode``: "repeats"
    (every arm repeated: the run is the unit), "measured" (``noise`` measured) or "floor" (``noise`` declared or
    given: a floor beyond which a step-level difference counts)."""
    base, cand = comp.arms[comp.baseline], comp.arms[name]
    if mode == noises.REPEATS:
        effect, comp.noise[name] = _repeats(base, cand, equivalence)
    else:
        a = [t for r in base for t in r.window_steps]
        b = [t for r in cand for t in r.window_steps]
        if len(a) < 2 or len(b) < 2:
            comp.notes.append(f"{name}: no comparison, {len(a)} and {len(b)} steady samples (Welch needs 2 per arm)")
            return None
        if mode == noises.MEASURED:
            effect, comp.noise[name] = _measured(base, cand, noise, equivalence), noise
        else:
            effect, comp.noise[name] = stats.welch(a, b, "steps", floor=noise.value), noise
    if any(r.copies for r in (*base, *cand)):
        return dataclasses.replace(effect, verdict=DUPLICATED)
    if any(not r.steady.window_steady for r in (*base, *cand)):
        return dataclasses.replace(effect, verdict=NOT_STEADY)
    return effect


def _per_token(run: Run, work: contracts.Work) -> Run:
    """``run`` as the time-per-token test reads it: every step's time over the tokens one GPU trains a step."""
    res = dict(run.results)
    res["step_times_ms"] = [t / work.tokens_per_gpu for t in run.results["step_times_ms"]]
    return dataclasses.replace(run, results=res)


def _walls(comp: Comparison, name: str, floor: float, warn: Warn) -> None:
    """Which wall moved from arm ``name`` to the baseline, when every run of both arms has a profile: a note."""
    arms = [[profiles.read(r.path, warn) for r in comp.arms[arm]] for arm in (comp.baseline, name)]
    if all(p for arm in arms for p in arm):
        comp.walls[name] = profiles.moved(*arms, floor)
        comp.notes.append(f"{name} vs {comp.baseline}, walls (profile.json): {comp.walls[name]['summary']}")


def compare(runs: list[Run], variables: list[str] | None = None, baseline: str | None = None,
            noise_floor: float | None = None, warn: Warn = lambda message: None, noise: noises.Floor | None = None,
            equivalence: float = stats.EQUIVALENCE) -> list[Comparison]:
    """A/B comparisons of ``runs`` (distinct complete runs, as :func:`load` gives them) over ``variables``
    (default: what the runs' multiruns swept).

    The noise between runs, per comparison: arms all repeated give their own (the run is the unit); else
    ``noise``, a measured one (:func:`moe_hydra.analysis.noise.measured_floor`); else ``noise_floor`` or the
    hardware's declared ``run_to_run_noise``, a floor. ``equivalence``: the margin (relative) of the equivalence
    test, declared (default 5 %; never derived from the noise; no equivalence against a declared floor). An arm holding a
    run that was given more than once (``Run.copies``) gets the verdict :data:`DUPLICATED`; one holding a run whose
    window is not steady (:attr:`Run.steady`: not evidence) :data:`NOT_STEADY`, its figures shown and a note naming
    the run, its judgment and the fix. When every run of an
    arm and of the baseline has a profile.json, the walls that moved are added as a note (``Comparison.walls``);
    ``warn`` hears of profile.json files that cannot be read.

    Raises:
        Refused: no two runs share a contract apart from the variables, or there is nothing to compare.
    """
    if len(runs) < 2:
        raise Refused(f"{len(runs)} distinct complete run(s): an A/B needs at least two")
    if not variables:
        variables = sorted({k for r in runs for k in r.results.get("swept", []) if k not in NOT_ARM_VARIABLES})
    if not variables:
        raise Refused("no variable to compare: the runs were not swept; name it with --variable KEY")
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(contracts.digest(contracts.excluding(r.results["contract"], variables)), []).append(r)
    out = []
    for key, members in groups.items():
        arms: dict[str, list[Run]] = {}
        for r in members:
            arms.setdefault(_arm_name(r, variables), []).append(r)
        if len(arms) < 2:
            continue
        names = list(arms)  # in run order: the sweep's first value is the baseline unless --baseline says
        works = {name: contracts.Work.of(rs[0].results["contract"]) for name, rs in arms.items()}
        metric = contracts.measure(list(works.values()), variables, names)
        if metric == contracts.THROUGHPUT:  # judged on time per token: each arm's steps over its tokens per GPU
            arms = {name: [_per_token(r, works[name]) for r in rs] for name, rs in arms.items()}
        comp = Comparison(variables, key, arms, baseline if baseline in arms else names[0], metric=metric)
        if metric == contracts.THROUGHPUT:
            comp.notes.append("judged on tokens/s/GPU: the design varies the work a step ("
                              + ", ".join(f"{n}: {w.tokens_per_gpu:g} tokens/GPU" for n, w in works.items())
                              + "); the test ran on time per token (ms per token per GPU), its reciprocal")
        if all(len(rs) >= 2 for rs in arms.values()):
            mode, floor = noises.REPEATS, None
        elif noise is not None and noise_floor is None:
            mode, floor = noises.MEASURED, noise
        else:
            mode = "floor"
            floor = noises.Floor(declared_floor(members, noise_floor),
                                 noises.OPTION if noise_floor is not None else noises.DECLARED)
        for name in names:
            if name != comp.baseline and (effect := _effect(comp, name, mode, floor, equivalence)):
                comp.effects[name] = effect
                _walls(comp, name, comp.noise[name].value if mode != noises.REPEATS else 0.0, warn)
        if mode == "floor":
            said = "--noise-floor" if noise_floor is not None else "hardware.run_to_run_noise, declared"
            comp.notes.append(f"one run per arm: a difference counts only beyond the run-to-run noise of "
                              f"{floor.value:.0%} ({said}); "
                              "repeat the arms (e.g. repeat=0,1,2) for a run-level verdict, or measure the noise "
                              "(python -m moe_hydra.noise) and pass --noise FILE")
        elif mode == noises.MEASURED:
            comp.notes.append(f"one run per arm: a run's mean varies by the measured run-to-run noise {floor.label()} "
                              f"({floor.file}) besides its own steps; the run means are tested against both "
                              f"(unit: runs, t on {floor.df:.1f}+ df)")
        unsteady = [r for rs in arms.values() for r in rs if not r.steady.window_steady]
        if unsteady:
            comp.notes.append("not evidence, so no verdict for the arms holding them: " + "; ".join(
                f"{r.path}: {r.steady.describe()}" for r in unsteady))
        if any(e.verdict == DUPLICATED for e in comp.effects.values()):
            comp.notes.append("a run given more than once was counted once (see the warnings), and the arms holding "
                              "it get no verdict: the command named arms it did not have; pass each run once")
        out.append(comp)
    if not out:
        a, b = runs[0], next((r for r in runs[1:] if _arm_name(r, variables) != _arm_name(runs[0], variables)), runs[1])
        # arms that train different work a step are told so, with the fix (the one rule: contracts.measure)
        contracts.measure([contracts.Work.of(r.results["contract"]) for r in (a, b)], variables,
                          [_arm_name(r, variables) for r in (a, b)])
        diff = [d for d in contracts.diff(contracts.excluding(a.results["contract"], variables),
                                         contracts.excluding(b.results["contract"], variables))]
        shown = "\n  ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in diff[:20]) or "(identical contracts, one arm)"
        raise Refused(f"no two arms share a contract apart from {', '.join(variables)}; never compared across "
                      f"contracts. {a.path} vs {b.path} differ in:\n  {shown}")
    return out



SEQUENTIAL_FILE = "sequential.json"  # repeat=auto's record in its sweep directory (moe_hydra.launch.sequential)


def sequential_records(dirs: list[Path], warn: Warn) -> list[dict[str, Any]]:
    """The repeat=auto records (sequential.json) of the directories given, each with its path."""
    out = []
    for d in dict.fromkeys(dirs):
        path = d / SEQUENTIAL_FILE
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                warn(f"{path}: unreadable ({type(e).__name__}); its sequential verdict is not shown")
                continue
            if isinstance(data, dict):
                out.append({"file": str(path), **data})
    return out


def recorded_margin(runs: list[Run], warn: Warn) -> float | None:
    """compare.equivalence as the runs recorded it (the command line's or the site file's), when one did."""
    values = {v for v in (recorded(r.path, "compare.equivalence") for r in runs) if v is not None}
    for v in sorted(values, key=str):
        try:
            return noises.relative_margin(str(v))
        except ValueError:
            warn(f"compare.equivalence {v!r} recorded by the runs is not a margin in (0, 1); not used")
    return None


