"""Judge whether each run's measured window is steady: changepoints in its step times, its class and steady segment.

    moe-hydra steady DIR [DIR ...] [--json] [--steady-steps N]

Reads every results.json under the directories (runs and sweeps; one written by any version of moe_hydra) and
judges its step times after its warmup steps: where their level changes (PELT changepoints, a lone stalled step
being an outlier, not a change), the class of the series (flat, warmup, slowdown, or no_steady_state when its last
level is shorter than the steady segment needs), the steady segment (the steps after the last change), and whether
the window the run measured lies inside it. A window that reaches into a warm-up or an earlier level is not steady;
the line says which window would be, or to run with contract.window=auto, which steps until it finds one.
compare, accept, repeat=auto, tune and bisect refuse a run whose window is not steady in the same way.

examples:
  moe-hydra steady outputs/runs/2026-12-07/10-00-00
  moe-hydra steady outputs/ab --json
  python -m moe_hydra contract.window=auto hydra.run.dir=outputs/auto && moe-hydra steady outputs/auto
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moe_hydra.analysis.runs import load
from moe_hydra.core import steady
from moe_hydra.core.errors import EXIT_NOT_STEADY, EXIT_OK, EXIT_REFUSED, Refused
from moe_hydra.core.io import console

EXITS = {EXIT_OK: "every run's window is steady", EXIT_NOT_STEADY: "a run's window is not steady (each is named, "
         "with the window that would be)", EXIT_REFUSED: "no run under the directories, or a bad argument"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run or sweep directories")
    ap.add_argument("--json", action="store_true", help="print each run's judgment as JSON (results.json's steady)")
    ap.add_argument("--steady-steps", type=_steps, metavar="N", help="the shortest steady segment, in steps (default: "
                    f"what the run recorded, contract.steady_steps; {steady.STEADY_STEPS} for older runs)")


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < steady.MIN_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps >= {steady.MIN_SIZE}")
    return value


def run(args: argparse.Namespace) -> int:
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        print(f"moe_hydra.steady: warning: {message}", file=sys.stderr)

    loaded = load(args.dirs, warn, need_steady=False)
    runs = [*loaded.runs, *loaded.stopped]
    if not runs:
        raise Refused("no run with step times under " + ", ".join(map(str, args.dirs)) + " (give run or sweep "
                      "directories that hold results.json)")
    judged = [(r, steady.of_results(r.results, args.steady_steps)) for r in sorted(runs, key=lambda r: str(r.path))]
    if args.json:
        print(json.dumps([{"run": str(r.path), "status": r.results["status"], **j.as_dict()} for r, j in judged],
                         indent=1))
    else:
        _table(judged)
    bad = [r for r, j in judged if not j.window_steady]
    if bad and not args.json:
        print(f"{len(bad)} of {len(judged)} window{'s' * (len(judged) > 1)} not steady")
    return EXIT_NOT_STEADY if bad else EXIT_OK


def _table(judged: list) -> None:
    from rich.table import Table

    t = Table(show_lines=False)
    for col in ("run", "class", "steady segment", "window", "steady", "levels (first-last: mean ms)", "noise"):
        t.add_column(col, overflow="fold")
    for r, j in judged:
        window = f"[{j.window[0]}, {j.window[1]}]" if j.window else "-"
        verdict = "yes" if j.window_steady else f"NO: {steady.fix(j)}"
        if r.results["status"] != "ok":
            verdict += f" (the run {r.results['status']})"
        t.add_row(str(r.path), j.kind, f"{j.segment[0]}-{j.segment[1]}" if j.segment else "none", window, verdict,
                  ", ".join(f"{a}-{b}: {m:.1f}" for a, b, m in j.levels) or "-",
                  f"{j.noise:.1%}" if j.noise is not None else "-")
    console().print(t, markup=False, highlight=False)
