"""A point's outcome: the states a run or sweep tells, the Hydra JobReturn that carries one to the app, and what a
point's ``results.json`` tells of its ending.

A point's outcome travels to the app the way Hydra carries any job's: a JobReturn, its status COMPLETED with the
state as the value (COMPLETED, KEPT, PLANNED, SUBMITTED), or FAILED with :class:`~moe_hydra.core.errors.Refused`
(state INVALID) or :class:`~moe_hydra.core.errors.Failed` as the value (:class:`moe_hydra.commands.run.Outcomes`
adds them up to the command's exit code).

States (sweep.json's vocabulary, :mod:`moe_hydra.launch.ledger`): COMPLETED (results.json status ok), KEPT (a
complete results.json from an earlier launch into the same directory), PLANNED (stage=plan), SUBMITTED (a detached
launch queued it), INVALID (refused before launch), INTERRUPTED and TERMINATED (results.json status interrupted or
terminated: stopped by SIGINT, or by SIGTERM/SIGUSR2, with the steps measured so far), FAILED, Slurm's own words
where Slurm decided (PENDING, RUNNING, REQUEUED, TIMEOUT, CANCELLED, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, ...), and
UNKNOWN (also for a results.json that fails its schema, :mod:`moe_hydra.core.results`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from moe_hydra.core.errors import Failed, Refused
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

