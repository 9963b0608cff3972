"""Follow a sweep from any shell: its points' states (live from Slurm), errors and logs; wait for it; cancel it.

    moe-hydra sweep status DIR    per-point state, errors and logs (exit 1 when a point ended without completing)
    moe-hydra sweep wait DIR      block until every point has ended, then the table; exit as the sweep's own command
    moe-hydra sweep cancel DIR    scancel every point still queued or running
    moe-hydra sweep layout DIR N  a layout search's candidate of rank N (or its Nth row with --row), every field

A point's state comes from what it left in its directory (results.json, violations.json, its job's result) and,
on Slurm, from Slurm itself (sacct and squeue) — never from a log line, and never from the memory of the process
that queued it; sweep.json in the sweep directory keeps what was last seen. A local multirun writes no sweep.json:
its point directories are read instead. After wait, a layout search whose screening was queued detached
(launcher.detach=true) ranks its measured layouts.

examples:
  python -m moe_hydra launcher=slurm launcher.detach=true dispatcher=alltoall,allgather hydra.sweep.dir=outputs/ab -m
  moe-hydra sweep status outputs/ab
  moe-hydra sweep wait outputs/ab && moe-hydra compare outputs/ab
  moe-hydra sweep cancel outputs/ab
  moe-hydra sweep layout outputs/search 240       the 240th layout of a search: its terms, memory, overrides
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Refused, signal_exit
from moe_hydra.core.io import console
from moe_hydra.launch import follow, progress
from moe_hydra.launch.ledger import Point
from moe_hydra.launch.outcome import SUBMITTED

EXITS = {EXIT_OK: "status: every point complete or still out; wait: every point completed; cancel: done",
         EXIT_FAILED: "a point ended without completing (cancel: scancel failed, its message said)", EXIT_REFUSED:
         "not a sweep directory, or an unreadable sweep.json (wait: a point was refused)"}

VERBS = {"status": "per-point state (live from Slurm), errors and logs; exit 1 when a point ended without completing",
         "wait": "block until every point has ended, then the table; exit 0 / 1 / 2 as the sweep's own command",
         "cancel": "scancel every point still queued or running",
         "layout": "a layout search's candidate (layouts.json) in full: sweep layout DIR RANK [--row]"}


def arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="verb", required=True)
    for verb, help_ in VERBS.items():
        p = sub.add_parser(verb, help=help_)
        p.add_argument("sweep_dir", type=Path)
        if verb == "layout":
            p.add_argument("rank", type=int, help="the rank (1 = best), or with --row the row, from 1")
            p.add_argument("--row", action="store_true", help="count every candidate, ranked or not, in the "
                           "file's order (ranked best first, then the rest)")


def _shown(points: list[Point]) -> None:
    counts: dict[str, int] = {}
    for p in points:
        counts[p.state] = counts.get(p.state, 0) + 1
    print(f"moe_hydra.sweep: {time.strftime('%H:%M:%S')} " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
          file=sys.stderr, flush=True)


def _layout(args: argparse.Namespace) -> int:
    """One candidate of the search in ``args.sweep_dir`` as JSON on stdout.

    Raises:
        Refused: no readable layouts.json there, or no such rank or row.
    """
    from moe_hydra.planning import layouts_file

    path = args.sweep_dir / "layouts.json"
    report = layouts_file.read(path)
    if report is None:
        raise Refused(f"{path}: no layouts.json (a layout search writes one: hydra/sweeper=layout -m)")
    rows = report["candidates"]
    if args.row:
        found = rows[args.rank - 1] if 1 <= args.rank <= len(rows) else None
        limits = f"rows 1..{len(rows)}"
    else:
        found = next((r for r in rows if r.get("rank") == args.rank), None)
        limits = f"ranks 1..{sum(1 for r in rows if r.get('rank'))}"
    if found is None:
        raise Refused(f"{path} has no {'row' if args.row else 'rank'} {args.rank} ({limits})")
    print(json.dumps(found, indent=2))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.verb == "layout":
        return _layout(args)
    out = console()
    title = f"sweep {args.sweep_dir}"
    if args.verb == "status":
        points = follow.status(args.sweep_dir)
        progress.report(points, title, out)
        return EXIT_OK if all(p.ok or p.active or p.state == SUBMITTED for p in points) else EXIT_FAILED
    if args.verb == "wait":
        try:
            points = follow.wait(args.sweep_dir, on_change=_shown)
        except KeyboardInterrupt:
            print(f"moe_hydra.sweep: stopped waiting; the points go on in Slurm "
                  f"(moe-hydra sweep status {args.sweep_dir})", file=sys.stderr)
            return signal_exit("SIGINT")
        progress.report(points, title, out)
        if (args.sweep_dir / "layouts.json").exists():
            from moe_hydra.launch import layout_sweeper

            layout_sweeper.finish_screening(args.sweep_dir)
        return follow.exit_code(points)
    cancelled = follow.cancel(args.sweep_dir)
    print(f"moe_hydra.sweep: cancelled {len(cancelled)} point(s)"
          + (f": {' '.join(f'#{p.num} ({p.slurm_job_id})' for p in cancelled)}" if cancelled else
             " (none was queued or running)"))
    return EXIT_OK
