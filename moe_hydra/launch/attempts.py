"""``attempts.json``, in a point's directory: one entry per Slurm attempt of the point (a requeue starts another),
written by rank 0 on the node as the attempt starts and ends, and listed in the attempt's ``results.json``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from moe_hydra.core.io import read_json, utc_now, write_json
from moe_hydra.launch.outcome import point_results, results_outcome

ATTEMPTS_FILE = "attempts.json"


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
             "nodes": os.environ.get("SLURM_JOB_NODELIST"), "started_at": utc_now(), "ended_at": None,
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
    last.update(ended_at=utc_now(), outcome=outcome)
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

