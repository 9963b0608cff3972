"""``python -m moe_hydra.compare``: matched A/B verdicts with their confidence, acceptance, regression diagnosis.

    python -m moe_hydra.compare DIR [DIR ...] [--variable KEY ...] [--baseline ARM] [--noise FILE] [--equivalence X]
                                [--out DIR]                                                   the A/B verdicts
    python -m moe_hydra.compare --accept DIR                                                      the validation gate
    python -m moe_hydra.compare --diff RUN_A RUN_B                                   what changed, which wall moved
    python -m moe_hydra.compare --accept RUN --save-baseline FILE                     keep it as golden values
    python -m moe_hydra.compare --against FILE DIR [DIR ...]                          judge runs against them

Runs profiled with ``profile=window`` (profile.json) say which wall moved: compute, communication (and its
exposed part), host, memcpy or idle, in ms/step with an interval (:mod:`moe_hydra.analysis.profiles`), in the
A/B table's notes and in --diff.

Runs (``results.json`` under the directories) are grouped by their contract with the compared variables left
out: the variables swept by the runs' own multirun, or ``--variable``. Arms of a group differ only in those
variables by construction; runs that differ in anything else are never compared, and when no group has two
arms the comparison is refused with the contract diff shown. Statistics: :mod:`moe_hydra.core.stats`.

Every results.json is read through the schema (:mod:`moe_hydra.core.results`); one that fails it (not an
object, a step time that is NaN, infinite, zero or negative, a window outside the steps run, a NaN loss, a
results_version other than 1, ...) is skipped with one warning naming the file and the field, whatever the
file's own flags claim: in the verdict, in --accept (which then refuses) and in --diff. A run stopped by a
signal (status interrupted or terminated) is listed, never compared. Failed points and plan-only directories
are skipped with a warning naming the file.

A run is counted once: files with the same run_id, the same file reached twice (``D D``, ``D D/0``) and files
with identical step times (a copy of a run written before run_id existed) are one run, with a warning
("counted once: same run_id as ..."). An arm that was given a run more than once gets no verdict: the
command's arms are not what it named; pass each run once.

The noise between runs, the one each verdict names (``noise_floor``: value and source), is the best one compare
has: arms that were repeated (repeat=0,1,2) give their own — the run is the unit, Welch on the run means; otherwise
a measured run-to-run noise (``--noise FILE``, else ``compare.noise_file`` as the runs or the site file set it;
``python -m moe_hydra.noise`` writes one), with which a run's mean varies by sigma_b^2 + its steps' s^2/n and the
run means are tested against that (:func:`moe_hydra.core.stats.measured`); otherwise the declared
hardware.run_to_run_noise (or --noise-floor), a floor: the window's steps are the samples and a difference counts
only beyond it, since step times say nothing about a second run of the same config.

Verdicts: faster, slower, equivalent (a two-one-sided test within ``--equivalence``, default twice the noise of
one run's mean; needs a measured variance: repeats or a noise file), undecided. A sweep run with repeat=auto
(sequential.json) is noted with its own, sequential verdict.

Output (:mod:`moe_hydra.analysis.report`): a table on the terminal, and ``compare.md``, ``compare.json`` (the
verdicts, machine-readable) and ``compare.png`` (step-time distributions per arm) in ``--out``, by default the first
directory when it is writable, else the current directory; the paths are printed. Exit code 0 whatever the verdict;
1 for an error (the output could not be written); 2 for a refusal or bad input (nothing to compare, no complete run
to accept, a bad --noise-floor, --noise or --equivalence, a bad baseline file); 3 when ``--against`` finds a run
that regressed (:mod:`moe_hydra.analysis.baseline`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.analysis import baseline, profiles, report
from moe_hydra.analysis import noise as noises
from moe_hydra.core import contract as contracts
from moe_hydra.core import results, stats

EXIT_ERROR, EXIT_REFUSED = 1, 2
NOT_ARM_VARIABLES = ("repeat",)  # swept to repeat an arm, not to make one
NEED = ("contract", "contract_hash", "loss")  # what every use of a complete run reads (results.problems)
DUPLICATED = "none: a run was given more than once"  # the verdict of an arm built from duplicated input

Warn = Callable[[str], None]


class Refused(Exception):
    """The comparison cannot be made honestly; the message says why."""


@dataclass
class Run:
    path: Path
    results: dict[str, Any]
    copies: list[Path] = field(default_factory=list)  # other results.json files of this run, counted once

    @property
    def window_steps(self) -> list[float]:
        first, last = results.measured_window(self.results) or (1, 0)
        return self.results["step_times_ms"][first - 1:last]

    @property
    def window_mean(self) -> float:
        return sum(self.window_steps) / len(self.window_steps)


@dataclass
class Loaded:
    """What the directories hold, each run once: ``runs`` complete (compared), ``stopped`` by a signal (listed,
    never compared), ``rejected`` the reasons results.json files were not used (against the schema, failed)."""

    runs: list[Run] = field(default_factory=list)
    stopped: list[Run] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


def _files(dirs: list[Path], warn: Warn) -> Iterator[Path]:
    """Every results.json under ``dirs`` (a directory's own, else its points'); plan-only points are warned."""
    for d in dirs:
        try:
            if not d.is_dir():
                warn(f"skipped {d}: {'not a directory' if d.exists() else 'no such directory'}")
                continue
            found = [d / "results.json"] if (d / "results.json").exists() else sorted(
                p for p in d.rglob("results.json") if "wandb" not in p.parts)
            plans = {p.parent for p in d.rglob("plan.json")} - {p.parent for p in found}
        except OSError as e:
            warn(f"skipped {d}: {e.strerror or type(e).__name__}")
            continue
        for p in sorted(plans):
            warn(f"skipped {p}: a plan without results (stage=plan, or a point that never ran)")
        yield from found


def _identities(path: Path, res: dict[str, Any]) -> list[tuple[str, Any]]:
    """What makes a run the same run: its file; its run_id; without one (version 0), its step times under its
    contract (no two runs time every step alike, so a copy of an old run is found in any directory)."""
    keys: list[tuple[str, Any]] = [("file", os.path.realpath(path))]
    if "run_id" in res:
        return keys + [("run_id", res["run_id"])]
    times = tuple(res.get("step_times_ms") or ())
    return keys + ([("step times", (contracts.digest(res.get("contract") or {}), times))] if times else [])


def _stop(run: Run) -> str:
    """A stopped run, told: its file, status, signal, and how much of its window it measured."""
    r = run.results
    window = results.measured_window(r)
    return (f"{run.path / 'results.json'}: status {r['status']} ({r.get('signal') or 'no signal named'}) after "
            f"{r['steps']} steps; window {r['window']}, "
            + (f"steps {window[0]}..{window[1]} measured" if window else "none of it measured")
            + ": a stopped run is never compared or accepted")


def load(dirs: list[Path], warn: Warn) -> Loaded:
    """Every run under ``dirs``, each counted once; anything not compared is warned, naming the file."""
    loaded, seen = Loaded(), {}

    def reject(message: str) -> None:
        loaded.rejected.append(message)
        warn(f"skipped {message}")

    for path in _files(dirs, warn):
        res, problem = results.read(path, NEED)
        if problem:
            reject(problem)
            continue
        keys = _identities(path, res)
        same = next(((what, seen[(what, key)]) for what, key in keys if (what, key) in seen), None)
        if same:
            what, run = same
            run.copies.append(path)
            warn(f"{path} counted once: same {what} as {run.path / 'results.json'}")
            continue
        run = Run(path.parent, res)
        seen.update({k: run for k in keys})
        if res["status"] == results.OK:
            loaded.runs.append(run)
        elif res["status"] in results.STOPPED:
            loaded.stopped.append(run)
            warn(f"not compared: {_stop(run)}")
        else:
            reject(f"{path}: status {res['status']!r} ({str(res.get('error', ''))[:120]})")
    return loaded


def _select(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in contracts.GROUP_SECTIONS.get(key, key).split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _arm_name(run: Run, variables: list[str]) -> str:
    parts = []
    arm = dict(t.split("=", 1) for t in (run.results.get("tracking") or {}).get("job_type", "").split() if "=" in t)
    for v in variables:
        value = _select(run.results["contract"], v)
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


def _floor(members: list[Run], noise_floor: float | None) -> float:
    """Run-to-run noise for one-run arms: ``noise_floor``, else the largest hardware.run_to_run_noise (schema: a
    fraction in [0, 1]) of the runs, else 0."""
    if noise_floor is not None:
        return noise_floor
    return max(float(_select(r.results["contract"], "hardware.run_to_run_noise") or 0.0) for r in members)


def _repeats(base: list[Run], cand: list[Run], equivalence: float | None) -> tuple[stats.Effect, noises.Floor]:
    """Repeated arms: Welch on the run means, the arms' own between-run noise (pooled) as the floor's record."""
    a, b = [r.window_mean for r in base], [r.window_mean for r in cand]
    df = len(a) + len(b) - 2
    pooled = math.sqrt((sum((x - sum(a) / len(a)) ** 2 for x in a) + sum((x - sum(b) / len(b)) ** 2 for x in b)) / df)
    run_sd = pooled / (sum(a) / len(a))  # one run's mean, relative: what the Welch test reads
    margin = equivalence if equivalence is not None else (2 * run_sd if run_sd > 0 else None)
    effect = stats.welch(a, b, "runs", margin=margin)
    try:
        nz = stats.run_noise([[r.window_steps for r in base], [r.window_steps for r in cand]])
        floor = noises.Floor(nz.relative, noises.REPEATS, interval=nz.interval, df=nz.df, step_noise=nz.step_noise,
                             extra={"run_mean_noise": run_sd})
    except ValueError:  # windows of one step: no step-to-step variance to take apart
        floor = noises.Floor(run_sd, noises.REPEATS, extra={"run_mean_noise": run_sd})
    return effect, floor


def _measured(base: list[Run], cand: list[Run], noise: noises.Floor, equivalence: float | None) -> stats.Effect:
    """Arms with a measured run-to-run noise: their run means against sigma_b^2 + s^2/n (stats.measured)."""
    a = [stats.RunStat.of(r.window_steps) for r in base]
    b = [stats.RunStat.of(r.window_steps) for r in cand]
    ma = sum(x.mean for x in a) / len(a)
    steps = sum(max(x.within / ma**2, (noise.step_noise or 0.0) ** 2 / x.steps) for x in a) / len(a)
    run_sd = math.sqrt(noise.value**2 + steps)  # one run's mean, relative
    margin = equivalence if equivalence is not None else (2 * run_sd if run_sd > 0 else None)
    return stats.measured(a, b, noise.value, noise.df, margin=margin, step_noise=noise.step_noise,
                          step_df=noise.step_df)


def _effect(comp: Comparison, name: str, mode: str, noise: noises.Floor | None,
            equivalence: float | None) -> stats.Effect | None:
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
    return effect


def _walls(comp: Comparison, name: str, floor: float, warn: Warn) -> None:
    """Which wall moved from arm ``name`` to the baseline, when every run of both arms has a profile: a note."""
    arms = [[profiles.read(r.path, warn) for r in comp.arms[arm]] for arm in (comp.baseline, name)]
    if all(p for arm in arms for p in arm):
        comp.walls[name] = profiles.moved(*arms, floor)
        comp.notes.append(f"{name} vs {comp.baseline}, walls (profile.json): {comp.walls[name]['summary']}")


def compare(runs: list[Run], variables: list[str] | None = None, baseline: str | None = None,
            noise_floor: float | None = None, warn: Warn = lambda message: None, noise: noises.Floor | None = None,
            equivalence: float | None = None) -> list[Comparison]:
    """A/B comparisons of ``runs`` (distinct complete runs, as :func:`load` gives them) over ``variables``
    (default: what the runs' multiruns swept).

    The noise between runs, per comparison: arms all repeated give their own (the run is the unit); else
    ``noise``, a measured one (:func:`moe_hydra.analysis.noise.measured_floor`); else ``noise_floor`` or the
    hardware's declared ``run_to_run_noise``, a floor. ``equivalence``: the margin (relative) of the equivalence
    test, default twice the noise of one run's mean (no equivalence against a declared floor). An arm holding a
    run that was given more than once (``Run.copies``) gets the verdict :data:`DUPLICATED`. When every run of an
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
        comp = Comparison(variables, key, arms, baseline if baseline in arms else names[0])
        if all(len(rs) >= 2 for rs in arms.values()):
            mode, floor = noises.REPEATS, None
        elif noise is not None and noise_floor is None:
            mode, floor = noises.MEASURED, noise
        else:
            mode = "floor"
            floor = noises.Floor(_floor(members, noise_floor),
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
                              f"(unit: runs, t on {floor.df:.1f}+ df)"
                              + ("; one run per arm cannot show equivalence within twice one run's noise: repeat "
                                 "the arms, or let repeat=auto decide" if equivalence is None and
                                 all(len(rs) == 1 for rs in arms.values()) else ""))
        if any(e.verdict == DUPLICATED for e in comp.effects.values()):
            comp.notes.append("a run given more than once was counted once (see the warnings), and the arms holding "
                              "it get no verdict: the command named arms it did not have; pass each run once")
        out.append(comp)
    if not out:
        a, b = runs[0], next((r for r in runs[1:] if _arm_name(r, variables) != _arm_name(runs[0], variables)), runs[1])
        diff = [d for d in contracts.diff(contracts.excluding(a.results["contract"], variables),
                                         contracts.excluding(b.results["contract"], variables))]
        shown = "\n  ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in diff[:20]) or "(identical contracts, one arm)"
        raise Refused(f"no two arms share a contract apart from {', '.join(variables)}; never compared across "
                      f"contracts. {a.path} vs {b.path} differ in:\n  {shown}")
    return out


# --------------------------------------------------------------------------- acceptance

ACCEPT_MIN_STEPS, ACCEPT_MIN_WINDOW = 50, 10
EVIDENCE_FOR = {"dispatcher": "dispatcher_class", "precision": "precision_recipe",
                "kernels.moe_grouped_gemm": "grouped_gemm", "expert_mesh": "local_experts_per_rank",
                "mesh": "local_experts_per_rank", "parallel.expert_model_parallel_size": "local_experts_per_rank"}


def loss_fall(r: dict[str, Any]) -> tuple[str, float, float] | None:
    """(what is compared, the loss before, the loss after): the mean of the first min(10, warmup) steps (at least
    one) against the steady window's mean; without per-step losses, the first step's against the last's; None when
    the run recorded neither."""
    loss, (first, last) = r.get("loss") or {}, r["window"]
    per_step, head = loss.get("per_step") or [], max(1, min(10, r.get("warmup_steps") or 0))
    window = per_step[first - 1:last]
    if len(per_step) >= head and window:
        return f"mean of steps 1..{head} -> window mean", sum(per_step[:head]) / head, sum(window) / len(window)
    if isinstance(loss.get("first"), (int, float)) and isinstance(loss.get("last"), (int, float)):
        return "first step -> last step", loss["first"], loss["last"]
    return None


def acceptance_problems(run: Run, variables: list[str]) -> list[str]:
    r, problems = run.results, []
    if r.get("label") != contracts.TRAINING_EQUIVALENT:
        problems.append(f"benchmark-only: {'; '.join(r.get('label_reasons', []))}")
    elif (fall := loss_fall(r)) is None or not fall[2] < fall[1]:  # on real data the model must learn
        problems.append("the loss does not fall on real data: " + (
            f"{fall[1]:.4f} -> {fall[2]:.4f} ({fall[0]})" if fall else "no losses recorded"))
    first, last = r["window"]
    if last - first + 1 < ACCEPT_MIN_WINDOW:
        problems.append(f"window [{first},{last}] has {last - first + 1} steps; acceptance needs >= {ACCEPT_MIN_WINDOW}")
    if r.get("steps", 0) < ACCEPT_MIN_STEPS:
        problems.append(f"{r.get('steps')} steps; acceptance needs >= {ACCEPT_MIN_STEPS}")
    loss = r.get("loss", {})
    if not loss.get("all_finite", False):
        problems.append("non-finite loss")
    skipped = loss.get("nan_or_skipped")
    if skipped != 0:
        problems.append(f"{skipped} NaN or skipped steps" if skipped else "loss.nan_or_skipped missing")
    evidence = r.get("evidence") or {}
    for v in variables:
        key = EVIDENCE_FOR.get(v)
        if key and evidence.get(key) is None:
            problems.append(f"no evidence that {v} was active (evidence.{key} missing)")
    if not evidence:
        problems.append("no evidence read from the built model")
    return problems


def _fmt(value: Any, spec: str) -> str:
    """A number as ``spec``; anything else (null, absent) as it is."""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def accept(runs: list[Run], variables: list[str]) -> tuple[list[str], list[str]]:
    """(refusals, report lines): the acceptance gate of docs/workflow.md for every run."""
    refusals, report = [], []
    for run in runs:
        problems = acceptance_problems(run, variables)
        refusals += [f"{run.path}: {p}" for p in problems]
        r, loss = run.results, run.results["loss"]
        report.append(
            f"{run.path}\n  label {r.get('label')}; contract {r['contract_hash']}; {r['steps']} steps, window "
            f"{r['window']}\n  step {run.window_mean:.2f} ms (window mean), "
            f"{_fmt(r.get('tokens_per_s_per_gpu'), '.1f')} tokens/s/GPU, {_fmt(r.get('tflops_per_gpu'), '.4f')} "
            f"TFLOP/s/GPU, MFU {r.get('mfu')}\n  loss {loss['first']:.4f} -> {loss['last']:.4f}, finite "
            f"{loss.get('all_finite')}, NaN/skipped {loss.get('nan_or_skipped')}\n"
            + ("" if (fall := loss_fall(r)) is None else f"  loss {'falls' if fall[2] < fall[1] else 'does not fall'}: "
               f"{fall[1]:.4f} -> {fall[2]:.4f} ({fall[0]})\n")
            + f"  peak memory {r.get('peak_memory_gib')}\n  evidence: {json.dumps(r.get('evidence'), sort_keys=True)}")
    return refusals, report


# --------------------------------------------------------------------------- regression diagnosis

METRICS = ("step_time_ms", "host_time_ms", "device_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu")
WALL_THRESHOLD = 0.05


def _memory(r: dict[str, Any]) -> float | None:
    m = r.get("peak_memory_gib") or {}
    return m.get("reserved") or m.get("allocated") or m.get("rss")


def _env(run: Run, warn: Warn) -> dict[str, Any]:
    """The run's env.json; {} (with a warning) when it is absent, unreadable or not a JSON object."""
    path = run.path / "env.json"
    if not path.exists():
        return {}
    try:
        env = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        warn(f"{path}: unreadable or not JSON ({type(e).__name__}); its environment is left out of the diff")
        return {}
    problem = "not a JSON object" if not isinstance(env, dict) else results.unfit(env)
    if problem:
        warn(f"{path}: {problem}; its environment is left out of the diff")
        return {}
    return env


def diagnose(a: Run, b: Run, warn: Warn, noise_floor: float | None = None) -> dict[str, Any]:
    """What differs between two complete runs: config, environment (env.json; a corrupt one is warned and left
    out), metrics, and which wall moved (from their profile.json when both have one, beyond ``noise_floor``,
    default the hardware's run-to-run noise)."""
    ra, rb = a.results, b.results
    order = ["parallel", "dispatcher", "routing", "precision", "recompute", "offload", "kernels", "overlap", "train",
             "timing", "model", "optimizer", "data", "hardware", "launcher", "software", "seed"]
    config = sorted(contracts.diff(ra["contract"], rb["contract"]),
                    key=lambda d: (order.index(d[0].split(".")[0]) if d[0].split(".")[0] in order else len(order), d[0]))
    ea, eb = _env(a, warn), _env(b, warn)
    env_keys = ("versions", "env", "runtime", "slurm", "hostname", "git")
    env = contracts.diff({k: ea.get(k) for k in env_keys}, {k: eb.get(k) for k in env_keys})
    metrics = {}
    for k in METRICS:
        va, vb = ra.get(k), rb.get(k)
        metrics[k] = (va, vb, (vb - va) / va if va and vb is not None else None)
    ma, mb = _memory(ra), _memory(rb)
    metrics["peak_memory_gib"] = (ma, mb, (mb - ma) / ma if ma and mb is not None else None)
    la, lb = ra["loss"]["last"], rb["loss"]["last"]
    metrics["loss.last"] = (la, lb, (lb - la) / la if la else None)

    def moved(key: str) -> str:
        rel = metrics[key][2]
        if rel is None:
            return "unknown (not measured on this backend)"
        return f"{'moved' if abs(rel) > WALL_THRESHOLD else 'steady'} ({rel:+.1%})"

    walls = {"memory": moved("peak_memory_gib")}
    pa, pb = profiles.read(a.path, warn), profiles.read(b.path, warn)
    if pa and pb:  # the profiles split the step: each wall's ms/step, moved or unchanged beyond the noise
        split = profiles.moved([pa], [pb], _floor([a, b], noise_floor))
        for wall, w in split["walls"].items():
            walls[wall] = (f"{'moved' if w['moved'] else 'unchanged'} ({w['a_ms_per_step']:.1f} -> "
                           f"{w['b_ms_per_step']:.1f} ms/step, {w['delta_ms_per_step']:+.1f}, 95% CI "
                           f"[{w['ci_ms_per_step'][0]:+.1f}, {w['ci_ms_per_step'][1]:+.1f}])")
        walls["which moved"] = split["summary"]
    else:
        walls["compute"] = moved("device_time_ms")
        walls["host"] = moved("host_time_ms")
        which = "either run" if not (pa or pb) else str((b if pa else a).path)
        walls["communication"] = profiles.NO_PROFILE.format(which=which)
    return {"config": config, "env": env, "metrics": metrics, "walls": walls}


def _fraction(text: str) -> float:
    """--noise-floor: a relative noise, 0 <= x < 1 (argparse refuses anything else with exit code 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1), e.g. 0.02")
    return value


def _margin(text: str) -> float:
    """--equivalence: a relative margin, "2%" or "0.02" (argparse refuses anything else with exit code 2)."""
    try:
        return noises.relative_margin(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if "margin" in str(e) else f"{text!r} is not a relative margin in "
                                         "(0, 1), e.g. 2% or 0.02") from None


SEQUENTIAL_FILE = "sequential.json"  # repeat=auto's record in its sweep directory (moe_hydra.launch.sequential)


def _sequential(dirs: list[Path], warn: Warn) -> list[dict[str, Any]]:
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


def _recorded_margin(runs: list[Run], warn: Warn) -> float | None:
    """compare.equivalence as the runs recorded it (the command line's or the site file's), when one did."""
    values = {v for v in (noises.recorded(r.path, "compare.equivalence") for r in runs) if v is not None}
    for v in sorted(values, key=str):
        try:
            return noises.relative_margin(str(v))
        except ValueError:
            warn(f"compare.equivalence {v!r} recorded by the runs is not a margin in (0, 1); not used")
    return None


def _out_dir(args: argparse.Namespace) -> Path:
    """--out, else the first directory when it is writable, else the current directory."""
    if args.out is not None:
        return args.out
    first = args.dirs[0]
    return first if first.is_dir() and os.access(first, os.W_OK) else Path.cwd()


def _not_compared(loaded: Loaded) -> list[str]:
    """Why the results.json files that were found are not in the comparison (for --accept and --diff)."""
    return loaded.rejected + [_stop(r) for r in loaded.stopped]


def _against(out, args: argparse.Namespace, loaded: Loaded, warn: Warn) -> int:
    """--against BASELINE: every complete run judged against the baseline file (moe_hydra.analysis.baseline)."""
    try:
        golden = baseline.load(args.against)
    except baseline.BadBaseline as e:
        raise Refused(str(e)) from None
    if not loaded.runs:
        raise Refused("no complete run to judge" + "".join(f"\n  {m}" for m in _not_compared(loaded)))
    judged = [baseline.judge(golden, r.path, r.results, r.window_steps, args.variable or [], args.noise_floor)
              for r in loaded.runs]
    out.print(baseline.table(golden, judged))
    for m in _not_compared(loaded):
        warn(f"not judged: {m}")
    if all(j.refused for j in judged):
        raise Refused("no run shares the baseline's contract (see the table)")
    regressed = [j for j in judged if j.regressed]
    out.print(f"{len(regressed)} of {len(judged)} run(s) regressed against {args.against}"
              if regressed else f"no regression against {args.against}", highlight=False, markup=False)
    return baseline.EXIT_REGRESSED if regressed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_hydra.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories")
    ap.add_argument("--variable", action="append", help="the variable under test (override key); repeatable")
    ap.add_argument("--baseline", help="the baseline arm, e.g. 'dispatcher=alltoall'")
    given = ap.add_mutually_exclusive_group()
    given.add_argument("--noise-floor", type=_fraction, help="a declared run-to-run noise for one-run arms, relative, "
                       "in [0, 1), a floor (default: hardware.run_to_run_noise of the runs)")
    given.add_argument("--noise", type=Path, metavar="FILE", help="the measured run-to-run noise for one-run arms: a "
                       "noise.json from python -m moe_hydra.noise (default: compare.noise_file, else the declared one)")
    ap.add_argument("--equivalence", type=_margin, metavar="X", help="the equivalence margin, relative: 2%% or 0.02 "
                    "(default: compare.equivalence, else twice the noise of one run's mean)")
    ap.add_argument("--out", type=Path, help="where compare.md, compare.json and compare.png go (created; default: "
                    "the first directory when writable, else the current directory)")
    ap.add_argument("--accept", action="store_true", help="the acceptance gate of the validate phase")
    ap.add_argument("--diff", action="store_true", help="regression diagnosis of two run directories")
    ap.add_argument("--save-baseline", type=Path, metavar="FILE", help="with --accept: keep the accepted run as a "
                    "baseline file (golden values with their intervals)")
    ap.add_argument("--against", type=Path, metavar="BASELINE", help="judge the runs under the directories against "
                    f"a baseline file; exit {baseline.EXIT_REGRESSED} when one regressed")
    args = ap.parse_args(argv)
    if args.save_baseline and not args.accept:
        ap.error("--save-baseline keeps an accepted run: give it with --accept")
    from moe_hydra.core.io import console

    out = console()
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        print(f"moe_hydra.compare: warning: {message}", file=sys.stderr)

    loaded = load(args.dirs, warn)
    runs = loaded.runs
    try:
        if args.diff:
            if len(args.dirs) != 2 or len(runs) != 2:
                raise Refused(f"--diff takes two run directories with complete, distinct results ({len(runs)} found)"
                              + "".join(f"\n  {m}" for m in _not_compared(loaded)))
            report.print_diff(out, diagnose(*runs, warn, args.noise_floor))
            return 0
        if args.against:
            return _against(out, args, loaded, warn)
        variables = args.variable or sorted({k for r in runs for k in r.results.get("swept", [])
                                             if k not in NOT_ARM_VARIABLES})
        if args.accept:
            refusals, bundle = accept(runs, variables)
            refusals = _not_compared(loaded) + refusals  # a directory under the gate holds nothing unusable
            if refusals:
                raise Refused("not accepted:\n  " + "\n  ".join(refusals))
            if not runs:
                raise Refused("no complete run to accept")
            out.print("[bold green]accepted[/bold green] — evidence bundle:")
            for block in bundle:
                out.print(block, highlight=False, markup=False)
            if args.save_baseline:
                if len(runs) != 1:
                    raise Refused(f"--save-baseline keeps one run; {len(runs)} were accepted")
                baseline.save(baseline.make(runs[0].path, runs[0].results, runs[0].window_steps), args.save_baseline)
                out.print(f"baseline written: {args.save_baseline}", highlight=False, markup=False)
            return 0
        try:
            measured = None if args.noise_floor is not None else noises.measured_floor(
                args.noise, [r.path for r in runs], warn)
        except noises.BadNoise as e:
            raise Refused(f"--noise: {e}") from None
        equivalence = args.equivalence if args.equivalence is not None else _recorded_margin(runs, warn)
        comps = compare(runs, variables, args.baseline, args.noise_floor, warn, noise=measured,
                        equivalence=equivalence)
    except Refused as e:
        print(f"moe_hydra.compare: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    sequential = _sequential(args.dirs, warn)
    out.print(report.table(comps))
    for c in comps:
        for n in c.notes:
            out.print(f"note: {n}", highlight=False, markup=False)
    for seq in sequential:
        out.print(f"note: {report.sequential_line(seq)}", highlight=False, markup=False)
    out_dir = _out_dir(args)
    try:
        written = report.write(comps, warnings, out_dir, sequential)
    except OSError as e:
        print(f"moe_hydra.compare: error: cannot write compare.md, compare.png, compare.json to {out_dir}: "
              f"{e.strerror or e}; choose a directory with --out DIR", file=sys.stderr)
        return EXIT_ERROR
    out.print(f"written: {', '.join(map(str, written))}", highlight=False, markup=False)
    return 0
