"""The start-up of a job: seconds from the command's start to the start of step 1 on rank 0 (``results.json``
``startup``), and how its ranks were started.

The command's start is the launching process's own start as the kernel records it (``/proc/self/stat`` field 22,
``starttime``, in clock ticks of ``CLOCK_BOOTTIME``, 10 ms here), so the interpreter's start and every import
count; step 1's start is read on rank 0 from the same clock (a local job: one machine, one clock). Where there
is no ``/proc`` (macOS) the command's start is the time this module was imported (``time.time``), which leaves
out the interpreter's start and the first imports. A command that launches several jobs (the points of a local
sweep) measures the first from the command's start and each later one from its own launch (``from``).

How the ranks started (``start``):
    warm          forked from a warm server that was running already (:mod:`moe_hydra.job.warm`)
    warm_started  forked from a warm server this command started (its imports are in the figure)
    spawn         fresh interpreters (torch's elastic launcher, start method spawn)
    program       each rank a program of its own under a wrapper (``profile.tool=nsys``)
    in_process    the rank runs in the launching process itself (a Slurm task)

Pure: standard library only.
"""

from __future__ import annotations

import os
import time
from typing import Any

STARTS = ("warm", "warm_started", "spawn", "program", "in_process")
FROM = ("command", "launch")  # the command's (process's) start; a later job's own launch
BOOTTIME = "CLOCK_BOOTTIME"
WALL = "time.time"
_IMPORTED = time.time()  # the fallback command start, where the kernel's is not readable
_launched = False  # a job was launched from this process already


def now(clock: str) -> float:
    """Seconds on ``clock`` (:data:`BOOTTIME` or :data:`WALL`)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if clock == BOOTTIME else time.time()


def process_start() -> tuple[float, str]:
    """(this process's start, its clock): ``/proc/self/stat``'s starttime on :data:`BOOTTIME`; else this module's
    import time on :data:`WALL`."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22; the command name (field 2) may hold spaces
        return ticks / os.sysconf("SC_CLK_TCK"), BOOTTIME
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc (macOS), no CLOCK_BOOTTIME
        return _IMPORTED, WALL


def origin(start: str, *, first: bool | None = None) -> dict[str, Any]:
    """Where a job's start-up is measured from, for the ranks (``spec["startup"]``): the command's start for the
    first job this process launches, the launch itself for later ones. ``start``: one of :data:`STARTS`."""
    global _launched
    first = not _launched if first is None else first
    _launched = True
    t0, clock = process_start()
    if not first:
        t0 = now(clock)
    return {"start": start, "from": "command" if first else "launch", "t0": t0, "clock": clock}


def record(orig: dict[str, Any], first_step_at: float) -> dict[str, Any]:
    """``results.json`` ``startup`` from the origin and step 1's start (on the origin's clock)."""
    if orig["from"] == "launch":
        frm = "the job's launch (a later job of the same command)"
    elif orig["clock"] == BOOTTIME:
        frm = "the command's start (/proc/self/stat starttime of the launching process)"
    else:
        frm = "the command's start (taken as the import of moe_hydra.core.startup: no /proc here)"
    return {"seconds": max(0.0, first_step_at - orig["t0"]), "start": orig["start"], "from": orig["from"],
            "counter": f"{orig['clock']}: step 1's start on rank 0 less {frm}"}


def describe(rec: dict[str, Any]) -> str:
    """One line for rank 0's console: ``start-up 1.83 s (warm server)``."""
    how = {"warm": "warm server", "warm_started": "warm server started by this run", "spawn": "spawned ranks",
           "program": "ranks as programs", "in_process": "in-process rank"}[rec["start"]]
    frm = "" if rec["from"] == "command" else ", from the launch"
    return f"start-up {rec['seconds']:.2f} s to step 1 ({how}{frm})"
