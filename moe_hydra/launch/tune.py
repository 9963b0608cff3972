"""``python -m moe_hydra.tune``: the evidence-gated loop run by itself, from a model and a cluster to a validated,
exported configuration (docs/tune.md).

    contract -> fit -> scale -> screen -> profile -> retune (profile again after each accepted change) -> validate
    -> export

Every decision is a measurement recorded in ``tune.json`` (:data:`TUNE_VERSION`), the loop's journal and its
state: the same command again continues where it stopped, never running a finished experiment again
(:class:`moe_hydra.launch.experiments.Driver`). The experiments are moe_hydra's own commands, each in a directory
of the tune's: the layout search with its screening of the tie set (``hydra/sweeper=layout``), ``profile=window``
runs, and the sequential A/Bs of ``repeat=auto``, the only test that accepts a retune change ("faster"). What the
loop may change: the layout (both meshes), the micro-batch at the fixed global batch, recompute and offload, the
dispatcher, the communication overlaps, CUDA graphs and kernels; precision, routing and data only when
``tune.allow`` names them (they change numerics or the label).

Outputs in the tune directory (``hydra.sweep.dir``): ``tune.json``; ``tune.md``, the story; ``tune.png``, step
time per accepted change and the walls before and after; ``best/``: the winner's overrides, its Megatron-LM and
Megatron-Bridge commands and its baseline file (golden values for ``moe-hydra regress``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from moe_hydra.analysis.report import change
from moe_hydra.core import io, overrides, steady
from moe_hydra.core.errors import Failed, Refused
from moe_hydra.core.schema import TUNE_ALLOW, Stage
from moe_hydra.core.steady import AUTO
from moe_hydra.launch import compose, directories, experiments
from moe_hydra.planning import layouts_file, retune

TUNE_FILE = "tune.json"
TUNE_VERSION = 1
LOCK = ".tune.lock"
STAGES = ("contract", "fit", "scale", "screen", "profile", "retune", "validate", "export")
# What the layout search chooses (it replaces these in the arms)
LAYOUT = ("mesh", "attention_mesh", "expert_mesh", "parallel.")


def without_layout(arm: list[str]) -> list[str]:
    return [o for o in arm if not overrides.key(o).startswith(LAYOUT) and overrides.key(o) not in LAYOUT]


class Tune:
    """One tune: its directory, its journal, its experiments."""

    def __init__(self, args: list[str]):
        self.args = list(args)
        self.how = [o for o in args if experiments.is_how(o) and not overrides.key(o).startswith(
            ("hydra.sweep.dir", "hydra.run.dir", "tune."))]
        self.start = [o for o in args if not experiments.is_how(o)]
        self.limits = [o for o in args if overrides.key(o).startswith("tune.")]  # the loop's own bounds, not an arm's
        self.cfg = self._check(self.start)
        self.tcfg = self.cfg.tune
        self.dir = self._directory()
        if self.cfg.logger.name == "wandb" and not any(overrides.key(o) == "logger.group" for o in self.how):
            self.how.append(f"logger.group=tune-{'-'.join(self.dir.resolve().parts[-2:])}")  # one W&B group a tune
        self.lock = directories.hold(self.dir, LOCK, "hydra.sweep.dir", what="tune")
        self.journal = self._journal()
        gpus = self.cfg.hardware.nodes * self.cfg.hardware.devices_per_node
        self.console = io.console()
        self.driver = experiments.Driver(self.dir, self.journal, self.save, gpus, on_start=self._started,
                                         wait=self._wait)

    # ------------------------------------------------------------------ refusals, before anything runs

    def _check(self, start: list[str]) -> Any:
        """The composed start, refused (exit 2, the override named) when it does not compose, names what tune.allow
        cannot, or breaks a rule or this machine's checks (tune.* out of bounds is S02's); every refusal at once."""
        planned = experiments.plan_arm([*start, *self.how, *self.limits])
        cfg = planned.get("cfg")
        if cfg is None:
            raise Refused(f"the overrides do not compose: {planned['violations'][0].split(': ', 1)[-1]}\n"
                          "Nothing was run.")
        problems = []
        unknown = sorted(set(cfg.tune.allow) - set(TUNE_ALLOW))
        if unknown:
            problems.append(f"tune.allow names {', '.join(unknown)}; it may name {', '.join(TUNE_ALLOW)} (fix: "
                            f"tune.allow=[{','.join(a for a in cfg.tune.allow if a in TUNE_ALLOW)}])")
        w = cfg.tune.window
        if w != AUTO and (isinstance(w, str) or len(w) != 2 or not 1 <= w[0] <= w[1]):
            problems.append(f"tune.window must be auto or [first, last] steps, 1 <= first <= last (is {w}); fix: "
                            "tune.window=auto")
        if cfg.stage is not Stage.run:
            problems.append(f"tune measures: it needs stage=run (is stage={cfg.stage.value}); fix: drop stage=")
        if planned["violations"]:
            problems.append("the start is refused before the loop begins:\n" + "\n".join(planned["violations"]))
        if problems:
            raise Refused("\n  ".join(problems) + "\nNothing was run.")
        return cfg

    @property
    def measured(self) -> list[str]:
        """The run-how overrides with the steady window of the loop's short runs (tune.window)."""
        return experiments.with_window(self.how, self.window)

    @property
    def window(self) -> Any:
        """tune.window: auto, or [first, last]."""
        return AUTO if self.tcfg.window == AUTO else list(self.tcfg.window)

    def _directory(self) -> Path:
        given = [o.split("=", 1)[1] for o in self.args if overrides.key(o) == "hydra.sweep.dir"]
        if given:
            return Path(given[-1])
        import datetime

        now = datetime.datetime.now()
        return directories.fresh(Path("outputs/tune") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S"),
                                 "hydra.sweep.dir")

    def _journal(self) -> dict[str, Any]:
        return experiments.open_journal(
            self.dir / TUNE_FILE, {"tune_version": TUNE_VERSION, "status": "running", "args": self.args,
                                   "start": {"overrides": self.start}, "stages": [], "experiments": {}},
            lambda j: None if (j.get("start") or {}).get("overrides") == self.start else
            f"started from {' '.join((j.get('start') or {}).get('overrides') or [])!r}",
            "tune", "hydra.sweep.dir=<dir>", self.lock)

    def save(self) -> None:
        self.journal["gpu_hours"] = round(self.driver.gpu_hours, 6) if hasattr(self, "driver") else 0.0
        self.journal["budget_gpu_hours"] = self.tcfg.budget_gpu_hours
        self.journal["gpu_hours_by_stage"] = by_stage(self.journal["experiments"])
        io.write_json(io.finite(self.journal), self.dir / TUNE_FILE)

    # ------------------------------------------------------------------ stages

    def _stage(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.journal["stages"] if s["stage"] == name and s.get("status") == "done"), None)

    def _record(self, name: str, **fields: Any) -> dict[str, Any]:
        self.journal["stages"] = [s for s in self.journal["stages"] if s["stage"] != name]
        entry = {"stage": name, "status": "done", **fields}
        self.journal["stages"].append(entry)
        self.save()
        self.say(f"[bold]{name}[/bold]: {fields.get('summary', '')}")
        return entry

    def say(self, text: str) -> None:
        spent = self.driver.gpu_hours if hasattr(self, "driver") else 0.0
        self.console.print(f"tune {text}  [dim](spent {spent:.3f} of {self.tcfg.budget_gpu_hours:g} GPU-h)[/dim]")

    def _started(self, e: experiments.Experiment) -> None:
        self.console.print(f"  running {e.name}: {experiments.shell(e.command)}", markup=False, highlight=False,
                           style="dim")

    def _wait(self, proc: Any, e: experiments.Experiment) -> int:
        """Wait for ``e``'s process under a live line (on a terminal): the stage, the experiment and its time, the
        A/Bs so far and the budget."""
        if not self.console.is_terminal:  # a log gets the stage lines only
            return proc.wait()
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console,
                      transient=True) as bar:
            bar.add_task(progress_line(self.journal, e.name, self.tcfg.max_trials, self.tcfg.budget_gpu_hours),
                         total=None)
            return proc.wait()

    def _plan(self, arm: list[str]) -> dict[str, Any]:
        """The plan of ``arm`` (in this process, :func:`experiments.plan_arm`): its violations (empty when it can
        run here), its composed and resolved config, and the plan's memory, fit and label."""
        from moe_hydra.planning import plan

        planned = experiments.plan_arm([*arm, *self.how])
        if planned["violations"]:
            return planned
        p = plan.make_plan(planned["resolved"])
        return {**planned, "memory": {k: p["memory"].get(k) for k in ("total", "capacity", "margin")},
                "fits": p["fits"], "label": p["label"]}

    def contract(self) -> None:
        if self._stage("contract"):
            return
        p = self._plan(self.start)
        frozen = {k: OmegaConf.select(OmegaConf.structured(self.cfg), k) for k in (
            "model.name", "hardware.name", "hardware.nodes", "hardware.devices_per_node", "train.global_batch_size",
            "train.seq_length", "precision.name", "routing.name", "data.kind")}
        tunable = ["layout (mesh, attention_mesh, expert_mesh, parallel.*)", "train.micro_batch_size (GBS fixed)",
                   "recompute", "offload", "dispatcher", "overlap.*", "kernels.*"] + \
            [f"{a} (tune.allow)" for a in self.tcfg.allow]
        self._record("contract", frozen=frozen, tunable=tunable, allow=list(self.tcfg.allow), label=p.get("label"),
                     window=self.window,
                     summary=f"frozen {', '.join(f'{k}={v}' for k, v in frozen.items())}; "
                     f"label {p.get('label')}" + (" (benchmark-only: every figure here is a benchmark's)"
                                                   if p.get("label") == "benchmark-only" else ""))

    def fit(self) -> list[str]:
        done = self._stage("fit")
        if done:
            return done["arm"]
        p = self._plan(self.start)
        arm = list(self.start)
        chosen = "the start fits"
        if p.get("fits") is False:  # the plan's own next steps, smallest first: selective before full, offload last
            from moe_hydra.planning import plan

            steps = plan.memory_verdict(plan.assess(p["resolved"]), plan.mcore_facts())["memory_suggestions"]
            first = next((s for s in steps if s["fits"]), None)
            if first is None:
                raise Refused("the start does not fit and no memory step of the plan makes it fit; more GPUs")
            arm, chosen = overrides.merge(arm, first["overrides"]), " ".join(first["overrides"])
        e = experiments.ready(self.driver.run("fit", [*arm, *self.how, "stage=fit"]))
        fit_json = io.read_json(experiments.job_dir(e) / "fit.json") or {}
        self._record("fit", arm=arm, memory=p.get("memory"), fits=p.get("fits"), chosen=chosen, experiment=e.name,
                     built=e.status, fit=fit_json.get("agrees") if isinstance(fit_json, dict) else None,
                     summary=f"{chosen}; stage=fit build {e.status}")
        return arm

    def scale_and_screen(self, arm: list[str]) -> list[str]:
        done = self._stage("screen")
        if done:
            return done["arm"]
        if self.window == AUTO:
            screen = [f"hydra.sweeper.screen_window={AUTO}",
                      f"hydra.sweeper.screen_warmup={self.cfg.contract.warmup_steps}"]
        else:
            first, last = self.window
            screen = [f"hydra.sweeper.screen_window=[{first},{last}]", f"hydra.sweeper.screen_warmup={first - 1}"]
        e = self.driver.run("scale", [*arm, *self.how, "hydra/sweeper=layout", f"hydra.sweeper.top_k="
                                      f"{self.tcfg.screen_top_k}", *screen], sweep=True)
        report = layouts_file.read(Path(e.dir) / "layouts.json") or {}
        ranked = [c for c in report.get("candidates") or [] if c.get("rank")]
        tied = [c for c in ranked if c.get("tied")]
        self._record("scale", experiment=e.name, candidates=(report.get("counts") or {}).get("candidates"),
                     ranked=len(ranked), tie_set=[c["layout"] for c in tied], tie_width=report.get("tie_width"),
                     summary=f"{len(ranked)} layout{'s' * (len(ranked) != 1)} ranked, {len(tied)} tied with the best "
                             f"within "
                             f"x{report.get('tie_width') or 0:.2f}: the screen measures them")
        screening = report.get("screening") or {}
        arms = screening.get("arms") or []
        best = next((a for a in arms if a.get("measured_rank") == 1), None)
        if best is None:
            if e.status == "queued":
                raise experiments.Queued(e)
            raise Failed(f"the screening measured no layout ({e.dir}: {e.error or 'no screening in layouts.json'})")
        new, own, decided = self._layout_evidence(arm, best, arms)
        self._record("screen", arm=new, experiment=e.name, arms=[
            {k: a.get(k) for k in ("layout", "status", "step_ms", "ci_ms", "measured_rank", "predicted_rank",
                                   "tie_with_best", "dir", "overrides")} for a in arms],
            best=best["layout"], start_layout=own, layout=decided["layout"], against_start=decided.get("verdict"),
            summary=decided["why"])
        return new

    def _layout_evidence(self, arm: list[str], best: dict[str, Any], arms: list[dict[str, Any]]
                         ) -> tuple[list[str], str, dict[str, Any]]:
        """The screen's pick replaces the start's layout only on evidence: kept when the start's own layout is the
        pick or measured tied with it; when the screen did not measure it, a sequential A/B decides ("faster")."""
        own = self._plan(arm)["resolved"].layout.describe()
        picked = overrides.merge(without_layout(arm), best["overrides"])
        ms = f"{best.get('step_ms', float('nan')):.1f} ms/step"
        if best["layout"] == own:
            return arm, own, {"layout": own, "why": f"the start's layout {own} is the screen's pick ({ms})"}
        mine = next((a for a in arms if a.get("layout") == own and a.get("measured_rank")), None)
        if mine is not None:
            if mine.get("tie_with_best"):
                return arm, own, {"layout": own, "why": f"the start's layout {own} ({mine['step_ms']:.1f} ms/step) "
                                  f"is tied with the screen's pick {best['layout']} ({ms}) within the noise: kept"}
            return picked, own, {"layout": best["layout"], "why": f"{best['layout']} ({ms}) measured faster than "
                                 f"the start's layout {own} ({mine['step_ms']:.1f} ms/step)"}
        v = experiments.ready(self.driver.ab("layout", arm, picked, self.measured, self.tcfg.max_repeats,
                                             self.tcfg.min_gain)).result
        verdict = v.get("verdict")
        if verdict == "faster":
            return picked, own, {"layout": best["layout"], "verdict": verdict, "why": f"{best['layout']} faster than "
                                 f"the start's layout {own} in an A/B ({change(v.get('rel_step_time'))})"}
        return arm, own, {"layout": own, "verdict": verdict, "why": f"the screen's pick {best['layout']} is "
                          f"{verdict} against the start's layout {own} in an A/B: kept"}

    def profile(self, arm: list[str], n: int) -> dict[str, Any]:
        e = self.driver.run(f"profile-{n:02d}", [*arm, *self.measured, "profile=window"])
        e = experiments.ready(e)
        prof = io.read_json(experiments.job_dir(e) / "profile.json")
        plan_json = io.read_json(experiments.job_dir(e) / "plan.json") or {}
        mem = plan_json.get("memory") or {}
        margin = mem.get("margin") / mem["capacity"] if mem.get("capacity") and mem.get("margin") is not None else None
        walls = retune.walls_of(prof, margin) if prof else {}
        return {"experiment": e.name, "status": e.status, "walls": walls, "dominant": next(iter(walls), None),
                "step_time_ms": e.result.get("step_time_ms")}

    def retune_loop(self, arm: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """The retune stage: candidates for the dominant wall first (then the next walls), each A/B'd against the
        incumbent; a "faster" verdict is accepted and the incumbent profiled again."""
        trials: list[dict[str, Any]] = []
        profiles = [self.profile(arm, 0)]
        self._record("profile", **profiles[0], summary=_walls_line(profiles[0]))
        tried: set[tuple[str, ...]] = set()
        n = 0
        accepted = []
        while n < self.tcfg.max_trials and self.driver.gpu_hours < self.tcfg.budget_gpu_hours:
            won = False
            walls = [w for w, share in profiles[-1]["walls"].items() if share >= 0.05] or list(retune.WALLS)
            incumbent = self._plan(arm)
            inc_cfg = incumbent.get("cfg") or self.cfg
            for wall in walls:
                proposed = [(c, change, overrides.merge(arm, change))
                            for c, change in retune.candidates(inc_cfg, wall, self.tcfg.allow)]
                if wall == "communication" and accepted:
                    proposed += self._next_layout(arm, incumbent.get("resolved"))
                for cand, change, new in proposed:
                    key = tuple(sorted(new))
                    if key in tried:
                        continue
                    tried.add(key)
                    planned = self._plan(new)
                    trial = {"n": n + 1, "wall": wall, "candidate": cand.name, "change": change, "why": cand.why,
                             "source": cand.source}
                    if planned["violations"]:
                        trials.append({**trial, "outcome": "refused by the rules", "reasons": planned["violations"]})
                        continue
                    if n >= self.tcfg.max_trials or self.driver.gpu_hours >= self.tcfg.budget_gpu_hours:
                        break
                    n += 1
                    e = self.driver.ab(f"retune-{n:02d}", arm, new, self.measured, self.tcfg.max_repeats,
                                       self.tcfg.min_gain)
                    v = experiments.ready(e).result
                    trials.append({**trial, "experiment": e.name, "status": e.status, "verdict": v.get("verdict"),
                                   "rel_step_time": v.get("rel_step_time"), "interval": v.get("interval"),
                                   "runs": v.get("runs"), "step_time_ms": v.get("step_time_ms"),
                                   "futile": v.get("futile"),
                                   "outcome": "accepted" if v.get("verdict") == "faster" else
                                   f"dropped: {e.status} ({e.error})" if e.status != "done" else
                                   f"rejected: a gain of {self.tcfg.min_gain:.0%} ruled out" if v.get("futile")
                                   else "rejected"})
                    self.say(f"retune {n}: {cand.name} ({' '.join(change)}) for {wall}: {v.get('verdict')}"
                             + (f" {v['rel_step_time']:+.1%}" if v.get("rel_step_time") is not None else "")
                             + (f": {trials[-1]['outcome']}" if v.get("futile") else ""))
                    if v.get("verdict") == "faster":
                        arm = new
                        accepted.append(trials[-1])
                        profiles.append(self.profile(arm, len(profiles)))
                        won = True
                        break
                if won or n >= self.tcfg.max_trials:
                    break
            if not won:
                break
        ended = (f"tune.max_trials ({n} A/Bs)" if n >= self.tcfg.max_trials else
                 f"tune.budget_gpu_hours ({self.driver.gpu_hours:.3f} spent)"
                 if self.driver.gpu_hours >= self.tcfg.budget_gpu_hours else "no candidate for the walls won")
        self._record("retune", arm=arm, trials=trials, accepted=[t["candidate"] for t in accepted], profiles=profiles,
                     ended_by=ended, summary=f"{len(accepted)} of {n} A/Bs accepted "
                     f"({', '.join(t['candidate'] for t in accepted) or 'none'}); ended by {ended}")
        return arm, profiles

    def _next_layout(self, arm: list[str], resolved: Any) -> list[tuple[retune.Candidate, list[str], list[str]]]:
        """The screen measured its layouts under the start's batch and recompute; once the retune has changed those,
        the fastest other layout it measured is one more candidate against the incumbent (the layout moves the
        exposed communication above all). ``resolved``: the incumbent's resolved config, as the loop planned it."""
        screen = self._stage("screen") or {}
        own_layout = resolved.layout.describe() if resolved is not None else None
        others = sorted((a for a in screen.get("arms") or [] if a.get("step_ms") is not None and a.get("overrides")
                         and a.get("layout") != own_layout), key=lambda a: a["step_ms"])
        if not others:
            return []
        change = [o for o in others[0]["overrides"] if overrides.key(o).startswith(LAYOUT)]
        cand = retune.Candidate("communication", f"the screen's next layout ({others[0]['layout']})",
                                lambda cfg: change, "the layout the screen measured fastest after the incumbent's, "
                                "under the batch and recompute the retune has chosen since", retune.WORKFLOW)
        return [(cand, change, overrides.merge(without_layout(arm), change))]

    def validate(self, winner: list[str]) -> dict[str, Any]:
        steps = self.tcfg.validate_steps
        if self.window == AUTO:  # at least validate_steps steps, its window the first steady segment it stops on
            window = steady.validation(steps, self.cfg.contract.steady_steps)
        else:
            window = [f"contract.window=[{steps - 9},{steps}]"]
        e = experiments.ready(self.driver.run("validate", [*winner, *self.how, *window]))
        accepted, reasons = False, []
        if e.status == "done":
            from moe_hydra.analysis import acceptance, baseline
            from moe_hydra.analysis.runs import load, not_compared

            loaded = load([experiments.job_dir(e)], lambda m: None)
            reasons, _ = acceptance.accept(loaded.runs, [])
            reasons = not_compared(loaded) + reasons  # a window that is not steady is no acceptance
            accepted = not reasons and bool(loaded.runs)
            if loaded.runs:  # golden values for moe-hydra regress, accepted or benchmark-only (labelled)
                run = loaded.runs[0]
                baseline.save(baseline.make(run.path, run.results, run.window_steps),
                              self.dir / "best" / "baseline.json")
        verdict = None
        if winner != self.start:  # the headline verdict: up to compare.max_repeats runs an arm, not a trial's few
            v = self.driver.ab("verdict", self.start, winner, self.measured,
                               max(self.cfg.compare.max_repeats, self.tcfg.max_repeats))
            verdict = experiments.ready(v).result
        return {"experiment": e.name, "status": e.status, "accepted": accepted, "refusals": reasons,
                "step_time_ms": e.result.get("step_time_ms"), "window": e.result.get("window_measured"),
                "against_start": verdict}

    def export(self, validate_dir: Path, winner: list[str]) -> list[str]:
        from moe_hydra.commands import run_command
        import contextlib
        import io as text_io

        best = self.dir / "best"
        written = []
        io.write_text(best / "overrides.txt", "\n".join(winner) + "\n")
        written.append(str(best / "overrides.txt"))
        for fmt, name in (("megatron-lm", "megatron-lm.sh"), ("bridge", "bridge.txt")):
            out, err = text_io.StringIO(), text_io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = run_command("export", [fmt, str(validate_dir)])
            if code == 0:
                io.write_text(best / name, out.getvalue())
                written.append(str(best / name))
            else:
                self.say(f"export {fmt}: {err.getvalue().strip()[-300:]}")
        return written

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        try:
            self.say(f"in {self.dir}: start {' '.join(self.start) or '(defaults)'}")
            self.contract()
            arm = self.fit()
            arm = self.scale_and_screen(arm)
            arm, profiles = self.retune_loop(arm)
            v = self.validate(arm)
            self._record("validate", **v, summary=_validate_line(v))
            written = self.export(experiments.job_dir(self.driver.get("validate")), arm)
            self._record("export", files=written, summary=", ".join(Path(w).name for w in written))
            self._finish(arm, v, profiles)
        except experiments.Queued as q:
            self.journal["status"] = "queued"
            self.save()
            self.say(f"{q.experiment.name} is queued on Slurm; once it has run (python -m moe_hydra.sweep wait "
                     f"{q.experiment.dir}), the same command continues the tune")
            return 0
        finally:
            self.lock.close()
        return 0

    def _finish(self, winner: list[str], v: dict[str, Any], profiles: list[dict[str, Any]]) -> None:
        against = v.get("against_start") or {}
        means = against.get("step_time_ms") or [None, None]
        start_ms = means[0] if means[0] is not None else profiles[0].get("step_time_ms")
        winner_ms = means[1] if len(means) > 1 and means[1] is not None else start_ms
        self.journal["start"].update(step_time_ms=start_ms)
        self.journal["winner"] = {"overrides": winner, "step_time_ms": winner_ms,
                                  "verdict": against.get("verdict") or "the start (nothing won)",
                                  "rel_step_time": against.get("rel_step_time"), "interval": against.get("interval"),
                                  "interval_is": against.get("interval_is"), "validated": v.get("accepted"),
                                  "command": experiments.shell([*winner, *self.how])}
        self.journal["status"] = "done"
        self.save()
        from moe_hydra.analysis import figures, tune_report

        tune_report.write(self.journal, self.dir)
        if figures.log("tune", [self.dir / "tune.png"], [self.dir], self.dir):
            self.say("tune.png logged to W&B with the experiments' runs")
        self.say(f"done: {start_ms:.1f} -> {winner_ms:.1f} ms/step ({self.journal['winner']['verdict']}); "
                 f"{self.dir / 'tune.md'}" if start_ms and winner_ms else f"done: {self.dir / 'tune.md'}")


def stage_of(experiment: str) -> str:
    """The stage an experiment of the loop belongs to (its name: fit, scale, profile-00, retune-03, validate...)."""
    if experiment == "profile-00":
        return "profile"
    kind = experiment.split("-")[0]
    return {"profile": "retune", "verdict": "validate", "layout": "screen"}.get(kind, kind)


def by_stage(experiments: dict[str, dict[str, Any]]) -> dict[str, float]:
    """GPU-hours spent per stage (scale holds the screening's runs: one sweep)."""
    out: dict[str, float] = {}
    for name, e in experiments.items():
        out[stage_of(name)] = round(out.get(stage_of(name), 0.0) + (e.get("gpu_hours") or 0.0), 6)
    return out


def progress_line(journal: dict[str, Any], running: str, max_trials: int, budget: float) -> str:
    """The live line: stage, the experiment under way, the retune's A/Bs and their verdicts so far, the budget."""
    trials = [e for n, e in journal["experiments"].items() if n.startswith("retune-") and n != running]
    verdicts = [(e.get("result") or {}).get("verdict") or e.get("status") for e in trials]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts)) or "none yet"
    spent = sum(e.get("gpu_hours") or 0.0 for e in journal["experiments"].values())
    return (f"tune {stage_of(running)}: {running} | A/Bs {len(trials)} of at most {max_trials} ({counts}) | "
            f"{spent:.3f} of {budget:g} GPU-h")


def _walls_line(p: dict[str, Any]) -> str:
    walls = p.get("walls") or {}
    return (f"dominant wall {p.get('dominant')} (" + ", ".join(f"{w} {s:.0%}" for w, s in walls.items()) + ")"
            if walls else f"no profile ({p.get('status')})")


def _validate_line(v: dict[str, Any]) -> str:
    against = v.get("against_start") or {}
    return (f"{v.get('step_time_ms') or float('nan'):.1f} ms/step over the window {v.get('window')}; "
            + ("accepted" if v.get("accepted") else "not accepted: " + "; ".join(v.get("refusals") or ["no run"]))
            + (f"; against the start: {against.get('verdict')} {against['rel_step_time']:+.1%}"
               if against.get("rel_step_time") is not None else ""))
