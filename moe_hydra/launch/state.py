"""Outcomes of the points of a run or sweep, told truthfully, and ``python -m moe_hydra.sweep status``.

A point's state comes from what it left behind (``results.json``, ``violations.json``) and, on
Slurm, from Slurm itself (sacct through submitit) — never from a log line that says "completed".

``sweep.json`` (in the sweep directory) holds one entry per point:
    num, overrides, dir, state, slurm_job_id, step_time_ms, tokens_per_s_per_gpu, error, logs
States: COMPLETED (results.json status ok), KEPT (a complete results.json from an earlier launch
into the same directory), INVALID (refused before launch), INTERRUPTED and TERMINATED (results.json status
interrupted or terminated: stopped by SIGINT, or by SIGTERM/SIGUSR2, with the steps measured so far), FAILED,
TIMEOUT, CANCELLED, OUT_OF_MEMORY, PENDING, RUNNING, UNKNOWN (Slurm's own names where Slurm decided; UNKNOWN
also for a results.json that fails its schema, :mod:`moe_hydra.core.results`, with the warning as the error).
A local multirun writes no ``sweep.json``: ``status`` reads its point directories instead, where a
``stage=plan`` point is PLANNED.

    python -m moe_hydra.sweep status outputs/multirun/<date>/<time>
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.core.io import console, read_json, write_json
from moe_hydra.core.results import OK, STOPPED
from moe_hydra.core.results import read as read_results

OK_STATES = ("COMPLETED", "KEPT")
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING")
STOPPED_STATES = {status: status.upper() for status in STOPPED}  # results.json status -> state: INTERRUPTED, ...


# ----------------------------------------------------------------------------- outcomes as Hydra JobReturns
# A point's outcome travels to the app the way Hydra carries any job's: a JobReturn, its status COMPLETED with
# the state as the value (COMPLETED, KEPT, PLANNED), or FAILED with one of these exceptions as the value.


class Refused(Exception):
    """The point was refused before anything started (the rules, the memory estimate, this machine)."""

    state = "INVALID"


class Failed(Exception):
    """The point started and did not complete; ``state`` is Slurm's word for it where Slurm decided."""

    def __init__(self, message: str, state: str = "FAILED"):
        super().__init__(message)
        self.state = state


def job_return(overrides: list[str], state: str, error: str | None = None, point_dir: str | None = None):
    """The JobReturn a launcher hands Hydra for a point it settled itself (Slurm, the layout search);
    ``point_dir``: the point's output directory."""
    from hydra.core.utils import JobReturn, JobStatus

    if state in (*OK_STATES, "PLANNED"):
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=state, working_dir=point_dir)
    value = Refused(error or "refused") if state == "INVALID" else Failed(error or state, state)
    return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=value, working_dir=point_dir)


def output_dir(ret) -> Path | None:
    """Where a point's files are: Hydra's runtime output directory of a job it ran, else the directory a
    launcher recorded for a point it settled."""
    if ret.hydra_cfg is not None:
        return Path(ret.hydra_cfg.hydra.runtime.output_dir)
    return Path(ret.working_dir) if ret.working_dir else None


def state_of(ret) -> str:
    """A JobReturn's state in sweep.json's vocabulary."""
    from hydra.core.utils import JobStatus

    if ret.status is JobStatus.COMPLETED:
        value = ret._return_value
        return value if isinstance(value, str) else "COMPLETED"
    return getattr(ret._return_value, "state", "FAILED")


@dataclass
class Point:
    num: int
    overrides: list[str]
    dir: str
    state: str = "UNKNOWN"
    slurm_job_id: str | None = None
    step_time_ms: float | None = None
    tokens_per_s_per_gpu: float | None = None
    error: str | None = None
    logs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in (*OK_STATES, "PLANNED")


def point_results(point_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The point's results.json read through its schema: ``(results, None)``, ``(None, warning)`` naming the file
    and the field when it fails it, ``(None, None)`` when there is none."""
    path = point_dir / "results.json"
    return read_results(path) if path.exists() else (None, None)


def complete(res: dict[str, Any] | None) -> dict[str, Any] | None:
    """``res`` (results read by :func:`point_results`) when it records a complete, successful run."""
    return res if res and res["status"] == OK and res.get("stage") == "run" else None


def complete_results(point_dir: Path) -> dict[str, Any] | None:
    """The point's results.json when it records a complete, successful run."""
    return complete(point_results(point_dir)[0])


def results_outcome(read: tuple[dict[str, Any] | None, str | None]) -> tuple[str, str] | None:
    """(state, error) that results.json (``read``: :func:`point_results`' pair) tells of a run that did not
    complete: INTERRUPTED or TERMINATED with the signal and the steps measured, FAILED with the error, UNKNOWN with
    the warning of a file that fails its schema; None without results.json or when it records a complete run."""
    res, warning = read
    if warning:
        return "UNKNOWN", f"results.json unusable: {warning}"
    if res is None or res["status"] == OK:
        return None
    if res["status"] in STOPPED:
        return STOPPED_STATES[res["status"]], (f"stopped by {res.get('signal') or 'a signal'} after {res['steps']} "
                                               f"steps (results.json status {res['status']})")
    return "FAILED", (f"{res.get('error') or 'results.json: status ' + res['status']}\n"
                      f"{res.get('traceback') or ''}").strip()


def fill_from_results(p: Point, res: dict[str, Any] | None) -> None:
    if res:
        p.step_time_ms = res.get("step_time_ms")
        p.tokens_per_s_per_gpu = res.get("tokens_per_s_per_gpu")


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError:
        return ""


def write_sweep(sweep_dir: Path, points: list[Point]) -> Path:
    path = sweep_dir / "sweep.json"
    write_json({"points": [asdict(p) for p in sorted(points, key=lambda p: p.num)]}, path)
    return path


def varying(points: list[Point]) -> dict[int, str]:
    """Per point, the overrides that differ between the points (the swept ones); all when alone."""
    common = set.intersection(*(set(p.overrides) for p in points)) if len(points) > 1 else set()
    return {p.num: " ".join(o for o in p.overrides if o not in common) for p in points}


def render(points: list[Point], title: str):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("#", "swept", "state", "slurm job", "step ms", "tokens/s/GPU", "error / directory"):
        t.add_column(col, overflow="fold")
    style = {"COMPLETED": "green", "KEPT": "green", "INVALID": "yellow"}
    swept = varying(points)
    for p in sorted(points, key=lambda p: p.num):
        first_error = [line for line in (p.error or "").strip().splitlines() if line.strip()][:1] or [""]
        t.add_row(str(p.num), swept[p.num], f"[{style.get(p.state, 'red')}]{p.state}",
                  p.slurm_job_id or "", f"{p.step_time_ms:.1f}" if p.step_time_ms else "",
                  f"{p.tokens_per_s_per_gpu:.1f}" if p.tokens_per_s_per_gpu else "",
                  first_error[0] if not p.ok else p.dir)
    return t


def _sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Slurm's current state of each job id (array tasks included); empty without sacct."""
    if not job_ids:
        return {}
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        states[job.strip()] = state.split()[0] if state else "UNKNOWN"
    return states


def status(sweep_dir: Path) -> list[Point]:
    """The sweep's points, refreshed from the files they wrote and from Slurm."""
    data = read_json(sweep_dir / "sweep.json")
    if data is None:
        return local_points(sweep_dir)
    points = [Point(**p) for p in data["points"]]
    live = _sacct_states([p.slurm_job_id for p in points if p.slurm_job_id and p.state in ACTIVE_STATES])
    for p in points:
        read = point_results(Path(p.dir))
        res = complete(read[0])
        if res:
            p.state = p.state if p.state == "KEPT" else "COMPLETED"
            fill_from_results(p, res)
        elif p.slurm_job_id in live:
            p.state = live[p.slurm_job_id]
        elif p.state in ("FAILED", "UNKNOWN", *OK_STATES, *ACTIVE_STATES) and (told := results_outcome(read)):
            p.state, p.error = told  # what the run wrote; Slurm's own word (TIMEOUT, CANCELLED, ...) stays
    return points


def local_points(sweep_dir: Path) -> list[Point]:
    """The points of a sweep that has no ``sweep.json`` (a local multirun), read from their directories: every job
    directory Hydra made for a point (``.hydra/``: its number, overrides and stage) and the files the point wrote.
    A point Hydra could not compose has no directory; the sweep's own summary named it.

    Raises:
        FileNotFoundError: ``sweep_dir`` has neither ``sweep.json`` nor a point directory.
    """
    from omegaconf import OmegaConf

    points = []
    for hydra_dir in sorted(sweep_dir.glob("*/.hydra")):
        num = OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.job.num", default=None)
        if num is None:  # a single run's directory
            continue
        p = Point(num=num, overrides=list(OmegaConf.load(hydra_dir / "overrides.yaml")), dir=str(hydra_dir.parent))
        read, stage = point_results(hydra_dir.parent), OmegaConf.load(hydra_dir / "config.yaml").get("stage")
        p.state, p.error = _local_outcome(hydra_dir.parent, stage, read)
        fill_from_results(p, complete(read[0]))
        points.append(p)
    if not points:
        raise FileNotFoundError(f"{sweep_dir} has no sweep.json and no point directories (is this a sweep directory?)")
    return points


def _local_outcome(point_dir: Path, stage: str | None, read: tuple[dict[str, Any] | None, str | None]
                   ) -> tuple[str, str | None]:
    """(state, error) of a point from the files it wrote: results.json (stage=run; ``read``: :func:`point_results`'
    pair), fit.json (stage=fit), violations.json (refused), plan.json (stage=plan)."""
    if complete(read[0]):
        return "COMPLETED", None
    refusal = read_json(point_dir / "violations.json")
    if refusal:
        return "INVALID", "\n".join(f"[{v['rule']}] {v['message']}" for v in refusal.get("violations", []))
    told = results_outcome(read)
    if told:
        return told
    fit = read_json(point_dir / "fit.json") if stage == "fit" else None
    if fit:
        if fit.get("agree"):
            return "COMPLETED", None
        if fit.get("refused"):
            return "INVALID", "\n".join(fit["refused"])
        return "FAILED", f"the estimator and Megatron-Core's build disagree (see {point_dir / 'fit.json'})"
    if stage == "plan" and (point_dir / "plan.json").exists():
        return "PLANNED", None
    return "UNKNOWN", f"no outcome yet: running, or stopped before writing one (see {point_dir / 'app.log'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_hydra.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="per-point state, errors and logs of a sweep directory")
    st.add_argument("sweep_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        points = status(args.sweep_dir)
    except FileNotFoundError as e:
        print(f"moe_hydra.sweep: {e}", file=sys.stderr)
        return 2
    out = console()
    out.print(render(points, f"sweep {args.sweep_dir}"))
    for p in points:
        if not p.ok and p.state not in ACTIVE_STATES:
            out.print(f"[bold]#{p.num} {p.state}[/bold] {' '.join(p.overrides)}", highlight=False)
            if p.error:
                out.print(p.error, highlight=False, markup=False)
            for log in p.logs:
                out.print(f"  log: {log}", highlight=False)
    done = sum(p.ok for p in points)
    out.print(f"{done} of {len(points)} points complete")
    return 0 if done == len(points) else 1

