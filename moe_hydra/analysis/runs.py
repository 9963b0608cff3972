"""The complete runs under directories, each counted once: what compare, accept, diff, regress and noise read.

Every results.json is read through the schema (:mod:`moe_hydra.core.results`); one that fails it (not an object, a
step time that is NaN, infinite, zero or negative, a window outside the steps run, a NaN loss, a results_version
other than 1, ...) is skipped with one warning naming the file and the field, whatever the file's own flags claim.
A run stopped by a signal (status interrupted or terminated) is listed, never compared. Failed points and plan-only
directories are skipped with a warning naming the file.

A run is counted once: files with the same run_id, the same file reached twice (``D D``, ``D D/0``) and files with
identical step times (a copy of a run written before run_id existed) are one run, with a warning ("counted once:
same run_id as ..."); the copies are kept on the run (``Run.copies``).

Verdicts only on steady windows: a complete run whose window is not steady (:mod:`moe_hydra.core.steady`: its step
times judged from results.json, whichever version wrote it) is not evidence. By default it is listed
(``Loaded.not_steady``) and warned with the fix (a window inside its steady segment, or ``contract.window=auto``), so
accept and regress never judge it; compare, diff and noise read it anyway (``need_steady=False``): compare shows its
figures without a verdict, noise measures it and says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.core import contract as contracts
from moe_hydra.core import results, steady

NEED = ("contract", "contract_hash", "loss")  # what every use of a complete run reads (results.problems)

Warn = Callable[[str], None]


@dataclass
class Run:
    """A complete (or stopped) run: its directory, its results.json as read through the schema, the other files
    of the same run that were counted once."""

    path: Path
    results: dict[str, Any]
    copies: list[Path] = field(default_factory=list)  # other results.json files of this run, counted once

    @property
    def window_steps(self) -> list[float]:
        first, last = results.measured_window(self.results) or (1, 0)
        return self.results["step_times_ms"][first - 1:last]

    @property
    def window_mean(self) -> float:
        return sum(self.window_steps) / len(self.window_steps)

    @property
    def steady(self) -> steady.Judgment:
        """The judgment of the run's step times (:func:`moe_hydra.core.steady.of_results`), made once."""
        if self._steady is None:
            self._steady = steady.of_results(self.results)
        return self._steady

    _steady: steady.Judgment | None = field(default=None, repr=False, compare=False)


@dataclass
class Loaded:
    """What the directories hold, each run once: ``runs`` complete with a steady window (compared), ``not_steady``
    complete but their window not steady (listed, never compared), ``stopped`` by a signal (listed, never compared),
    ``rejected`` the reasons results.json files were not used (against the schema, failed)."""

    runs: list[Run] = field(default_factory=list)
    stopped: list[Run] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    not_steady: list[Run] = field(default_factory=list)


def _files(dirs: list[Path], warn: Warn) -> Iterator[Path]:
    """Every results.json under ``dirs`` (a directory's own, else its points'); plan-only points are warned."""
    for d in dirs:
        try:
            if not d.is_dir():
                warn(f"skipped {d}: {'not a directory' if d.exists() else 'no such directory'}")
                continue
            found = [d / "results.json"] if (d / "results.json").exists() else sorted(
                p for p in d.rglob("results.json") if "wandb" not in p.parts)
            plans = {p.parent for p in d.rglob("plan.json")} - {p.parent for p in found}
        except OSError as e:
            warn(f"skipped {d}: {e.strerror or type(e).__name__}")
            continue
        for p in sorted(plans):
            warn(f"skipped {p}: a plan without results (stage=plan, or a point that never ran)")
        if not found and not plans:
            warn(f"skipped {d}: no results.json in it or under it (give a run or sweep directory)")
        yield from found


def _identities(path: Path, res: dict[str, Any]) -> list[tuple[str, Any]]:
    """What makes a run the same run: its file; its run_id; without one (version 0), its step times under its
    contract (no two runs time every step alike, so a copy of an old run is found in any directory)."""
    keys: list[tuple[str, Any]] = [("file", os.path.realpath(path))]
    if "run_id" in res:
        return keys + [("run_id", res["run_id"])]
    times = tuple(res.get("step_times_ms") or ())
    return keys + ([("step times", (contracts.digest(res.get("contract") or {}), times))] if times else [])


def stopped_line(run: Run) -> str:
    """A stopped run, told: its file, status, signal, and how much of its window it measured."""
    r = run.results
    window = results.measured_window(r)
    return (f"{run.path / 'results.json'}: status {r['status']} ({r.get('signal') or 'no signal named'}) after "
            f"{r['steps']} steps; window {r['window']}, "
            + (f"steps {window[0]}..{window[1]} measured" if window else "none of it measured")
            + ": a stopped run is never compared or accepted")


def not_steady_line(run: Run) -> str:
    """A run whose window is not steady, told: its file, the judgment and the fix."""
    return f"{run.path / 'results.json'}: not evidence: {run.steady.describe()}"


def load(dirs: list[Path], warn: Warn, need_steady: bool = True) -> Loaded:
    """Every run under ``dirs``, each counted once; anything not compared is warned, naming the file.
    ``need_steady``: a complete run whose window is not steady goes to ``not_steady`` (False: among the ``runs``,
    for a reader that looks at what changed, not at how fast)."""
    loaded, seen = Loaded(), {}

    def reject(message: str) -> None:
        loaded.rejected.append(message)
        warn(f"skipped {message}")

    for path in _files(dirs, warn):
        res, problem = results.read(path, NEED)
        if problem:
            reject(problem)
            continue
        keys = _identities(path, res)
        same = next(((what, seen[(what, key)]) for what, key in keys if (what, key) in seen), None)
        if same:
            what, run = same
            run.copies.append(path)
            warn(f"{path} counted once: same {what} as {run.path / 'results.json'}")
            continue
        run = Run(path.parent, res)
        seen.update({k: run for k in keys})
        if res["status"] == results.OK and need_steady and not run.steady.window_steady:
            loaded.not_steady.append(run)
            warn(f"not compared: {not_steady_line(run)}")
        elif res["status"] == results.OK:
            loaded.runs.append(run)
        elif res["status"] in results.STOPPED:
            loaded.stopped.append(run)
            warn(f"not compared: {stopped_line(run)}")
        else:
            reject(f"{path}: status {res['status']!r} ({str(res.get('error', ''))[:120]})")
    return loaded



def not_compared(loaded: Loaded) -> list[str]:
    """Why the results.json files that were found are not among the runs compared (for accept, diff, regress)."""
    return loaded.rejected + [stopped_line(r) for r in loaded.stopped] + [not_steady_line(r) for r in loaded.not_steady]



def contract_value(run: Run, key: str) -> Any:
    """The value of ``key`` (a dotted key, or a config group: its section) in the run's contract; None without."""
    node: Any = run.results["contract"]
    for part in contracts.GROUP_SECTIONS.get(key, key).split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def recorded(run_dir: Path, key: str) -> Any:
    """``key`` as the run recorded it (its .hydra/config.yaml), interpolations resolved; None when absent."""
    cfg_file = Path(run_dir) / ".hydra" / "config.yaml"
    if not cfg_file.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        value = OmegaConf.select(OmegaConf.load(cfg_file), key, default=None)
    except Exception:  # noqa: BLE001 - an unreadable config, an interpolation that does not resolve: not set
        return None
    return value if value not in (None, "") else None
