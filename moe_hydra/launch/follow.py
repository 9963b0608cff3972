"""A sweep's points followed to their end, told truthfully: ``moe-hydra sweep status|wait|cancel`` and compare's
note on a campaign still running.

A point's state comes from what it left behind (``results.json``, ``violations.json``, submitit's result pickle,
``attempts.json``) and, on Slurm, from Slurm itself (:mod:`moe_hydra.launch.slurm_jobs`) — never from a log line
that says "completed", and never from the memory of the process that submitted it: a campaign is followed from
another shell, another login, after the submitting process is gone. The states: :mod:`moe_hydra.launch.outcome`;
the ledger they are written back to: :mod:`moe_hydra.launch.ledger`. A local multirun writes no ledger: its point
directories are read instead (:func:`local_points`), where a ``stage=plan`` point is PLANNED.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Failed, Refused
from moe_hydra.core.io import read_json
from moe_hydra.job import live
from moe_hydra.launch import slurm_jobs
from moe_hydra.launch.attempts import read_attempts
from moe_hydra.launch.ledger import Point, fill_from_results, load_points, read_sweep, save_refreshed
from moe_hydra.launch.outcome import (ACTIVE_STATES, DONE_STATES, SUBMITTED, complete, point_results,
                                      results_outcome, state_of)


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
    slurm = slurm_jobs.state_word(info)
    p.nodes = info.get("NodeList") if info.get("NodeList") not in (None, "", "None assigned") else p.nodes
    p.elapsed_s = slurm_jobs.elapsed_seconds(info.get("Elapsed")) if info.get("Elapsed") else p.elapsed_s
    pickled = slurm_jobs.result_pickle(job)
    p.logs = [str(job.paths.stdout), str(job.paths.stderr)]
    if pickled is not None and slurm_jobs.earlier_attempt(job.paths.result_pickle, slurm, info, checked_at):
        pickled = None  # an earlier attempt's: the job goes again
    if res and slurm_jobs.earlier_attempt(point_dir / "results.json", slurm, info, checked_at):
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
        p.last_step = slurm_jobs.last_step(job.paths.stderr) if p.state == "RUNNING" else None
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
    p.error = (error or "") + ("\n--- stderr tail ---\n" + slurm_jobs.tail(Path(p.logs[1])) if p.logs else "")


FINAL_CACHED = ("COMPLETED", "KEPT", "INVALID", "PLANNED")  # settled for good: only results.json is read again


def refresh(points: list[Point], slurm: bool = True, force: bool = True, afresh: bool = False) -> list[Point]:
    """Every point's state now, from the files and (``slurm``) from Slurm: one sacct call for all the jobs
    (``force``; else at the pace of submitit's watcher); ``afresh``: forget what the watcher cached, jobs it saw
    end included (Slurm may have requeued one since)."""
    live = [p for p in points if p.slurm_job_id and p.state not in FINAL_CACHED]
    jobs = {p.num: slurm_jobs.slurm_job(p) for p in live}
    checked_at, asked = None, False
    if slurm and jobs:
        watcher = slurm_jobs.job_class().watcher
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
           if slurm and slurm_jobs.state_word(infos[num]) in (*ACTIVE_STATES, "UNKNOWN")}
    if asked:  # at sacct's pace, not at every look at the files
        slurm_jobs.QUEUED.clear()
        slurm_jobs.QUEUED.update(slurm_jobs.queued(list(out)))
    for job_id, num in out.items():  # slurmctld's word on the jobs still out is the newer one
        infos[num].update({k: v for k, v in slurm_jobs.QUEUED.get(job_id, {}).items() if v})
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
    loaded = load_points(sweep_dir)
    if loaded is None:
        return local_points(sweep_dir)
    points = loaded[1]
    refresh(points, slurm=_slurm_here() if slurm is None else slurm)
    if save:
        with contextlib.suppress(OSError):  # a sweep directory one may only read
            save_refreshed(sweep_dir, points)
    return points


def wait(sweep_dir: Path, on_change: Callable[[list[Point]], None] | None = None,
         tick_s: float = 2.0) -> list[Point]:
    """Block until every point of the sweep has ended; its points, settled. Files (result pickles, results.json)
    are looked at every ``tick_s``; Slurm is asked at submitit's pace (its watcher: 2, 4, 8, ... s, then every
    :data:`POLL_S`), and once more, afresh, before the end is declared (a job Slurm requeued after a node failure
    is out again). A local multirun (no sweep.json) has ended when its command returned: its points as they are.
    """
    loaded = load_points(sweep_dir)
    if loaded is None:
        return local_points(sweep_dir)
    points = loaded[1]
    slurm = _slurm_here()
    refresh(points, slurm=slurm)
    last = None
    while True:
        shown = [(p.num, p.state, p.attempts) for p in points]
        if shown != last:
            last = shown
            with contextlib.suppress(OSError):
                save_refreshed(sweep_dir, points)
            if on_change:
                on_change(points)
        if not any(p.active or p.state == SUBMITTED for p in points):
            refresh(points, slurm=slurm, afresh=True)  # a fresh look at Slurm before declaring the end
            if any(p.active for p in points):
                continue
            # a point that ended with its result may still hold its job a moment (other ranks, teardown):
            # until Slurm says every job ended too, for LINGER_S at most. Slurm is asked of those jobs themselves:
            # refresh asks only of points still unsettled, and these are settled
            deadline = time.monotonic() + LINGER_S
            while slurm and _lingering(points) and time.monotonic() < deadline:
                time.sleep(LINGER_TICK_S)
                slurm_jobs.job_class().watcher.update()
            break
        time.sleep(tick_s)
        refresh(points, slurm=slurm, force=False)  # the files at every tick; Slurm at its watcher's pace
    with contextlib.suppress(OSError):
        save_refreshed(sweep_dir, points)
    return points


LINGER_S = 30
LINGER_TICK_S = 1


def _lingering(points: list[Point]) -> list[Point]:
    """Points that have ended whose Slurm job is still running (as the watcher last heard)."""
    watcher = slurm_jobs.job_class().watcher
    return [p for p in points if p.slurm_job_id and p.state not in ("KEPT", "INVALID")
            and (watcher.get_info(str(p.slurm_job_id), mode="cache").get("State") or "").split(" ")[0]
            in ACTIVE_STATES]


def cancel(sweep_dir: Path) -> list[Point]:
    """``scancel`` every point of the sweep that is still queued or running (one call for all of them); the points
    cancelled."""
    points = status(sweep_dir)
    out = [p for p in points if p.active and p.slurm_job_id]
    if out:
        command = [slurm_jobs.job_class()._cancel_command, *[str(p.slurm_job_id) for p in out]]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise Failed(f"{command[0]} is not installed here: cancel from a Slurm login node "
                         f"({' '.join(command)})") from None
        except subprocess.CalledProcessError as e:
            said = (e.stderr or e.stdout or "").strip().splitlines()
            raise Failed(f"{' '.join(command)} exited {e.returncode}: {said[-1] if said else 'no message'}") from None
        except subprocess.TimeoutExpired:
            raise Failed(f"{' '.join(command)} did not answer in 120 s; Slurm may be down (sinfo)") from None
    return out


def exit_code(points: list[Point]) -> int:
    """As the sweep's own command ends (:class:`moe_hydra.commands.run.Outcomes`): 1 when a point failed, else 2
    when one was refused, else 0."""
    if any(p.state not in (*DONE_STATES, "PLANNED", "INVALID") for p in points):
        return EXIT_FAILED
    return EXIT_REFUSED if any(p.state == "INVALID" for p in points) else EXIT_OK


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
        Refused: ``sweep_dir`` has neither ``sweep.json`` nor a point directory, or a point's ``.hydra`` files
            cannot be read.
    """
    from omegaconf import OmegaConf

    points = []
    for hydra_dir in sorted(sweep_dir.glob("*/.hydra")):
        try:
            num = OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.job.num", default=None)
            overrides = list(OmegaConf.load(hydra_dir / "overrides.yaml"))
            stage = OmegaConf.load(hydra_dir / "config.yaml").get("stage")
        except Exception as e:  # noqa: BLE001 - missing, truncated, not YAML: omegaconf and yaml raise their own
            raise Refused(f"{hydra_dir}: unreadable ({type(e).__name__}); is {sweep_dir} a sweep directory?") from None
        if num is None:  # a single run's directory
            continue
        p = Point(num=num, overrides=overrides, dir=str(hydra_dir.parent))
        read = point_results(hydra_dir.parent)
        p.state, p.error = _local_outcome(hydra_dir.parent, stage, read)
        fill_from_results(p, complete(read[0]))
        last = live.running(hydra_dir.parent) if p.state == "UNKNOWN" else None
        if last is not None:  # still running: its last logged step, as rank 0 wrote it
            p.state, p.error, p.last_step, p.step_time_ms = "RUNNING", None, last["step"], last["step_time_ms"]
        points.append(p)
    if not points:
        raise Refused(f"{sweep_dir} has no sweep.json and no point directories (is this a sweep directory?)")
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
    return "UNKNOWN", f"no outcome yet: starting, or stopped before writing one (see {point_dir / 'app.log'})"



