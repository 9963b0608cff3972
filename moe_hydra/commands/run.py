"""Plan, fit or train a config (the default): compose -> validate -> plan -> (stage=run) launch the job.

    python -m moe_hydra [group=option ...] [key=value ...] [-m]      moe-hydra run ...

The arguments are Hydra's overrides and flags (``moe-hydra run --help``: the config groups and keys).
Bad input (an unknown key or option, an override Hydra cannot read or compose, a broken rule, a sweep
directory that holds another sweep) ends with one message that names the override to change, exit code 2,
no traceback, and nothing launched. In a multirun, invalid points are reported and skipped, the valid
ones proceed, and the exit code at the end says whether any point failed (1) or was refused (2).
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from moe_hydra.commands import _overrides
from moe_hydra.core import env, io, overrides
from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, MEANINGS, Failed, Refused
from moe_hydra.core.resolved import Resolved, resolve
from moe_hydra.core.schema import CONF_PACKAGE, Stage, register_configs, site_settings
from moe_hydra.core.violations import LayoutError
from moe_hydra.launch import local, outcome, slurm
from moe_hydra.planning import plan, render

log = logging.getLogger("moe_hydra")

# moe-hydra run --help lists them (conf/config.yaml's help template, through moe_hydra.core.schema.register_configs)
EXITS = {code: MEANINGS[code] for code in (EXIT_OK, EXIT_FAILED, EXIT_REFUSED)}
SIGNALS = True  # a signal stops the job: 128 + its number
# What a point leaves in its directory, and what tells its outcome (moe_hydra.sweep status, compare): a point
# run again into the same directory starts without its earlier run's
OUTCOME_FILES = ("violations.json", "results.json", "fit.json", "plan.json", "env.json")


class Outcomes(Callback):
    """Hydra callback (``hydra.callbacks.outcomes`` in conf/config.yaml): reads every point's JobReturn and
    ends the command with the exit code they add up to, listing the points that did not complete.

    Local points reach it from Hydra's own ``run_job``; points the Slurm launcher or the layout sweeper
    settled are handed to it by them through ``hydra_context.callbacks``."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str]] = []  # (point, state) in sweep.json's vocabulary
        self.points: int | None = None  # a multirun's points, when its sweep overrides tell
        self.slowest: tuple[float, str] | None = None  # (ms/step, point) of the slowest point measured so far
        self.console = None  # where the sweep's progress goes: stderr's rich Console unless set

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # the points sweeper (the default) expands as Hydra's basic one; the layout sweeper searches instead
        target = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))
        basic = target.endswith(("BasicSweeper", "PointsSweeper"))
        self.points = sweep_size(OmegaConf.to_container(config.hydra.overrides.task)) if basic else None

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        num = OmegaConf.select(config, "hydra.job.num", default=None)
        args = " ".join(job_return.overrides or []) or "(defaults)"
        multirun = OmegaConf.select(config, "hydra.mode", default=None) == RunMode.MULTIRUN
        name = f"#{num} {args}" if multirun and num is not None and num >= 0 else args
        self.outcomes.append((name, outcome.state_of(job_return)))
        error = job_return._return_value
        if isinstance(error, BaseException) and not isinstance(error, (Refused, Failed)):
            # not a refusal or a failed job the point reported: a bug, shown whole
            print(f"moe_hydra: {name} raised\n" + "".join(traceback.format_exception(error)), file=sys.stderr)
        if multirun:
            self._progress(name, OmegaConf.select(config, "hydra.runtime.output_dir", default=None))

    def _progress(self, name: str, point_dir: str | None) -> None:
        """A sweep's progress after each point ends: points done by state, those to go, the slowest point so far;
        on a terminal with a bar and the states coloured, elsewhere (CI, Slurm logs) a plain line."""
        from rich.console import Console
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        results = outcome.point_results(Path(point_dir))[0] if point_dir else None
        ms = (results or {}).get("step_time_ms")
        if ms and (self.slowest is None or ms > self.slowest[0]):
            self.slowest = (ms, name)
        counts: dict[str, int] = {}
        for _, state in self.outcomes:
            counts[state] = counts.get(state, 0) + 1
        done = len(self.outcomes)
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        to_go = f", {self.points - done} to go" if self.points and self.points > done else ""
        slowest = f"; slowest so far {self.slowest[1]}: {self.slowest[0]:.1f} ms/step" if self.slowest else ""
        console = self.console or Console(stderr=True)
        if not console.is_terminal:
            console.file.write(f"moe_hydra.sweep: {done}{f' of {self.points}' if self.points else ''} points done "
                               f"({states}){to_go}{slowest}\n")
            console.file.flush()
            return
        text = Text(f"{done}{f'/{self.points}' if self.points else ''} points  ")
        for state, n in sorted(counts.items()):
            text.append(f"{n} {state}  ", style="green" if state in outcome.OK_STATES else "red")
        if to_go:
            text.append(f"{self.points - done} to go  ", style="dim")
        if self.slowest:
            text.append(f"slowest so far {self.slowest[1]}: {self.slowest[0]:.1f} ms/step", style="yellow")
        view = Table.grid(padding=(0, 1))
        view.add_row(Text("sweep", style="bold"), ProgressBar(total=self.points or done, completed=done, width=24),
                     text)
        console.print(view)

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        self._exit()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._exit()

    def _exit(self) -> None:
        failed = [name for name, state in self.outcomes if state not in (*outcome.OK_STATES, "PLANNED", "INVALID")]
        invalid = [name for name, state in self.outcomes if state == "INVALID"]
        if (failed or invalid) and len(self.outcomes) > 1:
            print(f"moe_hydra: {len(failed) + len(invalid)} of {len(self.outcomes)} points did not complete:\n  "
                  + "\n  ".join([f"{p} (refused)" for p in invalid] + [f"{p} (failed)" for p in failed]),
                  file=sys.stderr)
        if failed or invalid:
            sys.exit(EXIT_FAILED if failed else EXIT_REFUSED)


class Claim(Callback):
    """Hydra callback (``hydra.callbacks.claim`` in conf/config.yaml): before one run writes anything (Hydra's
    ``.hydra/`` included), its ``hydra.run.dir`` is made (a new one when it is named by the time) and held for the
    command (:mod:`moe_hydra.launch.directories`). A directory another command holds, one that holds another
    command's outcome, or one that cannot be written is refused: one message naming ``hydra.run.dir``, exit 2, the
    directory as it was. The same command again replaces its own outcome. A sweep's directory is the sweeper's to
    hold (:func:`moe_hydra.launch.points.claim`)."""

    def __init__(self) -> None:
        self.lock = None  # the held lock file, open until the command ends

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from moe_hydra.launch import directories

        try:
            run_dir = directories.pin(config, "hydra.run.dir")
            self.lock = directories.hold(run_dir, directories.RUN_LOCK, "hydra.run.dir")
            other = directories.other_run(run_dir, OmegaConf.to_container(config.hydra.overrides.task), OUTCOME_FILES)
            if other:
                raise Refused(f"{run_dir} {other}; nothing was written or launched. Start this one in a directory of "
                              f"its own: hydra.run.dir=<dir> (that command again replaces its own)")
        except Refused as e:
            print(f"moe_hydra: {e}", file=sys.stderr, flush=True)
            sys.exit(EXIT_REFUSED)


def sweep_size(task: list[str]) -> int | None:
    """The points a basic sweep of ``task`` (its command-line overrides) makes: the product of its sweep
    overrides' choices; None when one cannot be counted (an interval, the layout sweeper's search)."""
    size = 1
    try:
        for o in overrides.parse(task):
            if o.is_sweep_override():
                size *= len(list(o.sweep_iterator()))
    except Exception:  # noqa: BLE001 - an interval sweep (no iterator) or a sweep Hydra's parser refuses
        return None
    return size


def _sweep_context() -> tuple[list[str], str | None]:
    """(override keys swept by the current multirun, a name for the sweep); ([], None) for one run.

    Read from the sweep directory's multirun.yaml, which the sweeper writes before any point starts, holding the
    directory for this sweep alone (:func:`moe_hydra.launch.points.claim`).
    """
    hc = HydraConfig.get()
    if hc.mode.name != "MULTIRUN":
        return [], None
    sweep_dir = Path(hc.sweep.dir)
    swept: list[str] = []
    multirun = sweep_dir / "multirun.yaml"
    if multirun.exists():
        mr = OmegaConf.load(multirun)
        task = OmegaConf.to_container(mr.hydra.overrides.task)
        for o in overrides.parse(task):
            if o.is_sweep_override():
                swept.append(o.key_or_group)
                if o.key_or_group == "experiment":  # what the swept experiments set varies too
                    hydra_overrides = OmegaConf.to_container(mr.hydra.overrides.hydra)
                    swept += _keys_set_by("experiment", [str(v) for v in o.sweep_string_iterator()],
                                          task + hydra_overrides)
        swept += [k for k in (OmegaConf.select(mr, "hydra.sweeper.params") or {}) if k not in swept]
    return swept, f"{sweep_dir.parent.name}_{sweep_dir.name}"


def _keys_set_by(group: str, options: list[str], overrides: list[str]) -> list[str]:
    """Dotted keys and groups that the options of ``group`` set (from their YAML files, found in
    ``conf/`` and any ``hydra.searchpath`` directory): e.g. the layout search's generated experiments."""
    keys: list[str] = []
    for option in options:
        for root in _overrides.config_roots(_overrides.search_path(overrides)):
            path = Path(root) / group / f"{option}.yaml"
            if not path.exists():
                continue
            node = OmegaConf.to_container(OmegaConf.load(path))
            for entry in node.pop("defaults", None) or []:
                if isinstance(entry, dict):
                    keys += [k.split("/")[-1] for k in entry]
            stack = [("", node)]
            while stack:
                prefix, sub = stack.pop()
                for k, v in sub.items():
                    if k == "hydra":
                        continue
                    if isinstance(v, dict):
                        stack.append((f"{prefix}{k}.", v))
                    else:
                        keys.append(f"{prefix}{k}")
            break
    # a layout swept by any of its sizes is the layout swept (DP, EDP follow from them)
    return list(dict.fromkeys("parallel" if k.startswith("parallel.") else k for k in keys))


def _tracking(p: dict, swept: list[str], sweep_name: str | None, obj) -> dict:
    """W&B group (the comparison) and job_type (the arm)."""
    task = _task_overrides()
    arm = " ".join(o.lstrip("+") for o in task if o.lstrip("+").split("=", 1)[0] in swept)
    group = obj.logger.group or (f"{sweep_name}-{p['contract_hash'][:8]}" if sweep_name else p["contract_hash"])
    return {"group": group, "job_type": arm or "run", "swept": swept}


def _task_overrides() -> list[str]:
    """This point's overrides as typed: the text, never resolved (``${env:HOME}`` in a value stays text here)."""
    return OmegaConf.to_container(HydraConfig.get().overrides.task)


def _point_name() -> str:
    hc = HydraConfig.get()
    overrides = " ".join(_task_overrides()) or "(defaults)"
    return f"#{hc.job.num} {overrides}" if hc.mode.name == "MULTIRUN" else overrides


def _refuse(message: str) -> NoReturn:
    """Refuse this point: the message, then :class:`~moe_hydra.core.errors.Refused` as its JobReturn's value."""
    print(f"moe_hydra: {message}", file=sys.stderr, flush=True)
    raise Refused(message)


def _fail(message: str) -> NoReturn:
    """This point started and failed: the message, then :class:`~moe_hydra.core.errors.Failed` as its value."""
    print(f"moe_hydra: {message}", file=sys.stderr, flush=True)
    raise Failed(message)


def _typed(cfg: DictConfig):
    """The composed config as the schema's objects; a value that cannot become one (a mandatory value a
    deletion left missing, an interpolation that does not resolve) is refused naming its key."""
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "the config"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        _refuse(f"{key} cannot be read: {reason}. Nothing was launched; change the override behind {key}.")


def run_point(cfg: DictConfig) -> str:
    """One point of a run or sweep: its state (PLANNED, COMPLETED), the value of its JobReturn.

    compose (Hydra) -> resolve (the one resolved plan) -> the plan (rules, counts, estimate) -> for stage=run,
    admission (the rules, the memory estimate and this machine, every refusal at once) -> the job.

    Raises:
        Refused: the point was refused before anything started (the message is printed).
        Failed: the point started and failed.
    """
    from moe_hydra.launch.points import detach_problem

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    obj = _typed(cfg)
    if problem := detach_problem(cfg):
        _refuse(problem)
    swept, sweep_name = _sweep_context()
    snapshot = env.snapshot()
    rank = slurm.slurm_rank()
    if (rank is None and sweep_name and obj.stage is Stage.run and obj.launcher.name == "local"
            and outcome.complete_results(out_dir)):  # the same sweep again resumes it, as on Slurm (KEPT)
        log.info("kept: %s holds this point's complete results.json (the same sweep again resumes it)", out_dir)
        return "KEPT"
    if rank in (None, 0):  # the process that owns the directory
        for name in OUTCOME_FILES:
            (out_dir / name).unlink(missing_ok=True)
    # stage=run builds on this machine (or this node of a Slurm job): what it will build is detected here
    here = obj.stage in (Stage.run, Stage.calibrate) and (rank is not None or obj.launcher.name == "local")
    r = p = None
    try:
        r = resolve(obj, local.implementation(obj) if here else None)
        p = plan.make_plan(r, swept, snapshot)
        refused = []
    except LayoutError as e:
        refused = e.violations
    if here and r is not None:  # admission: the memory verdict and this machine join the rules' refusals
        too_big = plan.unfit(obj, p) if p and obj.stage is Stage.run else None
        refused += [too_big] * bool(too_big) + local.machine(r, inside_allocation=rank is not None)
    elif obj.stage is Stage.fit and (rank is not None or obj.launcher.name == "local"):  # builds ranks here
        refused += local.packages("fit")
    if refused:
        refusal = LayoutError(refused, _point_name())
        if rank in (None, 0):
            io.write_json(refusal.record(), out_dir / "violations.json")
        _refuse(refusal.report())
    p["tracking"] = _tracking(p, swept, sweep_name, obj)
    if rank is not None:  # one task of a Slurm job: this process is one rank
        return _run_slurm_task(cfg, r, p, out_dir, rank, snapshot)
    io.write_json(p, out_dir / "plan.json")
    io.write_json(snapshot, out_dir / "env.json")
    io.console().print(render.plan_table(p))
    log.info("plan written to %s", out_dir / "plan.json")
    if obj.stage is Stage.run:
        return _run_job(cfg, r, p, out_dir, snapshot)
    if obj.stage is Stage.fit:
        return _run_fit(cfg, r, p, out_dir)
    if obj.stage is Stage.calibrate:
        return _run_calibrate(cfg, r, p, out_dir, snapshot)
    return "PLANNED"


def _run_fit(cfg: DictConfig, r: Resolved, p: dict, out_dir: Path) -> str:
    """stage=fit: build the chosen ranks on the fake process group; the estimator must agree exactly."""
    from moe_hydra.job import fit

    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    report = fit.run(r, config, p, out_dir)
    io.console().print(fit.render(report))
    for note in report["notes"]:
        print(f"note: {note}")
    if report["refused"]:
        _refuse("Megatron-Core refuses this layout:\n  " + "\n  ".join(sorted(set(report["refused"])))
                + f"\n  (build logs in {out_dir / 'fit'})")
    if not report["agree"]:
        bad = [r["rank"] for r in report["ranks"] if not r["agree"]]
        _fail(f"MISMATCH between the estimator and the build on ranks {bad}: a bug in moe_hydra.core.params; "
              f"see {out_dir / 'fit.json'}")
    print(f"moe_hydra: the estimator and Megatron-Core's build agree exactly on {len(report['ranks'])} ranks "
          f"(pipeline ranks {', '.join(str(r['pp_rank']) for r in report['ranks'])})  ({out_dir / 'fit.json'})",
          flush=True)
    return "COMPLETED"


def _run_slurm_task(cfg: DictConfig, r: Resolved, p: dict, out_dir: Path, rank: int, snapshot: dict) -> str:
    """Inside a Slurm job: rank 0 owns the output directory; every rank trains. Failures raise, so
    Hydra and submitit record them for the launcher that waits on this job."""
    from moe_hydra.job.train import Stopped, worker

    if rank == 0:
        io.write_json(p, out_dir / "plan.json")
        io.write_json(snapshot, out_dir / "env.json")
    if r.cfg.stage is Stage.fit and rank == 0:  # the fit builds its ranks as processes of its own
        return _run_fit(cfg, r, p, out_dir)
    if r.cfg.stage not in (Stage.run, Stage.calibrate):
        return "PLANNED"
    slurm.task_environment()
    try:
        worker(_job_spec(cfg, r, p, out_dir, snapshot))
    except Stopped as e:
        _stopped(e.signame, e.code, out_dir)
    return "COMPLETED"


def _job_spec(cfg: DictConfig, r: Resolved, p: dict, out_dir: Path, snapshot: dict) -> dict:
    """What every rank of the job receives: the resolved plan, the plan's record, the config (for W&B), where to
    write."""
    return {"resolved": r, "plan": p, "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
            "out_dir": str(out_dir), "env": snapshot}


def _launch(cfg: DictConfig, r: Resolved, p: dict, out_dir: Path, snapshot: dict, **more: Any) -> dict:
    """Start the job's ranks here (the machine was checked), ``more`` added to their spec; rank 0's return. A failed
    or stopped job, or packages that cannot be imported here (H09), end the command as such."""
    try:
        return local.launch_local({**_job_spec(cfg, r, p, out_dir, snapshot), **more}, r.layout.world_size, out_dir)
    except local.JobFailed as e:
        _fail(str(e))
    except local.JobStopped as e:
        _stopped(e.signame, e.code, out_dir)
    except Refused as e:
        _refuse(str(e))


def _run_job(cfg: DictConfig, r: Resolved, p: dict, out_dir: Path, snapshot: dict) -> str:
    """stage=run: train, report the measured run."""
    results = _launch(cfg, r, p, out_dir, snapshot)
    loss = results["loss"]
    print(f"moe_hydra: {results['steps']} steps, window {results['window']}: step {results['step_time_ms']:.1f} ms, "
          f"{results['tokens_per_s_per_gpu']:.1f} tokens/s/GPU, {results['tflops_per_gpu']:.4f} TFLOP/s/GPU, "
          f"loss {loss['first']:.3f} -> {loss['last']:.3f}  ({out_dir / 'results.json'})", flush=True)
    predicted, carried = results.get("step_time") or {}, results.get("step_time_carried")
    if predicted.get("seconds") and predicted.get("interval_of") == "calibration":
        print(f"moe_hydra: the calibration predicted {predicted['seconds'] * 1e3:.1f} ms"
              + (f"; carried to the machine as this run found it (its reference x{carried['ratio']:.3f}): "
                 f"{carried['seconds'] * 1e3:.1f} ms" if carried else ""), flush=True)
    router = results.get("router")
    if router:  # a MoE model's routers: the worst layer's imbalance, the window's mean
        worst = next(x for x in router["layers"] if x["layer"] == router["worst_layer"])
        dropped = max(x["dropped_share"] or 0.0 for x in router["layers"])
        print("moe_hydra: routers: imbalance (max / mean tokens per expert) "
              + ", ".join(f"layer {x['layer']} {x['imbalance']:.2f}" for x in router["layers"])
              + f"; worst layer {worst['layer']}, EP ranks {worst['ep_imbalance']:.2f}"
              + (f"; up to {dropped:.1%} of routed slots dropped" if dropped else ""), flush=True)
    print(f"moe_hydra: {steady_line(results)}", flush=True)
    return "COMPLETED"


def steady_line(results: dict) -> str:
    """The run's last line: the judgment of its step times and whether its window is steady."""
    from moe_hydra.core import steady

    j = steady.of_results(results)
    how = "contract.window=auto" if results.get("window_declared") == steady.AUTO else "declared window"
    return f"steady: {j.describe()} ({how})"


def _run_calibrate(cfg: DictConfig, r: Resolved, p: dict, out_dir: Path, snapshot: dict) -> str:
    """stage=calibrate: the job's processes measure this machine (moe_hydra.job.calibrate), launched once a layout
    (``calibrate.parts``: a layout measured after others in one process steps slower than alone); calibration.json
    from what they found, fitted here."""
    from moe_hydra.job import calibrate

    t0 = time.perf_counter()
    found = [_launch(cfg, r, p, out_dir, snapshot, **{calibrate.PART: part}) for part in calibrate.parts(r)]
    record = calibrate.write(r, p.get("implementation"), found, out_dir, time.perf_counter() - t0,
                             calibrate.PER_LAYOUT)
    print(f"moe_hydra: {len(record['measurements'])} measurements on {record['machine']['processes']} processes in "
          f"{record['seconds']:.1f} s  ({out_dir / 'calibration.json'})", flush=True)
    return "COMPLETED"


def _stopped(signame: str, code: int, out_dir: Path) -> NoReturn:
    """A signal stopped the job after its ranks recorded what they measured: one line, then the conventional
    exit code (128 + the signal's number) for the whole command; a sweep stops here too."""
    res = out_dir / "results.json"
    print(f"moe_hydra: stopped by {signame}; {res} holds the steps measured so far", file=sys.stderr, flush=True)
    raise SystemExit(code)


@hydra.main(config_path=f"pkg://{CONF_PACKAGE}", config_name="config", version_base="1.3")
def _hydra_app(cfg: DictConfig) -> str:
    return run_point(cfg)


def main(argv: list[str], prog: str = "python -m moe_hydra") -> int:
    """Check the overrides, then hand the command line to Hydra; the exit code. It comes from the points'
    JobReturns (:class:`Outcomes`), or is 2 for an override that moe_hydra or Hydra refuses before any point
    starts."""
    from moe_hydra.launch import layout_sweeper, points

    register_configs()
    slurm.register()
    layout_sweeper.register()
    points.register()
    site_settings()  # a MOE_HYDRA_SITE that names no directory, or a site file that is not YAML: refused here
    args = _overrides.normalize(argv)
    problems = _overrides.check_overrides(args)
    if problems:
        print("moe_hydra: " + "\n  ".join(problems), file=sys.stderr)
        return EXIT_REFUSED
    sys.argv[:] = [prog, *args]  # Hydra reads its command line there
    try:
        _hydra_app()
    except SystemExit as e:
        # Hydra reports an override it cannot read or compose (a value of the wrong type for its key) itself, then
        # exits 1 from inside its handler of that error: the error is the exit's __context__. Nothing started.
        if e.code == EXIT_FAILED and isinstance(e.__context__, (OverrideParseException, ConfigCompositionException)):
            return EXIT_REFUSED
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_FAILED)
    return EXIT_OK
