"""Outcomes of the points of a run or sweep, told truthfully, and ``python -m moe_hydra.sweep status|wait|cancel``.

A point's state comes from what it left behind (``results.json``, ``violations.json``, submitit's result pickle,
``attempts.json``) and, on Slurm, from Slurm itself through submitit's own job objects (``SlurmJob(folder,
id)``, one ``sacct`` for every job of the sweep through its watcher's cache, and one ``squeue`` for those it
calls still out: :func:`queued`) — never from a log line that says
"completed", and never from the memory of the process that submitted it: a campaign is followed from another
shell, another login, after the submitting process is gone.

``sweep.json`` (in the sweep directory; written when the points are queued, refreshed by ``status``/``wait``):
    sweep_version 2, submitted_at, detached, follow (the commands), updated_at, and per point:
    num, overrides, dir, state, slurm_job_id, submitit_folder, submitted_at, nodes, elapsed_s, last_step,
    attempts, step_time_ms, tokens_per_s_per_gpu, error, logs
States: COMPLETED (results.json status ok), KEPT (a complete results.json from an earlier launch into the same
directory), INVALID (refused before launch), INTERRUPTED and TERMINATED (results.json status interrupted or
terminated: stopped by SIGINT, or by SIGTERM/SIGUSR2, with the steps measured so far), FAILED, and Slurm's own
words where Slurm decided: PENDING, RUNNING, REQUEUED, TIMEOUT, CANCELLED, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY,
...; UNKNOWN (also for a results.json that fails its schema, :mod:`moe_hydra.core.results`, with the warning as
the error). A local multirun writes no ``sweep.json``: ``status`` reads its point directories instead, where a
``stage=plan`` point is PLANNED.

    python -m moe_hydra.sweep status outputs/multirun/<date>/<time>    # live states, errors, logs (exit 1: one failed)
    python -m moe_hydra.sweep wait   outputs/multirun/<date>/<time>    # until every point ends; exit as the sweep
    python -m moe_hydra.sweep cancel outputs/multirun/<date>/<time>    # scancel what is queued or running
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator

from moe_hydra.core.io import console, read_json, write_json
from moe_hydra.core.results import OK, STOPPED
from moe_hydra.core.results import read as read_results

DONE_STATES = ("COMPLETED", "KEPT")  # the point's measurement is there
SUBMITTED = "SUBMITTED"  # a detached launch queued the point: the command that queued it succeeded
OK_STATES = (*DONE_STATES, SUBMITTED)  # states a command ends with exit 0 (app.Outcomes)
# Slurm's states of a job that is not over (submitit's own list of incomplete states, less PREEMPTED, which is final
# unless Slurm requeues the job, and then reads REQUEUED / PENDING again)
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "READY")
STOPPED_STATES = {status: status.upper() for status in STOPPED}  # results.json status -> state: INTERRUPTED, ...
SWEEP_FILE = "sweep.json"
ATTEMPTS_FILE = "attempts.json"  # in a point's directory: one entry per Slurm attempt (requeues)
SWEEP_VERSION = 2
# submitit's watcher asks sacct about every job of the sweep at once, at 2, 4, 8, ... s after the last submission and
# then at most every POLL_S; submitit.helpers.monitor_jobs refuses to poll more often than every 30 s
POLL_S = 30
SACCT_FIELDS = "JobID,State,NodeList,Elapsed,Start,ExitCode"
SQUEUE_FORMAT = "%i|%T|%N"  # with -r: one line per array task, <array id>_<task>, as sacct's JobID
STEP_LINE = re.compile(rb"^step\s+(\d+)\s+loss", re.MULTILINE)  # rank 0's metric lines (moe_hydra.core.metrics)
ATTEMPT_ENDS = (b"moe_hydra: stopped by", b" CANCELLED AT ")  # the run's own last line; slurmstepd's on a requeue


# ----------------------------------------------------------------------------- outcomes as Hydra JobReturns
# A point's outcome travels to the app the way Hydra carries any job's: a JobReturn, its status COMPLETED with
# the state as the value (COMPLETED, KEPT, PLANNED, SUBMITTED), or FAILED with one of these exceptions as the value.


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


def refuse(hydra_context: Any, config: Any, overrides: list[str], message: str) -> Any:
    """Refuse a point (or, named by ``overrides``, the whole sweep) before anything of it starts: the message,
    then its JobReturn (state INVALID) handed to Hydra's callbacks, as a launched point's would be."""
    print(f"moe_hydra: {message}", file=sys.stderr, flush=True)
    ret = job_return(overrides, "INVALID", message)
    hydra_context.callbacks.on_job_end(config=config, job_return=ret)
    return ret


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
    # submitit's folder for this point's job (its script, logs and result pickle); %j stands for the job id
    submitit_folder: str | None = None
    submitted_at: str | None = None
    nodes: str | None = None  # Slurm's node list
    elapsed_s: int | None = None  # Slurm's Elapsed of the current (or last) attempt
    last_step: int | None = None  # the last training step rank 0 logged (a running point)
    attempts: int | None = None  # Slurm attempts that started (> 1: requeued)

    @property
    def ok(self) -> bool:
        return self.state in (*DONE_STATES, "PLANNED")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Point:
        """An entry of sweep.json (any version: keys it lacks take their defaults, unknown keys are left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in entry.items() if k in known})


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
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
        return "\n".join(text.rstrip().splitlines()[-lines:])
    except OSError:
        return ""


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- sweep.json


@contextlib.contextmanager
def _locked(sweep_dir: Path) -> Iterator[None]:
    """Hold ``<sweep dir>/.sweep.json.lock`` for one read-modify-write of sweep.json (the launcher, and any number
    of ``status``/``wait`` in other shells, each write it); a file system without flock goes unlocked."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".sweep.json.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def read_sweep(sweep_dir: Path) -> dict[str, Any] | None:
    data = read_json(sweep_dir / SWEEP_FILE)
    return data if isinstance(data, dict) and isinstance(data.get("points"), list) else None


def write_sweep(sweep_dir: Path, points: list[Point], **meta: Any) -> Path:
    """Write sweep.json: ``points``, the top-level fields already there, ``meta`` over them."""
    path = sweep_dir / SWEEP_FILE
    with _locked(sweep_dir):
        old = read_sweep(sweep_dir) or {}
        top = {k: v for k, v in old.items() if k != "points"}
        top.update(meta, sweep_version=SWEEP_VERSION, updated_at=now())
        write_json({**top, "points": [asdict(p) for p in sorted(points, key=lambda p: p.num)]}, path)
    return path


def _save_refreshed(sweep_dir: Path, points: list[Point]) -> None:
    """Write what a refresh learnt back to sweep.json, entry by entry, only where the entry still names the same
    Slurm job (a relaunch into the directory may have replaced it since this process read the file)."""
    mine = {(p.num, p.slurm_job_id): p for p in points}
    with _locked(sweep_dir):
        data = read_sweep(sweep_dir)
        if data is None:
            return
        changed = False
        for i, entry in enumerate(data["points"]):
            p = mine.get((entry.get("num"), entry.get("slurm_job_id")))
            if p is not None and asdict(p) != entry:
                data["points"][i] = asdict(p)
                changed = True
        if changed:
            write_json({**data, "sweep_version": SWEEP_VERSION, "updated_at": now()}, sweep_dir / SWEEP_FILE)


def varying(points: list[Point]) -> dict[int, str]:
    """Per point, the overrides that differ between the points (the swept ones); all when alone."""
    common = set.intersection(*(set(p.overrides) for p in points)) if len(points) > 1 else set()
    return {p.num: " ".join(o for o in p.overrides if o not in common) for p in points}


def _clock(seconds: int | None) -> str:
    if seconds is None:
        return ""
    h, rest = divmod(int(seconds), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress(p: Point) -> str:
    """Elapsed time, last step and attempt of a point, as the table shows them: "1:12 · step 17 · attempt 2"."""
    parts = []
    if p.elapsed_s is not None and p.state in ("RUNNING", "COMPLETING"):
        parts.append(_clock(p.elapsed_s))
    if p.last_step is not None and p.state in ("RUNNING", "COMPLETING"):
        parts.append(f"step {p.last_step}")
    if p.attempts and p.attempts > 1:
        parts.append(f"attempt {p.attempts}")
    return " · ".join(parts)


def render(points: list[Point], title: str):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("#", "swept", "state", "slurm job", "progress", "step ms", "tokens/s/GPU", "error / directory"):
        t.add_column(col, overflow="fold")
    style = {"COMPLETED": "green", "KEPT": "green", "INVALID": "yellow", "PENDING": "cyan", "RUNNING": "cyan",
             "REQUEUED": "cyan", "CONFIGURING": "cyan", "COMPLETING": "cyan", SUBMITTED: "cyan"}
    swept = varying(points)
    for p in sorted(points, key=lambda p: p.num):
        first_error = [line for line in (p.error or "").strip().splitlines() if line.strip()][:1] or [""]
        t.add_row(str(p.num), escape(swept[p.num]), f"[{style.get(p.state, 'red')}]{p.state}",
                  p.slurm_job_id or "", progress(p), f"{p.step_time_ms:.1f}" if p.step_time_ms else "",
                  f"{p.tokens_per_s_per_gpu:.1f}" if p.tokens_per_s_per_gpu else "",
                  escape(first_error[0] if not (p.ok or p.active) else p.dir))
    return t


# ----------------------------------------------------------------------------- attempts (written on the node)


def read_attempts(point_dir: Path) -> list[dict[str, Any]]:
    data = read_json(Path(point_dir) / ATTEMPTS_FILE)
    return data["attempts"] if isinstance(data, dict) and isinstance(data.get("attempts"), list) else []


def _write_attempts(point_dir: Path, attempts: list[dict[str, Any]]) -> None:
    write_json({"attempts": attempts}, Path(point_dir) / ATTEMPTS_FILE)


def attempt_started(point_dir: Path) -> dict[str, Any]:
    """Rank 0, as an attempt starts: append it to ``attempts.json`` (an earlier attempt that did not say how it
    ended was requeued by Slurm: a preemption, ``scontrol requeue``, a node failure)."""
    attempts = read_attempts(point_dir)
    for a in attempts:
        if a.get("requeued") is None:
            a["requeued"] = True
    entry = {"attempt": len(attempts) + 1, "slurm_job_id": _slurm_job_id(),
             "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
             "nodes": os.environ.get("SLURM_JOB_NODELIST"), "started_at": now(), "ended_at": None,
             "outcome": None, "steps": None, "requeued": None}
    attempts.append(entry)
    _write_attempts(point_dir, attempts)
    return entry


def attempt_ended(point_dir: Path, outcome: str, requeued: bool | None = None) -> list[dict[str, Any]]:
    """Rank 0, as an attempt ends: its outcome (from results.json when there is one), and whether it goes again
    (``requeued``: True, False, or None when Slurm decides later); the steps it measured. Returns every attempt."""
    attempts = read_attempts(point_dir)
    if not attempts:
        return attempts
    last = attempts[-1]
    res, _ = point_results(Path(point_dir))
    if res:
        last["steps"] = res.get("steps")
        told = results_outcome((res, None))
        outcome = "completed" if told is None else told[1].split("\n")[0]
    last.update(ended_at=now(), outcome=outcome)
    if requeued is not None:
        last["requeued"] = requeued
    _write_attempts(point_dir, attempts)
    return attempts


def record_attempts_in_results(point_dir: Path) -> None:
    """Rank 0: results.json of the attempt that just ended lists every attempt of the point (``attempts``)."""
    path = Path(point_dir) / "results.json"
    res = read_json(path)
    if isinstance(res, dict):
        res["attempts"] = read_attempts(point_dir)
        write_json(res, path)


def _slurm_job_id() -> str | None:
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


# ----------------------------------------------------------------------------- Slurm, through submitit

_JOB_CLASS = None


def job_class():
    """submitit's ``SlurmJob`` whose watcher also asks sacct for Elapsed, Start and ExitCode (one sacct call for
    every registered job, cached, refreshed at submitit's pace: 2, 4, 8, ... s after a registration, then every
    :data:`POLL_S` at most unless forced)."""
    global _JOB_CLASS
    if _JOB_CLASS is None:
        from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

        class CampaignWatcher(SlurmInfoWatcher):
            def _make_command(self):
                command = super()._make_command()
                if command:
                    command[command.index("-o") + 1] = SACCT_FIELDS
                return command

        class CampaignJob(SlurmJob):
            watcher = CampaignWatcher(delay_s=POLL_S)

        _JOB_CLASS = CampaignJob
    return _JOB_CLASS


def state_word(info: dict[str, str]) -> str:
    """The state in a sacct or squeue row, without what follows it ("CANCELLED by 0"); UNKNOWN without one."""
    return ((info.get("State") or "UNKNOWN").split() or ["UNKNOWN"])[0]


def queued(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """What slurmctld says now of these jobs, in one ``squeue`` call: {job id: {State, NodeList}} for those still
    in its queue. sacct reads the accounting database, which slurmctld fills asynchronously: on a loaded
    controller it can say PENDING of a job that has been training for a minute. A job squeue does not list has
    left the queue (sacct tells how it ended); {} when squeue cannot be asked (sacct's word stands)."""
    if not job_ids or shutil.which("squeue") is None:
        return {}
    try:  # exit code 1 when none of the ids is still known
        out = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", SQUEUE_FORMAT],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = (line.split("|") for line in out.splitlines() if line.count("|") == 2)
    return {job: {"State": state, "NodeList": nodes} for job, state, nodes in rows}


_JOBS: dict[tuple[str, str], Any] = {}
_QUEUED: dict[str, dict[str, str]] = {}  # squeue's last answer: asked whenever the watcher asks sacct


def slurm_job(p: Point):
    """submitit's job object of a point (task 0: rank 0's logs and result pickle), made once per process: making
    one registers it with the watcher, which resets the watcher's pace."""
    folder = p.submitit_folder or str(Path(p.dir).parent / ".submitit" / "%j")
    key = (folder, str(p.slurm_job_id))
    if key not in _JOBS:
        _JOBS[key] = job_class()(folder=folder, job_id=str(p.slurm_job_id), tasks=(0,))
    return _JOBS[key]


def _seconds(elapsed: str | None) -> int | None:
    """sacct's Elapsed ([D-]HH:MM:SS) in seconds."""
    if not elapsed:
        return None
    days, _, hms = elapsed.rpartition("-")
    try:
        parts = [int(x) for x in hms.split(":")]
    except ValueError:
        return None
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _last_step(path: Path) -> int | None:
    """The last training step rank 0's console log names (the tail of the file only)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read()
        # this attempt's lines: the log is appended to by every attempt, and an attempt ends with one of these
        text = text[max(text.rfind(m) for m in ATTEMPT_ENDS) + 1:]
        found = STEP_LINE.findall(text)
    except OSError:
        return None
    return int(found[-1]) if found else None


def _pickled(job) -> tuple[str, Any] | None:
    """submitit's result pickle of task 0: ("success", the JobReturn) or ("error", the traceback); None while the
    task has not ended (or ended without writing one: killed, cancelled, its node lost)."""
    path = job.paths.result_pickle
    if not path.exists():
        return None
    from submitit.core.utils import pickle_load

    try:
        return pickle_load(path)
    except Exception as e:  # noqa: BLE001 - a pickle written half (the node died) or from other code
        return "error", f"unreadable result pickle {path}: {type(e).__name__}: {e}"


def _timestamp(when: str | None) -> float | None:
    """sacct's Start (local time, ISO) as a timestamp; None when unknown."""
    try:
        return _dt.datetime.fromisoformat(when).timestamp() if when else None
    except ValueError:
        return None


def _earlier_attempt(path: Path, slurm: str, info: dict[str, str], checked_at: float | None) -> bool:
    """``path`` (a result pickle, results.json) is left from an attempt before the one Slurm holds now: the job
    was requeued after that attempt wrote it (Slurm requeues a finished job too). Slurm's word is as old as the
    watcher's last sacct call (``checked_at``); a file written after it is newer news."""
    try:
        written = path.stat().st_mtime
    except OSError:
        return False
    if slurm in ("PENDING", "REQUEUED"):
        return checked_at is not None and written < checked_at
    started = _timestamp(info.get("Start"))
    return slurm in ACTIVE_STATES and started is not None and written < started


def settle(p: Point, info: dict[str, str], job, checked_at: float | None = None) -> None:
    """Refresh ``p`` (a point with a Slurm job) from its files and from Slurm's ``info`` (the watcher's sacct row).

    A complete results.json is COMPLETED; submitit's result pickle says how task 0 ended (a JobReturn, or the error
    of a task that raised or was not requeued); without a pickle, Slurm's state decides: still out (PENDING,
    RUNNING with its elapsed time and last step, REQUEUED), or its own word for the ending (CANCELLED, TIMEOUT,
    NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, ...). What the run wrote of its ending (INTERRUPTED / TERMINATED with the
    steps measured, FAILED with the error) refines a plain FAILED; Slurm's own words stay."""
    point_dir = Path(p.dir)
    read = point_results(point_dir)
    res = complete(read[0])
    attempts = read_attempts(point_dir)
    p.attempts = len(attempts) or p.attempts
    slurm = state_word(info)
    p.nodes = info.get("NodeList") if info.get("NodeList") not in (None, "", "None assigned") else p.nodes
    p.elapsed_s = _seconds(info.get("Elapsed")) if info.get("Elapsed") else p.elapsed_s
    pickled = _pickled(job)
    p.logs = [str(job.paths.stdout), str(job.paths.stderr)]
    if pickled is not None and _earlier_attempt(job.paths.result_pickle, slurm, info, checked_at):
        pickled = None  # an earlier attempt's: the job goes again
    if res and _earlier_attempt(point_dir / "results.json", slurm, info, checked_at):
        res, read = None, (None, None)
    error = None
    if pickled is not None:
        kind, value = pickled
        if kind == "success":
            ret_state = state_of(value) if hasattr(value, "status") else "COMPLETED"
            if ret_state not in (*DONE_STATES, "PLANNED"):
                error = f"{type(value._return_value).__name__}: {value._return_value}"
            elif not res and ret_state in ("PLANNED", "COMPLETED") and read[0] is None:
                p.state, p.error = ret_state, None  # stage=plan / fit on the cluster
                return
        else:
            error = str(value).strip().splitlines()[-1] if str(value).strip() else "the task raised"
    if res and not error:
        p.state, p.error, p.last_step = "COMPLETED", None, None
        fill_from_results(p, res)
        return
    if pickled is None and slurm == "UNKNOWN" and p.state not in (*ACTIVE_STATES, SUBMITTED, "UNKNOWN"):
        told = results_outcome(read)  # Slurm was not asked (or has forgotten the job): the recorded ending stands
        if told and p.state in ("FAILED", "UNKNOWN"):
            p.state, p.error = told
        return
    if pickled is None and (slurm in ACTIVE_STATES or slurm == "UNKNOWN"):
        # still out; UNKNOWN: sacct has no record yet (just submitted) or cannot be asked
        if slurm == "UNKNOWN":
            p.state = p.state if p.state in ACTIVE_STATES else "PENDING"
        elif slurm == "PENDING" and attempts and (attempts[-1].get("ended_at") or p.state in ("RUNNING", "REQUEUED")):
            # an attempt ran (it ended, or the point was seen running: a node failure ends it unannounced) and the
            # job waits to go again; sacct alone would say PENDING
            p.state = "REQUEUED"
        else:
            p.state = slurm
        p.last_step = _last_step(job.paths.stderr) if p.state == "RUNNING" else None
        p.error = None
        return
    p.last_step = None
    state = slurm if slurm not in ("COMPLETED", "UNKNOWN", *ACTIVE_STATES) else "FAILED"
    if error and "timed-out" in error:
        state = "TIMEOUT"  # submitit caught Slurm's USR2 near the limit and did not requeue (max_num_timeout)
    if pickled is None and not error:
        error = f"Slurm: {slurm}" + (f" (exit code {info['ExitCode']})" if info.get("ExitCode") else "")
    told = results_outcome(read)
    if told:
        told_state, told_error = told
        error = told_error + (f"\n{error}" if error and state != "FAILED" else "")
        if state == "FAILED":
            state = told_state
    p.state = state
    p.error = (error or "") + ("\n--- stderr tail ---\n" + tail(Path(p.logs[1])) if p.logs else "")


FINAL_CACHED = ("COMPLETED", "KEPT", "INVALID", "PLANNED")  # settled for good: only results.json is read again


def refresh(points: list[Point], slurm: bool = True, force: bool = True, afresh: bool = False) -> list[Point]:
    """Every point's state now, from the files and (``slurm``) from Slurm: one sacct call for all the jobs
    (``force``; else at the pace of submitit's watcher); ``afresh``: forget what the watcher cached, jobs it saw
    end included (Slurm may have requeued one since)."""
    live = [p for p in points if p.slurm_job_id and p.state not in FINAL_CACHED]
    jobs = {p.num: slurm_job(p) for p in live}
    checked_at, asked = None, False
    if slurm and jobs:
        watcher = job_class().watcher
        before = watcher._last_status_check
        if afresh:
            watcher.clear()
        if force or afresh:
            watcher.update()
        else:
            watcher.update_if_long_enough("standard")
        checked_at = watcher._last_status_check if watcher._last_status_check > 0 else None
        asked = force or afresh or watcher._last_status_check != before
    infos = {num: dict(job.watcher.get_info(job.job_id, mode="cache")) if slurm else {} for num, job in jobs.items()}
    out = {job.job_id: num for num, job in jobs.items()
           if slurm and state_word(infos[num]) in (*ACTIVE_STATES, "UNKNOWN")}
    if asked:  # at sacct's pace, not at every look at the files
        _QUEUED.clear()
        _QUEUED.update(queued(list(out)))
    for job_id, num in out.items():  # slurmctld's word on the jobs still out is the newer one
        infos[num].update({k: v for k, v in _QUEUED.get(job_id, {}).items() if v})
    for p in points:
        read = point_results(Path(p.dir))
        res = complete(read[0])
        if p.num in jobs:
            settle(p, infos[p.num], jobs[p.num], checked_at)
        elif res:
            p.state = p.state if p.state == "KEPT" else "COMPLETED"
            fill_from_results(p, res)
        elif p.state in ("FAILED", "UNKNOWN", *DONE_STATES, *ACTIVE_STATES) and (told := results_outcome(read)):
            p.state, p.error = told  # what the run wrote; Slurm's own word (TIMEOUT, CANCELLED, ...) stays
    return points


def _slurm_here() -> bool:
    return shutil.which("sacct") is not None


def status(sweep_dir: Path, slurm: bool | None = None, save: bool = True) -> list[Point]:
    """The sweep's points, refreshed from the files they wrote and from Slurm (when ``sacct`` is here), and
    written back to sweep.json (``save``)."""
    data = read_sweep(sweep_dir)
    if data is None:
        return local_points(sweep_dir)
    points = [Point.from_json(p) for p in data["points"]]
    refresh(points, slurm=_slurm_here() if slurm is None else slurm)
    if save:
        with contextlib.suppress(OSError):  # a sweep directory one may only read
            _save_refreshed(sweep_dir, points)
    return points


def wait(sweep_dir: Path, on_change: Callable[[list[Point]], None] | None = None,
         tick_s: float = 2.0) -> list[Point]:
    """Block until every point of the sweep has ended; its points, settled. Files (result pickles, results.json)
    are looked at every ``tick_s``; Slurm is asked at submitit's pace (its watcher: 2, 4, 8, ... s, then every
    :data:`POLL_S`), and once more, afresh, before the end is declared (a job Slurm requeued after a node failure
    is out again)."""
    data = read_sweep(sweep_dir)
    if data is None:
        raise FileNotFoundError(f"{sweep_dir} has no {SWEEP_FILE} (is this a Slurm sweep directory?)")
    points = [Point.from_json(p) for p in data["points"]]
    slurm = _slurm_here()
    refresh(points, slurm=slurm)
    last = None
    while True:
        shown = [(p.num, p.state, p.attempts) for p in points]
        if shown != last:
            last = shown
            with contextlib.suppress(OSError):
                _save_refreshed(sweep_dir, points)
            if on_change:
                on_change(points)
        if not any(p.active or p.state == SUBMITTED for p in points):
            refresh(points, slurm=slurm, afresh=True)  # a fresh look at Slurm before declaring the end
            if any(p.active for p in points):
                continue
            # a point that ended with its result may still hold its job a moment (other ranks, teardown):
            # until Slurm says every job ended too, for LINGER_S at most
            deadline = time.monotonic() + LINGER_S
            while slurm and _lingering(points) and time.monotonic() < deadline:
                time.sleep(5)
                refresh(points, slurm=slurm, force=True)
            break
        time.sleep(tick_s)
        refresh(points, slurm=slurm, force=False)  # the files at every tick; Slurm at its watcher's pace
    with contextlib.suppress(OSError):
        _save_refreshed(sweep_dir, points)
    return points


LINGER_S = 30


def _lingering(points: list[Point]) -> list[Point]:
    """Points that have ended whose Slurm job is still running (as the watcher last heard)."""
    watcher = job_class().watcher
    return [p for p in points if p.slurm_job_id and p.state not in ("KEPT", "INVALID")
            and (watcher.get_info(str(p.slurm_job_id), mode="cache").get("State") or "").split(" ")[0]
            in ACTIVE_STATES]


def cancel(sweep_dir: Path) -> list[Point]:
    """``scancel`` every point of the sweep that is still queued or running (one call for all of them); the points
    cancelled."""
    points = status(sweep_dir)
    out = [p for p in points if p.active and p.slurm_job_id]
    if out:
        import subprocess

        subprocess.run([job_class()._cancel_command, *[str(p.slurm_job_id) for p in out]], check=True,
                       capture_output=True, text=True, timeout=120)
    return out


def exit_code(points: list[Point]) -> int:
    """As the sweep's own command ends (app.Outcomes): 1 when a point failed, else 2 when one was refused, else 0."""
    if any(p.state not in (*DONE_STATES, "PLANNED", "INVALID") for p in points):
        return 1
    return 2 if any(p.state == "INVALID" for p in points) else 0


def still_out(path: Path) -> str | None:
    """For compare on a campaign that is still running: "campaign DIR: 3 of 10 points still out (2 PENDING,
    1 RUNNING); compared the 7 that ended", or None when ``path`` is no Slurm sweep or every point has ended.
    Slurm is asked when it answers here; else the states sweep.json recorded stand."""
    data = read_sweep(Path(path))
    if data is None:
        return None
    points = status(Path(path), save=False)
    out = [p for p in points if p.active or p.state == SUBMITTED]
    if not out:
        return None
    counts: dict[str, int] = {}
    for p in out:
        counts[p.state] = counts.get(p.state, 0) + 1
    return (f"campaign {path}: {len(out)} of {len(points)} points still out "
            f"({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); compared the "
            f"{len(points) - len(out)} that ended (python -m moe_hydra.sweep wait {path} waits for the rest)")


def campaign_notes(args: list[str]) -> list[str]:
    """:func:`still_out` for every directory among a command's arguments (compare's): one note per campaign that is
    still running."""
    notes = []
    for arg in args:
        if not arg.startswith("-") and Path(arg).is_dir() and (note := still_out(Path(arg))):
            notes.append(note)
    return notes


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


# ----------------------------------------------------------------------------- the command


def report(points: list[Point], title: str, out=None) -> None:
    """The table, then each point that did not complete with its error and logs, then the count."""
    from rich.markup import escape

    out = out or console()
    out.print(render(points, title))
    for p in points:
        if not (p.ok or p.active or p.state == SUBMITTED):
            out.print(f"[bold]#{p.num} {p.state}[/bold] {escape(' '.join(p.overrides))}", highlight=False)
            if p.error:
                out.print(p.error, highlight=False, markup=False)
            for log in p.logs:
                out.print(f"  log: {log}", highlight=False)
    done = sum(p.ok for p in points)
    out_now = sum(p.active for p in points)
    out.print(f"{done} of {len(points)} points complete" + (f", {out_now} still out" if out_now else ""))


def main(argv: list[str] | None = None, after_wait: Callable[[Path], Any] | None = None) -> int:
    """The command; ``after_wait(sweep_dir)`` runs once ``wait`` has seen every point end (the app passes the
    layout search's ranking of a screening queued detached)."""
    ap = argparse.ArgumentParser(prog="python -m moe_hydra.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_ in (("status", "per-point state (live from Slurm), errors and logs; exit 1 when a point ended "
                                   "without completing"),
                        ("wait", "block until every point has ended, then the table; exit 0 / 1 / 2 as the sweep's "
                                 "own command"),
                        ("cancel", "scancel every point still queued or running")):
        sub.add_parser(name, help=help_).add_argument("sweep_dir", type=Path)
    args = ap.parse_args(argv)
    out = console()
    title = f"sweep {args.sweep_dir}"
    try:
        if args.command == "status":
            points = status(args.sweep_dir)
            report(points, title, out)
            return 0 if all(p.ok or p.active or p.state == SUBMITTED for p in points) else 1
        if args.command == "wait":
            def shown(points: list[Point]) -> None:
                counts: dict[str, int] = {}
                for p in points:
                    counts[p.state] = counts.get(p.state, 0) + 1
                print(f"moe_hydra.sweep: {time.strftime('%H:%M:%S')} "
                      + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), file=sys.stderr, flush=True)

            try:
                points = wait(args.sweep_dir, on_change=shown)
            except KeyboardInterrupt:
                print(f"moe_hydra.sweep: stopped waiting; the points go on in Slurm "
                      f"(python -m moe_hydra.sweep status {args.sweep_dir})", file=sys.stderr)
                return 130
            report(points, title, out)
            if after_wait:
                after_wait(args.sweep_dir)
            return exit_code(points)
        cancelled = cancel(args.sweep_dir)
        print(f"moe_hydra.sweep: cancelled {len(cancelled)} point(s)"
              + (f": {' '.join(f'#{p.num} ({p.slurm_job_id})' for p in cancelled)}" if cancelled else
                 " (none was queued or running)"))
        return 0
    except FileNotFoundError as e:
        print(f"moe_hydra.sweep: {e}", file=sys.stderr)
        return 2
