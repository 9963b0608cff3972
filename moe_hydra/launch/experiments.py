"""The experiments a loop runs (tune, bisect): each one a moe_hydra command line, run in a directory of its own under
the loop's, as a person would type it — so every experiment is a run or sweep the other commands read (compare,
sweep status, export), launched through the configured launcher (local processes, or Slurm attached or detached).

- :meth:`Driver.run`: one run, as a sweep of one point (so that it goes through the launcher: on Slurm, to the
  cluster; its files in ``<dir>/0``, :func:`job_dir`), or a sweep (the layout search);
- :meth:`Driver.ab`: a sequential A/B of two override sets (``repeat=auto``: the group-sequential test of
  :mod:`moe_hydra.launch.sequential`), the arms written as ``experiment`` options so that any two sets of
  overrides, not only one key's values, are one sweep; its ``sequential.json`` is the verdict.

The journal is the state: every experiment is recorded (:class:`Experiment`: its command, directory, status,
seconds and GPU-hours) as it starts and as it ends, so the same loop again skips what ended and runs again, into
the same directory, what did not: a sweep resumes there (its complete points are kept), and a detached Slurm round
that is still out is followed instead of queued twice.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from moe_hydra.core import io, overrides
from moe_hydra.core.errors import Refused, Terminated
from moe_hydra.core.schema import conf_dir
from moe_hydra.core.steady import AUTO
from moe_hydra.launch import compose, ledger
from moe_hydra.launch.outcome import DONE_STATES, complete_results

ENDED = ("done", "failed", "refused")  # an experiment in one of these states is never run again
# Overrides that say how a loop's experiments run, not what they run: every experiment takes them as they are
RUN_HOW = ("launcher", "logger", "hydra", "compare", "contract", "tune", "bisect", "stage", "repeat", "profile")


def is_how(o: str) -> bool:
    """Whether the override ``o`` says how the experiments run (launcher, logger, contract...), not what."""
    return overrides.key(o).split(".")[0].split("/")[0] in RUN_HOW


def with_window(how: list[str], window: Any) -> list[str]:
    """The run-how overrides with the steady window of a loop's short runs: ``auto`` (each run steps until its step
    times are steady, moe_hydra.core.steady), or [first, last] (warmup: the steps before)."""
    if window == AUTO:
        return [*how, f"contract.window={AUTO}"]
    first, last = window
    return [*how, f"contract.warmup_steps={first - 1}", f"contract.window=[{first},{last}]"]


def plan_arm(arm: list[str]) -> dict[str, Any]:
    """An arm as a loop would launch it (its overrides with the run-how ones; Hydra's own are left out), planned in
    this process: ``violations`` (the rules', and for the local launcher this machine's checks H01..; empty when it
    can run), ``cfg`` (the composed config, when it composes), ``resolved`` (when it resolves), and the ``rules``
    broken and the dotted keys they name (``fields``)."""
    from moe_hydra.core.resolved import resolve
    from moe_hydra.core.violations import LayoutError
    from moe_hydra.planning import plan

    try:
        cfg = compose.compose_typed([o for o in arm if not overrides.key(o).startswith("hydra")])
    except Exception as e:  # noqa: BLE001 - Hydra's and omegaconf's composition errors: the arm is refused
        return {"violations": [f"does not compose: {str(e).splitlines()[0]}"]}
    try:
        r = resolve(cfg)
        violations = plan.run_violations(r)
    except LayoutError as e:
        return {"violations": [_line(v) for v in e.violations], "cfg": cfg, **_named(e.violations)}
    if not violations and cfg.launcher.name == "local":  # the runs are this machine's: its checks (H01..)
        from moe_hydra.launch import local

        violations = local.machine(r)
    return {"violations": [_line(v) for v in violations], "cfg": cfg, "resolved": r, **_named(violations)}


def _line(v: Any) -> str:
    return v.line() if hasattr(v, "line") else str(v)


def _named(violations: list[Any]) -> dict[str, list[str]]:
    """The rules the violations break (``rules``) and the dotted keys they name (``fields``)."""
    return {"rules": sorted({v.rule for v in violations if hasattr(v, "rule")}),
            "fields": sorted({k for v in violations for k, _ in getattr(v, "fields", ())})}


def open_journal(path: Path, fresh: dict[str, Any], other: Callable[[dict[str, Any]], str | None], what: str,
                 option: str, lock: Any) -> dict[str, Any]:
    """A loop's journal: ``fresh`` when ``path`` does not exist, else the one there (its status running again).
    ``other``: None when the journal there is this loop's, else what it is ("started from ...").

    Raises:
        Refused: it is not a JSON object, or it is another loop's; ``lock`` (the directory's) is released first, so
            that a refusal leaves the directory as it was.
    """
    if not path.exists():
        return fresh
    try:
        journal = json.loads(io.read_named(path, f"the {what} journal"))
        if not isinstance(journal, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        lock.close()
        raise Refused(f"{path}: not a {what} journal ({e}); move it away to start a new {what} there") from None
    said = other(journal)
    if said is not None:
        lock.close()
        raise Refused(f"{path.parent} holds another {what} ({said}); start this one in a directory of its own: "
                      f"{option} (that {what}'s own command resumes it)")
    journal["status"] = "running"
    return journal


class Queued(Exception):
    """An experiment queued on Slurm (detached): the loop saves its journal and returns (exit 0), and the same
    command continues it once the experiment has run."""

    def __init__(self, experiment: Experiment):
        super().__init__(experiment.name)
        self.experiment = experiment


@dataclass
class Experiment:
    """One experiment of a loop, as its journal records it."""

    name: str
    kind: str  # run | ab | sweep
    dir: str
    command: list[str]
    status: str = "started"  # started | queued | done | failed | refused
    exit_code: int | None = None
    seconds: float = 0.0
    gpu_hours: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)  # what the loop read back (verdict, step time, ...)
    error: str | None = None


class Driver:
    """Runs a loop's experiments under ``root``, recording each in ``journal`` (a dict with an ``experiments``
    mapping, saved by ``save()`` after every change); ``gpus``: the processes (GPUs) one run holds."""

    def __init__(self, root: Path, journal: dict[str, Any], save: Callable[[], None], gpus: int,
                 on_start: Callable[[Experiment], None] = lambda e: None,
                 wait: Callable[[subprocess.Popen, Experiment], int] = lambda proc, e: proc.wait()):
        self.root, self.journal, self.save, self.gpus, self.on_start = root, journal, save, gpus, on_start
        self.wait = wait  # waits for an experiment's process (a loop shows its progress meanwhile)
        journal.setdefault("experiments", {})

    # ------------------------------------------------------------------ bookkeeping

    def get(self, name: str) -> Experiment | None:
        entry = self.journal["experiments"].get(name)
        return Experiment(**entry) if entry else None

    def _put(self, e: Experiment) -> None:
        self.journal["experiments"][e.name] = asdict(e)
        self.save()

    @property
    def gpu_hours(self) -> float:
        return sum(e.get("gpu_hours") or 0.0 for e in self.journal["experiments"].values())

    def _launch(self, e: Experiment, read: Callable[[Experiment], None]) -> Experiment:
        """Run ``e``'s command (again, into its directory, when it did not end before), then ``read`` its outcome."""
        done = self.get(e.name)
        if done and done.status in ENDED:
            return done
        if done and done.status == "queued" and done.kind == "run" and not still_out(Path(done.dir)):
            return self._settled(done, read)
        if done:  # started before and did not end: the same command again, into the same directory
            e.seconds, e.gpu_hours = done.seconds, done.gpu_hours
        e.status = "started"
        self._put(e)
        self.on_start(e)
        log = Path(e.dir + ".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(log, "a") as out:
            proc = subprocess.Popen([sys.executable, "-m", "moe_hydra", *e.command], stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                e.exit_code = self.wait(proc, e)
            except (KeyboardInterrupt, Terminated):  # the loop stops: its experiment stops with it, recorded
                proc.terminate()
                proc.wait()
                raise
            finally:
                elapsed = time.monotonic() - start
                e.seconds += elapsed
                e.gpu_hours += elapsed * self.gpus / 3600
                self._put(e)
        self._slurm_hours(e)
        read(e)
        if e.status == "started":
            e.status = "done" if e.exit_code == 0 else "refused" if e.exit_code == 2 else "failed"
        if e.status in ("failed", "refused") and not e.error:
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
            e.error = " | ".join(tail)[-400:]
        self._put(e)
        return e

    def _slurm_hours(self, e: Experiment) -> None:
        """On Slurm the GPUs are held by the jobs, not by this process: GPU-hours from each point's Elapsed
        (sweep.json, every round of an A/B) x the GPUs a run holds."""
        points = (ledger.read_sweep(Path(e.dir)) or {}).get("points") or []
        elapsed = [p.get("elapsed_s") for p in points if isinstance(p, dict) and p.get("slurm_job_id")]
        if elapsed:
            e.gpu_hours = sum(x or 0 for x in elapsed) * self.gpus / 3600

    def _settled(self, e: Experiment, read: Callable[[Experiment], None]) -> Experiment:
        """A run queued on Slurm that has ended there: its outcome read from sweep.json and its files, never run
        again (a stage=fit point has no results.json that would keep it)."""
        points = (ledger.read_sweep(Path(e.dir)) or {}).get("points") or [{}]
        state = points[0].get("state") if isinstance(points[0], dict) else None
        e.status, e.exit_code = "started", 0 if state in DONE_STATES else 1
        self._slurm_hours(e)
        read(e)
        e.status = "done" if state in DONE_STATES else "failed"
        if e.status == "failed":
            e.error = f"{state} on Slurm: {points[0].get('error') or 'see python -m moe_hydra.sweep status ' + e.dir}"
        self._put(e)
        return e

    # ------------------------------------------------------------------ experiments

    def run(self, name: str, args: list[str], sweep: bool = False) -> Experiment:
        """``python -m moe_hydra ARGS -m`` into ``<root>/<name>`` (``hydra.sweep.dir``): a sweep, or one run as a
        sweep of one point (:func:`job_dir`), so that it goes through the configured launcher (Slurm included);
        ``result`` holds that run's results.json figures (``step_time_ms``...) once it completed. Detached on
        Slurm, an experiment whose points are still out is ``queued``."""
        d = self.root / name
        command = [*args, f"hydra.sweep.dir={d}", "-m"]

        def read(e: Experiment) -> None:
            res = None if sweep else complete_results(job_dir(e))
            if res:
                e.result = {k: res.get(k) for k in ("step_time_ms", "step_time_ms_std", "tokens_per_s_per_gpu",
                                                    "tflops_per_gpu", "window_measured", "label")}
            elif e.exit_code == 0 and still_out(d):
                e.status = "queued"

        return self._launch(Experiment(name, "sweep" if sweep else "run", str(d), command), read)

    def ab(self, name: str, a: list[str], b: list[str], common: list[str], max_repeats: int,
           futility: float | None = None) -> Experiment:
        """B against A with repeat=auto: ``a``, ``b`` the arms' overrides (written as the options
        ``tune_a``/``tune_b`` of the ``experiment`` group in ``<dir>/search``), ``common`` the overrides both take
        on the command line (launcher, logger, contract); ``futility``: stop once a gain of B this large is ruled
        out (compare.futility: an A/B that only wants "faster"); ``result``: the verdict, the change in the figure
        judged with the interval beside it, each arm's mean step time and runs."""
        d = self.root / name
        common = [*common, *self.pooled_noise(name, common)]
        search = d / "search" / "experiment"
        for arm, overs in (("tune_a", a), ("tune_b", b)):
            io.write_text(search / f"{arm}.yaml", experiment_yaml(overs, f"arm {arm[-1].upper()} of {name}"))
        command = [*common, f"hydra.searchpath=[file://{(d / 'search').resolve()}]", "experiment=tune_a,tune_b",
                   "repeat=auto", f"compare.max_repeats={max_repeats}",
                   *([f"compare.futility={futility}"] if futility is not None else []), f"hydra.sweep.dir={d}", "-m"]

        def read(e: Experiment) -> None:
            e.result = verdict(d)
            if e.result.get("status") == "queued":
                e.status = "queued"

        return self._launch(Experiment(name, "ab", str(d), command), read)


    def pooled_noise(self, name: str, common: list[str]) -> list[str]:
        """``compare.noise_file`` for the A/B ``name``: the run-to-run noise pooled from the runs of every A/B this
        loop ended before it (each arm a config; relative noise, :func:`moe_hydra.analysis.noise.measure`), so that
        its test starts from what is known of the noise instead of its own first runs. Written once, to
        ``noise/<name>.json``, and read again when the A/B resumes. None while the ended A/Bs give fewer than 2
        degrees of freedom, or when ``common`` names a noise file of its own."""
        from moe_hydra.analysis import noise as noises

        if any(overrides.key(o) == noises.CONFIG_KEY for o in common):
            return []
        path = self.root / "noise" / f"{name}.json"
        if not path.exists():
            from moe_hydra.analysis.runs import load
            from moe_hydra.core import contract

            dirs = [Path(e["dir"]) for e in self.journal["experiments"].values()
                    if e["kind"] == "ab" and e["status"] == "done" and e["name"] != name]
            groups: dict[str, list[Any]] = {}
            for r in load(dirs, lambda message: None).runs if dirs else []:
                groups.setdefault(contract.digest(r.results["contract"]), []).append(r)
            repeated = [g for g in groups.values() if len(g) >= 2]
            if sum(len(g) - 1 for g in repeated) < 2:
                return []
            try:
                _, record = noises.measure(repeated, dirs, relative=True)
            except Refused:  # runs of one step: nothing to pool
                return []
            io.write_json(record, path)
        return [overrides.override(noises.CONFIG_KEY, str(path.resolve()))]


def ready(e: Experiment) -> Experiment:
    """``e``, unless it is queued on Slurm (detached): then :class:`Queued`, and the loop returns until it has run."""
    if e.status == "queued":
        raise Queued(e)
    return e


def job_dir(e: Experiment) -> Path:
    """Where a run experiment's files are (its one point's directory); a sweep's own directory."""
    return Path(e.dir) / "0" if e.kind == "run" else Path(e.dir)


def still_out(sweep_dir: Path) -> bool:
    """Whether a Slurm sweep has points queued or running (sweep.json); never for a local one."""
    sweep = ledger.read_sweep(sweep_dir) or {"points": []}
    try:
        return any(ledger.Point.from_json(p).active for p in sweep["points"])
    except ValueError:  # a sweep.json this version cannot read: the sweep command says what is wrong with it
        return False


def experiment_yaml(overs: list[str], title: str) -> str:
    """Overrides as an option of the ``experiment`` group: config groups as the defaults list's overrides, values as
    the tree they set (as the layout search writes its top layouts)."""
    parsed = overrides.parse(overs)
    groups = [(o.key_or_group, o.value()) for o in parsed if is_group(o.key_or_group)]
    values = [o.input_line for o in parsed if not is_group(o.key_or_group)]
    lines = ["# @package _global_", f"# {title}: {' '.join(overs) or '(defaults)'}"]
    if groups:
        lines.append("defaults:\n" + "\n".join(f"  - override /{g}: {v}" for g, v in groups))
    tree = overrides.tree(values) if values else {}
    return "\n".join(lines) + "\n" + (OmegaConf.to_yaml(tree) if tree else "")


def is_group(key: str) -> bool:
    """A config group of moe_hydra's (``recompute``, ``mesh``: a directory of conf/), not a dotted key."""
    return "." not in key and (conf_dir() / key.lstrip("+~")).is_dir()


def verdict(sweep_dir: Path) -> dict[str, Any]:
    """repeat=auto's record of a sweep (sequential.json), read for a loop: status, verdict, the figure and its change
    with the interval beside the verdict, runs per arm and each arm's mean step time over its runs."""
    path = sweep_dir / "sequential.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "missing", "verdict": None}
    pair = (rec.get("pairs") or [{}])[0]
    means: dict[str, list[float]] = {}
    for rnd in rec.get("rounds") or []:
        for p in rnd.get("points") or []:
            if p.get("mean_ms") is not None:
                means.setdefault(p["arm"], []).append(p["mean_ms"])
    arms = rec.get("arms") or []
    mean = {a: sum(v) / len(v) for a, v in means.items()}
    return {"status": rec.get("status"), "verdict": pair.get("verdict"), "metric": pair.get("metric"),
            "rel_step_time": pair.get("rel_step_time"), "rel_tokens_per_s_per_gpu":
            pair.get("rel_tokens_per_s_per_gpu"), "interval": pair.get("verdict_ci"), "interval_is":
            pair.get("verdict_ci_is"), "runs": pair.get("runs"), "runs_needed": pair.get("runs_needed"),
            "futile": pair.get("futile"), "gain_bound": pair.get("gain_bound"),
            "step_time_ms": [mean.get(a) for a in arms], "file": str(path)}


def shell(args: list[str]) -> str:
    """A command line as a person would paste it."""
    return "python -m moe_hydra " + " ".join(shlex.quote(a) for a in args)
