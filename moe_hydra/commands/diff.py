"""Regression diagnosis of two runs: what changed between them and which wall moved.

    moe-hydra diff RUN_A RUN_B [--noise-floor X]

Both directories must hold a complete run. The diff lists what differs in their config (the contract, in the order
a performance engineer reads it: parallel, dispatcher, routing, precision, ...) and in their environment
(env.json: versions, variables, Slurm, host, git), how each metric moved (step time, host and device time, tokens/s,
TFLOP/s, peak memory, the last loss), and which wall moved: with a profile.json in both (``profile=window``), each
wall's ms/step with its 95 % interval, beyond the noise floor (``--noise-floor``, default the hardware's declared
run-to-run noise); without, what the step's host and device times say.

examples:
  moe-hydra diff outputs/ab/0 outputs/ab/1
  moe-hydra diff outputs/runs/2025-01-06/09-00-00 outputs/runs/2025-01-07/09-00-00 --noise-floor 0.02
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moe_hydra.analysis import diagnosis, report
from moe_hydra.analysis.runs import not_compared
from moe_hydra.commands._runs import load_runs, noise_floor_option
from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED, Refused
from moe_hydra.core.io import console

EXITS = {EXIT_OK: "the diff was printed", EXIT_REFUSED: "not two directories with complete, distinct runs"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dirs", nargs="+", type=Path, metavar="RUN", help="the two run directories, A then B")
    noise_floor_option(ap)


def run(args: argparse.Namespace) -> int:
    loaded, _, warn = load_runs("diff", args.dirs, need_steady=False)  # what changed, even in an unsteady window
    runs = loaded.runs
    for r in runs:
        if not r.steady.window_steady:
            warn(f"{r.path / 'results.json'}: its window is not steady, so its step time is no verdict: "
                 f"{r.steady.describe()}")
    if len(args.dirs) != 2 or len(runs) != 2:
        raise Refused(f"diff takes two run directories with complete, distinct results ({len(runs)} found)"
                      + "".join(f"\n  {m}" for m in not_compared(loaded)))
    report.print_diff(console(), diagnosis.diagnose(*runs, warn, args.noise_floor))
    return EXIT_OK
