"""The validation gate: accept a run as evidence, or say why not; optionally keep it as golden values.

    moe-hydra accept DIR [DIR ...] [--variable KEY ...] [--save-baseline FILE]

A run is accepted when it is training-equivalent (real data, and the loss falls over the steady window), ran
>= 50 steps with a window of >= 10, has a finite loss with no NaN or skipped step, and carries the evidence, read
from the built model, that each variable under test was active. Every
results.json under the directories must pass: one that is stopped, failed or fails its schema is a refusal too.
The accepted run's evidence bundle is printed; ``--save-baseline FILE`` keeps the one accepted run as a baseline
file (golden values with their intervals) that ``moe-hydra regress`` judges later runs against.

examples:
  python -m moe_hydra data.kind=megatron "data.path=[data/docs]" "contract.window=[41,50]" hydra.run.dir=outputs/validate
  moe-hydra accept outputs/validate
  moe-hydra accept outputs/validate --save-baseline baselines/tiny.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moe_hydra.analysis import acceptance, baseline
from moe_hydra.analysis.runs import not_compared
from moe_hydra.commands._runs import load_runs
from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED, Refused
from moe_hydra.core.io import console

EXITS = {EXIT_OK: "accepted (and the baseline file written)", EXIT_REFUSED: "not accepted: every reason is listed"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories")
    ap.add_argument("--variable", action="append", help="the variable under test (override key) whose evidence the "
                    "run must carry; repeatable (default: what the runs' sweep swept)")
    ap.add_argument("--save-baseline", type=Path, metavar="FILE", help="keep the accepted run as a baseline file "
                    "(golden values with their intervals)")


def run(args: argparse.Namespace) -> int:
    loaded, _, _ = load_runs("accept", args.dirs)
    runs = loaded.runs
    variables = args.variable or sorted({k for r in runs for k in r.results.get("swept", []) if k != "repeat"})
    refusals, bundle = acceptance.accept(runs, variables)
    refusals = not_compared(loaded) + refusals  # a directory under the gate holds nothing unusable
    if refusals:
        raise Refused("not accepted:\n  " + "\n  ".join(refusals))
    if not runs:
        raise Refused("no complete run to accept")
    if args.save_baseline and len(runs) != 1:
        raise Refused(f"--save-baseline keeps one run; {len(runs)} were accepted")
    out = console()
    out.print("[bold green]accepted[/bold green] — evidence bundle:")
    for block in bundle:
        out.print(block, highlight=False, markup=False)
    if args.save_baseline:
        baseline.save(baseline.make(runs[0].path, runs[0].results, runs[0].window_steps), args.save_baseline)
        out.print(f"baseline written: {args.save_baseline}", highlight=False, markup=False)
    return EXIT_OK
