"""Judge runs against golden values: a baseline file that ``moe-hydra accept --save-baseline`` wrote.

    moe-hydra regress BASELINE DIR [DIR ...] [--variable KEY ...] [--noise-floor X]

Every complete run under the directories that shares the baseline's contract (less ``--variable``) is judged
against it: its step time against the baseline's with their intervals, its peak memory and its window loss within
their tolerances. It exits 3 when one regressed, so CI fails.

examples:
  moe-hydra accept outputs/validate --save-baseline baselines/tiny.json
  moe-hydra regress baselines/tiny.json outputs/nightly          exit 3 when a run regressed
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moe_hydra.analysis import baseline
from moe_hydra.analysis.runs import not_compared
from moe_hydra.commands._runs import load_runs, noise_floor_option
from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED, EXIT_REGRESSED, Refused
from moe_hydra.core.io import console

EXITS = {EXIT_OK: "no run regressed", EXIT_REFUSED: "a bad baseline file, no complete run, or none that shares the "
         "baseline's contract", EXIT_REGRESSED: "a run regressed against the baseline"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("baseline", type=Path, metavar="BASELINE", help="the baseline file (moe-hydra accept "
                    "--save-baseline FILE)")
    ap.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories")
    ap.add_argument("--variable", action="append", help="a key the runs may differ from the baseline in; repeatable")
    noise_floor_option(ap)


def run(args: argparse.Namespace) -> int:
    golden = baseline.load(args.baseline)
    loaded, _, warn = load_runs("regress", args.dirs)
    if not loaded.runs:
        raise Refused("no complete run to judge" + "".join(f"\n  {m}" for m in not_compared(loaded)))
    judged = [baseline.judge(golden, r.path, r.results, r.window_steps, args.variable or [], args.noise_floor)
              for r in loaded.runs]
    out = console()
    out.print(baseline.table(golden, judged))
    for m in not_compared(loaded):
        warn(f"not judged: {m}")
    if all(j.refused for j in judged):
        raise Refused("no run shares the baseline's contract (see the table)")
    regressed = [j for j in judged if j.regressed]
    out.print(f"{len(regressed)} of {len(judged)} run(s) regressed against {args.baseline}"
              if regressed else f"no regression against {args.baseline}", highlight=False, markup=False)
    return EXIT_REGRESSED if regressed else EXIT_OK
