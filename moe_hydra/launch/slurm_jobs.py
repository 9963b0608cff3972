"""Slurm's word on a sweep's jobs, through submitit's own job objects: one ``sacct`` for every job of the sweep
through its watcher's cache (:func:`job_class`), one ``squeue`` for those it calls still out (:func:`queued`), the
result pickle submitit writes when task 0 ends, and the last step rank 0's log names. Read by
:mod:`moe_hydra.launch.follow`, which settles a point's state from them and from its files."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from moe_hydra.launch.ledger import Point
from moe_hydra.launch.outcome import ACTIVE_STATES

# submitit's watcher asks sacct about every job of the sweep at once, at 2, 4, 8, ... s after the last submission and
# then at most every POLL_S; submitit.helpers.monitor_jobs refuses to poll more often than every 30 s
POLL_S = 30
SACCT_FIELDS = "JobID,State,NodeList,Elapsed,Start,ExitCode"
SQUEUE_FORMAT = "%i|%T|%N"  # with -r: one line per array task, <array id>_<task>, as sacct's JobID
STEP_LINE = re.compile(rb"^step\s+(\d+)\s+loss", re.MULTILINE)  # rank 0's metric lines (moe_hydra.core.metrics)
ATTEMPT_ENDS = (b"moe_hydra: stopped by", b" CANCELLED AT ")  # the run's own last line; slurmstepd's on a requeue


def tail(path: Path, lines: int = 12) -> str:
    """The last ``lines`` lines of a log (its last 16 KiB read); empty when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
        return "\n".join(text.rstrip().splitlines()[-lines:])
    except OSError:
        return ""


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
QUEUED: dict[str, dict[str, str]] = {}  # squeue's last answer: asked whenever the watcher asks sacct


def slurm_job(p: Point):
    """submitit's job object of a point (task 0: rank 0's logs and result pickle), made once per process: making
    one registers it with the watcher, which resets the watcher's pace."""
    folder = p.submitit_folder or str(Path(p.dir).parent / ".submitit" / "%j")
    key = (folder, str(p.slurm_job_id))
    if key not in _JOBS:
        _JOBS[key] = job_class()(folder=folder, job_id=str(p.slurm_job_id), tasks=(0,))
    return _JOBS[key]


def elapsed_seconds(elapsed: str | None) -> int | None:
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


def last_step(path: Path) -> int | None:
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


def result_pickle(job) -> tuple[str, Any] | None:
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
        return datetime.datetime.fromisoformat(when).timestamp() if when else None
    except ValueError:
        return None


def earlier_attempt(path: Path, slurm: str, info: dict[str, str], checked_at: float | None) -> bool:
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

