"""``python -m moe_hydra.bisect``: which change made it slow. The difference between a good configuration and a bad
one, split into units; the regression reproduced first; then delta debugging (:mod:`moe_hydra.planning.ddmin`) over
the units, each test a subset of the bad side's units applied to good and judged against good by the sequential
test of ``repeat=auto``; the culprit profiled against good to name the walls that moved (docs/bisect.md).

The experiments run through :class:`moe_hydra.launch.experiments.Driver` (tune's driver): every A/B a sweep in a
directory of the bisect's, the journal ``bisect.json`` (:data:`BISECT_VERSION`) its state, so the same command
again continues where it stopped (a crash, SIGTERM, a detached Slurm round), never measuring an A/B again.

Units: a config group's option with the dotted keys of that group the bad side sets is one unit (they travel
together); any other key is a unit of its own. A key only the good side sets goes back to the bad side's value
(its default there). What a config cannot switch — software versions, the platform, the CPU, CUDA — is reported,
never bisected.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from moe_hydra.analysis.report import change_interval
from moe_hydra.core import bounds, io, overrides
from moe_hydra.core.errors import Refused
from moe_hydra.launch import compose, directories, experiments
from moe_hydra.planning import ddmin, retune

BISECT_FILE = "bisect.json"
BISECT_VERSION = 1
LOCK = ".bisect.lock"
# env.json fields a config cannot switch: a difference is reported beside the culprit
UNSWITCHABLE = ("versions", "platform", "cpu", "runtime")


@dataclass
class Unit:
    """One switchable difference: the overrides that apply it to good, and what good has there."""

    key: str
    overrides: list[str]
    good: list[str] = field(default_factory=list)
    tied_by: list[str] = field(default_factory=list)  # the rules that made several keys one unit


def units_between(good: list[str], bad: list[str]) -> list[Unit]:
    """The switchable difference between two override lists, bad's side of it as units (module docstring).

    Raises:
        Refused: the bad side leaves at its default a group only the good side sets, and that default has no
            option name to switch to.
    """
    g, b = _last(good), _last(bad)
    changed = [k for k in dict.fromkeys([*b, *g]) if g.get(k) != b.get(k)]
    bad_cfg = None
    units: dict[str, Unit] = {}
    for k in changed:
        root = k.split(".")[0]
        in_group = k != root and experiments.is_group(root) and root in changed  # travels with its group's option
        unit = units.setdefault(root if in_group else k, Unit(root if in_group else k, []))
        if k in g:
            unit.good.append(g[k])
        if k in b:
            unit.overrides.append(b[k])
            continue
        if in_group:  # only good sets it, and the bad side's option of the group brings its own value
            continue
        # only good sets it: the bad side has the default there, which the unit sets
        bad_cfg = bad_cfg if bad_cfg is not None else OmegaConf.structured(compose.compose_typed(bad))
        if experiments.is_group(k):
            option = OmegaConf.select(bad_cfg, f"{k}.name", default=None)
            if option is None:
                raise Refused(f"the good side sets {g[k]!r}; the bad side leaves {k} at its default, which has no "
                              f"name to switch to: give it on the bad side (--bad \"... {k}=<option>\")")
            unit.overrides.append(f"{k}={option}")
        else:
            value = OmegaConf.select(bad_cfg, k, default=None)
            unit.overrides.append(overrides.override(k, OmegaConf.to_container(value)
                                                     if OmegaConf.is_config(value) else value))
    for u in units.values():  # a group's option first, so that its dotted keys apply on top of it
        u.overrides.sort(key=lambda o: "." in overrides.key(o))
    return list(units.values())


def _last(arm: list[str]) -> dict[str, str]:
    """Each key's last override in ``arm``."""
    return {overrides.key(o): o for o in arm}


def run_dir_overrides(directory: Path) -> tuple[list[str], dict[str, Any]]:
    """A run directory's overrides (``.hydra/overrides.yaml``) and its env.json.

    Raises:
        Refused: not a run directory of moe_hydra's.
    """
    recorded = directory / ".hydra" / "overrides.yaml"
    if not recorded.is_file():
        raise Refused(f"{directory} is not a run directory (no .hydra/overrides.yaml): give a run's directory, or "
                      "--good/--bad with overrides")
    try:
        task = OmegaConf.to_container(OmegaConf.load(recorded))
    except Exception as e:  # noqa: BLE001 - an unreadable overrides.yaml: bad input
        raise Refused(f"{recorded}: not readable ({str(e).splitlines()[0]})") from None
    if not isinstance(task, list) or not all(isinstance(o, str) for o in task):
        raise Refused(f"{recorded}: not a list of overrides")
    env = io.read_json(directory / "env.json")
    return list(task), env if isinstance(env, dict) else {}


def unswitchable(good_env: dict[str, Any], bad_env: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between two runs' env.json that no config switches (versions, platform, CPU, CUDA)."""
    out = []
    for section in UNSWITCHABLE:
        a, b = good_env.get(section), bad_env.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [{"what": f"{section}.{k}", "good": a.get(k), "bad": b.get(k)}
                    for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        elif a != b and a is not None and b is not None:
            out.append({"what": section, "good": a, "bad": b})
    return out


class Bisect:
    """One bisection: its directory, its journal, its experiments."""

    def __init__(self, good: list[str], bad: list[str], common: list[str], out: Path | None,
                 envs: tuple[dict[str, Any], dict[str, Any]] = ({}, {})):
        self.how = [o for o in [*good, *common] if experiments.is_how(o) and not overrides.key(o).startswith(
            ("hydra.sweep.dir", "hydra.run.dir", "hydra.job", "bisect."))]
        self.limits = [o for o in common if overrides.key(o).startswith("bisect.")]
        both = [c for c in common if not experiments.is_how(c)]
        self.good = [o for o in [*good, *both] if not experiments.is_how(o)]
        bad_side = [o for o in [*bad, *both] if not experiments.is_how(o)]
        self.units = units_between(self.good, bad_side)
        if not self.units:
            raise Refused("the good and the bad side set the same configuration: nothing to bisect"
                          + (" (they differ only in what a config cannot switch: "
                             + ", ".join(d["what"] for d in unswitchable(*envs)) + ")" if unswitchable(*envs) else ""))
        self.cfg = self._check()
        self.units = self._tied(self.units)
        self.bcfg = self.cfg.bisect
        self.dir = out or directories.fresh(Path("outputs/bisect") / datetime.datetime.now().strftime(
            "%Y-%m-%d/%H-%M-%S"), "--out")
        self.lock = directories.hold(self.dir, LOCK, "--out", what="bisect")
        self.journal = self._journal(envs)
        self.console = io.console()
        self.driver = experiments.Driver(self.dir, self.journal, self.save,
                                         self.cfg.hardware.nodes * self.cfg.hardware.devices_per_node,
                                         on_start=lambda e: self.console.print(
                                             f"  running {e.name}: {experiments.shell(e.command)}", markup=False,
                                             highlight=False, style="dim"))

    # ------------------------------------------------------------------ refusals, before anything runs

    def _check(self) -> Any:
        """Both sides compose and plan (the rules, the memory estimate); bisect.* within bounds."""
        problems, cfg = [], None
        for side, arm in (("good", self.good), ("bad", self.arm(range(len(self.units))))):
            planned = self.plan(arm)
            if planned["violations"]:
                problems.append(f"the {side} side: " + "; ".join(planned["violations"]))
            elif side == "good":
                cfg = planned["cfg"]
        if problems:
            raise Refused("\n".join(problems) + "\nNothing was run.")
        return cfg

    def plan(self, arm: list[str]) -> dict[str, Any]:
        """``arm``'s composed config and what stops it from running here (empty when nothing does)."""
        return experiments.plan_arm([*arm, *self.how, *self.limits])

    def arm(self, subset: Any, units: list[Unit] | None = None) -> list[str]:
        """Good with the units of ``subset`` (indices into ``units``, the bisect's by default) applied."""
        change = [o for i in subset for o in (units or self.units)[i].overrides]
        return overrides.merge(self.good, change) if change else list(self.good)

    def _tied(self, units: list[Unit]) -> list[Unit]:
        """Keys that a rule ties together are one unit: a unit the rules refuse on good takes in every unit whose
        keys the violated rules name (``recompute.recompute_granularity=full`` with its ``recompute_method`` and
        ``recompute_num_layers``: L50), until good with them plans or the rules name no other unit. A unit that
        stays refused is kept as it is (ddmin records its subsets as refused)."""
        units = list(units)
        i = 0
        while i < len(units):
            group = [i]
            planned = self.plan(self.arm(group, units))
            rules = planned.get("rules") or []  # what refuses the unit alone
            while planned["violations"]:
                named = set(planned.get("fields") or ())
                more = [j for j, u in enumerate(units) if j not in group and any(
                    overrides.key(o) in named or overrides.key(o) in {k.split(".")[0] for k in named}
                    for o in u.overrides)]
                if not more:
                    break
                group += more
                planned = self.plan(self.arm(group, units))
            if len(group) > 1 and not planned["violations"]:
                merged = Unit(" + ".join(units[j].key for j in group), [o for j in group for o in units[j].overrides],
                              [o for j in group for o in units[j].good], rules)
                units = [merged if j == i else u for j, u in enumerate(units) if j == i or j not in group]
            i += 1
        return units

    def _journal(self, envs: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        path = self.dir / BISECT_FILE
        fresh = {"bisect_version": BISECT_VERSION, "status": "running", "good": {"overrides": self.good},
                 "bad": {"overrides": self.arm(range(len(self.units)))}, "common": self.how,
                 "difference": {"units": [asdict(u) for u in self.units], "unswitchable": unswitchable(*envs)},
                 "trials": [], "culprit": [], "experiments": {}}
        return experiments.open_journal(
            path, fresh, lambda j: None if j.get("good") == fresh["good"] and j.get("bad") == fresh["bad"] else
            f"good {' '.join((j.get('good') or {}).get('overrides') or [])!r}", "bisect", "--out DIR", self.lock)

    def save(self) -> None:
        self.journal["gpu_hours"] = round(sum(e.get("gpu_hours") or 0.0
                                              for e in self.journal["experiments"].values()), 6)
        io.write_json(io.finite(self.journal), self.dir / BISECT_FILE)

    def say(self, text: str) -> None:
        self.console.print(f"bisect {text}")

    # ------------------------------------------------------------------ the search

    @property
    def measured(self) -> list[str]:
        """The overrides both arms take, with the steady window of the bisect's runs (bisect.window)."""
        w = self.bcfg.window
        return experiments.with_window(self.how, w if w == experiments.AUTO else list(w))

    def _ab(self, name: str, arm: list[str], margin: float | None = None) -> dict[str, Any]:
        """``arm`` against good, repeat=auto; ``margin``: its equivalence margin (compare.equivalence) when not the
        declared one."""
        common = [*self.measured, *([f"compare.equivalence={margin:.6g}"] if margin else [])]
        e = experiments.ready(self.driver.ab(name, self.good, arm, common, self.bcfg.max_repeats))
        return {"experiment": e.name, "status": e.status, **({"margin": margin} if margin else {}), **{
            k: e.result.get(k) for k in ("verdict", "rel_step_time", "interval", "interval_is", "runs",
                                         "step_time_ms")}}

    @property
    def margin(self) -> float:
        """The trials' equivalence margin: half the reproduced regression (a subset equivalent to good within it
        holds less than half of the regression: it passes), at least the declared compare.equivalence. Without it
        a subset with no effect could only end undecided on a noisy machine, and ddmin could not prove a culprit
        minimal. A regression of 3x or more (``rel_step_time`` >= 2) takes the largest margin compare.equivalence
        allows (a relative difference of -1 or less is no step time at all)."""
        rel = (self.journal.get("reproduce") or {}).get("rel_step_time") or 0.0
        return round(min(max(float(self.cfg.compare.equivalence), rel / 2), bounds.DOMAINS["compare.equivalence"][1]),
                     4)

    def test(self, subset: tuple[int, ...]) -> str:
        """ddmin's test: the subset's units applied to good, judged against good (slower: the regression is there;
        undecided at bisect.max_repeats: unresolved; a subset the rules refuse: refused, never launched)."""
        trial = {"subset": list(subset), "units": [self.units[i].key for i in subset]}
        arm = self.arm(subset)
        planned = self.plan(arm)
        if planned["violations"]:
            trial.update(outcome=ddmin.REFUSED, reasons=planned["violations"])
        else:
            ab = self._ab("trial-" + "_".join(map(str, subset)), arm, self.margin)
            verdict = ab["verdict"]
            outcome = (ddmin.FAIL if verdict == "slower" else ddmin.PASS if verdict in ("faster", "equivalent")
                       else ddmin.UNRESOLVED)
            trial.update(ab, outcome=outcome)
            self.say(f"trial {len(self.journal['trials']) + 1}: {' '.join(trial['units'])}: {verdict}"
                     + (f" {ab['rel_step_time']:+.1%}" if ab.get("rel_step_time") is not None else ""))
        trials = self.journal["trials"]
        at = next((i for i, t in enumerate(trials) if t["subset"] == list(subset)), len(trials))
        trials[at:at + 1] = [trial]  # a resumed search replays its trials in their places
        self.save()
        return trial["outcome"]

    def run(self) -> int:
        try:
            self.say(f"in {self.dir}: {len(self.units)} units differ: "
                     + ", ".join(" ".join(u.overrides) for u in self.units))
            for d in self.journal["difference"]["unswitchable"]:
                self.say(f"not switchable here (reported, not bisected): {d['what']}: {d['good']} -> {d['bad']}")
            every = tuple(range(len(self.units)))
            reproduce = self._ab("reproduce", self.arm(every))
            self.journal["reproduce"] = reproduce
            self.say(f"reproduce: bad against good: {reproduce['verdict']}"
                     + (f" {reproduce['rel_step_time']:+.1%} {change_interval(reproduce.get('interval'))}"
                        if reproduce.get("rel_step_time") is not None else ""))
            if reproduce["verdict"] != "slower":
                self.journal["status"] = "not_reproduced"
                self._finish()
                return 0
            result = ddmin.ddmin(len(self.units), self.test, max_tests=self.bcfg.max_trials,
                                 known={every: ddmin.FAIL})
            self.journal["culprit"] = [asdict(self.units[i]) for i in result.culprit]
            self.journal["minimal"] = result.minimal
            self.journal["undecided"] = [self.units[i].key for i in result.undecided]
            self.journal["interaction"] = len(result.culprit) > 1
            self.journal["status"] = ("found" if result.minimal else "max_trials" if result.stopped
                                      else "not_minimal")
            self._share(result.culprit)
            if self.bcfg.profile:
                self.journal["walls"] = self._walls(self.arm(result.culprit))
            self._finish()
        except experiments.Queued as q:
            self.journal["status"] = "queued"
            self.save()
            self.say(f"{q.experiment.name} is queued on Slurm; once it has run (python -m moe_hydra.sweep wait "
                     f"{q.experiment.dir}), the same command continues the bisect")
        finally:
            self.lock.close()
        return 0

    def _share(self, culprit: tuple[int, ...]) -> None:
        """The culprit's measured change against good, and its share of the regression."""
        every = tuple(range(len(self.units)))
        trial = next((t for t in self.journal["trials"] if tuple(t["subset"]) == culprit), None)
        measured = self.journal["reproduce"] if culprit == every else trial or {}
        total = self.journal["reproduce"].get("rel_step_time")
        rel = measured.get("rel_step_time")
        self.journal["share"] = {"rel_step_time": rel, "interval": measured.get("interval"),
                                 "of_regression": rel / total if rel is not None and total else None,
                                 "regression": total, "regression_interval": self.journal["reproduce"].get("interval")}

    def _walls(self, culprit_arm: list[str]) -> dict[str, Any]:
        """Good and the culprit profiled (profile=window): each wall's ms a step on the slowest rank, and the move."""
        out: dict[str, Any] = {}
        for side, arm in (("good", self.good), ("culprit", culprit_arm)):
            e = experiments.ready(self.driver.run(f"profile-{side}", [*arm, *self.measured, "profile=window"]))
            prof = io.read_json(experiments.job_dir(e) / "profile.json")
            out[side] = retune.wall_ms(prof) if isinstance(prof, dict) else {}
        out["moved"] = {w: round(out["culprit"].get(w, 0.0) - out["good"].get(w, 0.0), 3)
                        for w in retune.WALLS if w in out["good"] or w in out["culprit"]}
        return out

    def _finish(self) -> None:
        from moe_hydra.analysis import bisect_report, figures

        self.save()
        bisect_report.write(self.journal, self.dir)
        self.say(bisect_report.answer(self.journal) + f"  ({self.dir / 'bisect.md'})")
        if figures.log("bisect", [self.dir / "bisect.png"], [self.dir], self.dir):
            self.say("bisect.png logged to W&B with the trials' runs")
