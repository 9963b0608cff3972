"""Matched A/B verdicts with their confidence: each arm of a sweep against the baseline arm, under one contract.

    moe-hydra compare DIR [DIR ...] [--variable KEY ...] [--baseline ARM] [--noise FILE | --noise-floor X]
                      [--equivalence X] [--out DIR]

Runs (``results.json`` under the directories, each counted once) are grouped by their contract with the compared
variables left out: the variables swept by the runs' own multirun, or ``--variable``. Arms of a group differ only in
those variables by construction; runs that differ in anything else are never compared, and when no group has two
arms the comparison is refused with the contract diff shown.

The noise each verdict names: the arms' own when they were repeated (repeat=0,1,2); else a measured run-to-run noise
(``--noise FILE``, else ``compare.noise_file`` as the runs or the site file set it; ``moe-hydra noise`` writes one);
else the declared hardware.run_to_run_noise (or ``--noise-floor``), a floor. Verdicts: faster, slower, equivalent
(the 90 % interval within ``--equivalence``, default the runs' compare.equivalence, 5 %; needs repeats or a noise
file), undecided.
Runs profiled with ``profile=window`` say which wall moved. A sweep run with repeat=auto (sequential.json) is noted
with its own, sequential verdict. A campaign still running (a detached Slurm sweep) is compared as far as it has got,
with a note saying how many points are still out.

Output: a table on the terminal, and compare.md, compare.json (the verdicts, machine-readable) and compare.png
(step-time distributions per arm) in ``--out``, by default the first directory when it is writable, else the current
directory.

The other judgements of runs are commands of their own; compare still takes their old spellings:
``compare --accept DIR`` is ``moe-hydra accept DIR``, ``compare --diff A B`` is ``moe-hydra diff A B``, and
``compare --against FILE DIR`` is ``moe-hydra regress FILE DIR``.

examples:
  moe-hydra compare outputs/ab                      every arm of the sweep in outputs/ab against the baseline arm
  moe-hydra compare outputs/ab --noise outputs/noise/noise.json --equivalence 2%
  moe-hydra compare outputs/ab --baseline dispatcher=allgather --out reports/ab
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moe_hydra.analysis import compare, figures, report
from moe_hydra.analysis import noise as noises
from moe_hydra.commands._runs import fraction, load_runs, margin, out_dir
from moe_hydra.core import stats
from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Failed, Refused
from moe_hydra.core.io import console

EXITS = {EXIT_OK: "compared, whatever the verdict", EXIT_FAILED: "compare.md, compare.json or compare.png could not "
         "be written", EXIT_REFUSED: "nothing to compare (no two arms share a contract, fewer than two runs), a bad "
         "--noise-floor, --noise or --equivalence"}
# compare's former spellings of the other judgements: flag -> the command that does it now
REDIRECTS = {"--accept": "accept", "--diff": "diff", "--against": "regress"}


def redirect(argv: list[str]) -> tuple[str, list[str]] | None:
    """``compare --accept ...``, ``--diff ...``, ``--against FILE ...``: (the command, its arguments); None for an
    A/B.

    Raises:
        Refused: ``--save-baseline`` without ``--accept``.
    """
    if "--save-baseline" in argv and "--accept" not in argv:
        raise Refused("--save-baseline keeps an accepted run: give it with --accept (moe-hydra accept DIR "
                      "--save-baseline FILE)")
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in REDIRECTS:
            rest = argv[:i] + argv[i + 1:]
            if flag == "--against":  # regress takes the baseline file first
                if not eq:
                    if i + 1 >= len(argv):
                        return "regress", rest  # argparse says what is missing
                    value, rest = argv[i + 1], argv[:i] + argv[i + 2:]
                return "regress", [value, *rest]
            return REDIRECTS[flag], rest
    return None


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories")
    ap.add_argument("--variable", action="append", help="the variable under test (override key); repeatable")
    ap.add_argument("--baseline", help="the baseline arm, e.g. 'dispatcher=alltoall'")
    given = ap.add_mutually_exclusive_group()
    given.add_argument("--noise-floor", type=fraction, help="a declared run-to-run noise for one-run arms, relative, "
                       "in [0, 1), a floor (default: hardware.run_to_run_noise of the runs)")
    given.add_argument("--noise", type=Path, metavar="FILE", help="the measured run-to-run noise for one-run arms: a "
                       "noise.json from moe-hydra noise (default: compare.noise_file, else the declared one)")
    ap.add_argument("--equivalence", type=margin, metavar="X", help="the equivalence margin, relative: 2%% or 0.02 "
                    "(default: the runs' compare.equivalence, else 5%%; never derived from the noise)")
    ap.add_argument("--out", type=Path, help="where compare.md, compare.json and compare.png go (created; default: "
                    "the first directory when writable, else the current directory)")


def run(args: argparse.Namespace) -> int:
    # a run whose window is not steady is shown, its arm without a verdict (compare.NOT_STEADY)
    loaded, warnings, warn = load_runs("compare", args.dirs, need_steady=False)
    runs = loaded.runs

    variables = args.variable or sorted({k for r in runs for k in r.results.get("swept", [])
                                         if k not in compare.NOT_ARM_VARIABLES})
    try:
        measured = None if args.noise_floor is not None else noises.measured_floor(
            args.noise, [r.path for r in runs], warn)
    except Refused as e:
        raise Refused(f"--noise: {e}") from None
    equivalence = args.equivalence or compare.recorded_margin(runs, warn) or stats.EQUIVALENCE
    comps = compare.compare(runs, variables, args.baseline, args.noise_floor, warn, noise=measured,
                            equivalence=equivalence)
    sequential = compare.sequential_records(args.dirs, warn)
    out = console()
    out.print(report.table(comps))
    for c in comps:
        for n in c.notes:
            out.print(f"note: {n}", highlight=False, markup=False)
    for seq in sequential:
        out.print(f"note: {report.sequential_line(seq)}", highlight=False, markup=False)
    where = out_dir(args.out, args.dirs)
    try:
        written = report.write(comps, warnings, where, sequential)
    except OSError as e:
        raise Failed(f"cannot write compare.md, compare.png, compare.json to {where}: {e.strerror or e}; choose a "
                     "directory with --out DIR") from None
    out.print(f"written: {', '.join(map(str, written))}", highlight=False, markup=False)
    logged = figures.log("compare", [p for p in written if p.suffix == ".png"], [r.path for r in runs], where)
    if logged:
        out.print(f"W&B: compare.png logged with the runs ({logged})", highlight=False, markup=False)
    return EXIT_OK
