"""``sweep.json``, a sweep's ledger: one entry per point, written when the points are queued and refreshed by
``moe-hydra sweep status|wait`` (:mod:`moe_hydra.launch.follow`), from any shell, under a lock.

    sweep_version 2, submitted_at, detached, follow (the commands), updated_at, and per point (:class:`Point`):
    num, overrides, dir, state, slurm_job_id, submitit_folder, submitted_at, nodes, elapsed_s, last_step,
    attempts, step_time_ms, tokens_per_s_per_gpu, error, logs

A local multirun writes none: its points are read from their directories (:func:`moe_hydra.launch.follow.local_points`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from moe_hydra.core.io import read_json, read_named, utc_now, write_json
from moe_hydra.launch.outcome import ACTIVE_STATES, DONE_STATES

SWEEP_FILE = "sweep.json"
SWEEP_VERSION = 2


@dataclass
class Point:
    """One entry of sweep.json: a point of the sweep, where its files are, and what was last learnt of it."""

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
        """An entry of sweep.json (any version: keys it lacks take their defaults, unknown keys are left out).

        Raises:
            ValueError: not an object, or without its ``num`` (an integer), ``overrides`` (a list) or ``dir``.
        """
        if not isinstance(entry, dict):
            raise ValueError(f"a point is a {type(entry).__name__}, not an object")
        bad = [k for k, kind in (("num", int), ("overrides", list), ("dir", str)) if not isinstance(entry.get(k), kind)]
        if bad:
            raise ValueError(f"point {entry.get('num', '?')} has no valid {', '.join(bad)}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in entry.items() if k in known})


def fill_from_results(p: Point, res: dict[str, Any] | None) -> None:
    """The measured figures of a complete run (``res``: its results.json) on its entry."""
    if res:
        p.step_time_ms = res.get("step_time_ms")
        p.tokens_per_s_per_gpu = res.get("tokens_per_s_per_gpu")


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
    """sweep.json, or None when it is missing or unreadable (what a writer rewrites)."""
    data = read_json(sweep_dir / SWEEP_FILE)
    return data if isinstance(data, dict) and isinstance(data.get("points"), list) else None


def load_points(sweep_dir: Path) -> tuple[dict[str, Any], list[Point]] | None:
    """sweep.json and its points, for the commands that follow a sweep; None when there is no sweep.json.

    Raises:
        Refused: a sweep.json that is there but unreadable, not JSON, without a ``points`` list or with a point
            that lacks its fields (said as such, never as "missing").
    """
    from moe_hydra.core.errors import Refused

    path = sweep_dir / SWEEP_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(read_named(path, "the ledger"))
    except (ValueError, RecursionError) as e:
        raise Refused(f"{path}: not JSON ({type(e).__name__}: {str(e).splitlines()[0]}); it is rewritten only "
                      "when the sweep is launched again") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise Refused(f"{path}: not a sweep ledger (no points list)")
    try:
        return data, [Point.from_json(p) for p in data["points"]]
    except ValueError as e:
        raise Refused(f"{path}: {e}") from None


def write_sweep(sweep_dir: Path, points: list[Point], **meta: Any) -> Path:
    """Write sweep.json: ``points``, the top-level fields already there, ``meta`` over them."""
    path = sweep_dir / SWEEP_FILE
    with _locked(sweep_dir):
        old = read_sweep(sweep_dir) or {}
        top = {k: v for k, v in old.items() if k != "points"}
        top.update(meta, sweep_version=SWEEP_VERSION, updated_at=utc_now())
        write_json({**top, "points": [asdict(p) for p in sorted(points, key=lambda p: p.num)]}, path)
    return path


def save_refreshed(sweep_dir: Path, points: list[Point]) -> None:
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
            write_json({**data, "sweep_version": SWEEP_VERSION, "updated_at": utc_now()}, sweep_dir / SWEEP_FILE)

