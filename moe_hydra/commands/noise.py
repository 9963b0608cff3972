"""Measure the run-to-run noise of this machine (or cluster) from repeated runs of one config: noise.json.

    moe-hydra noise DIR [DIR ...] [--out DIR] [--pool]

The repeats (e.g. ``python -m moe_hydra repeat=0,1,2,3,4,5,6,7 -m``, locally or on Slurm) give the between-run
variance of one run's steady-window mean, written to ``noise.json`` in the first
directory (or ``--out``), and ``noise.png`` beside it (the runs' means, the between/within split). Point compare at it with ``--noise FILE`` or ``compare.noise_file`` (a site file sets it
once for a cluster); ``repeat=auto`` reads it to decide an A/B in the fewest runs.

examples:
  python -m moe_hydra repeat=0,1,2,3,4,5,6,7 hydra.sweep.dir=outputs/noise -m
  moe-hydra noise outputs/noise                     writes outputs/noise/noise.json
  moe-hydra compare outputs/ab --noise outputs/noise/noise.json
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from moe_hydra.analysis import figures
from moe_hydra.analysis import noise as noises
from moe_hydra.analysis.runs import Run
from moe_hydra.commands._runs import load_runs
from moe_hydra.core import contract as contracts
from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Failed, Refused
from moe_hydra.core.io import write_json

EXITS = {EXIT_OK: "noise.json written", EXIT_FAILED: "noise.json could not be written", EXIT_REFUSED: "fewer than "
         "two complete runs of one config, runs of several configs without --pool, a window of one step"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories holding repeats of one config")
    ap.add_argument("--out", type=Path, help="where noise.json goes (created; default: the first directory when "
                    "writable, else the current directory)")
    ap.add_argument("--pool", action="store_true", help="runs of several configs: pool their between-run variance "
                    "(runs nested in configs) instead of refusing")


def run(args: argparse.Namespace) -> int:
    loaded, _, warn = load_runs("noise", args.dirs, need_steady=False)
    unsteady = [r for r in loaded.runs if not r.steady.window_steady]
    for r in unsteady:  # measured all the same, and said: the noise then holds how far their warm-ups differ
        warn(f"{r.path / 'results.json'}: its window is not steady, so the noise measured holds its warm-up too: "
             f"{r.steady.describe()}")
    groups: dict[str, list[Run]] = {}
    for r in loaded.runs:
        groups.setdefault(contracts.digest(r.results["contract"]), []).append(r)
    if len(groups) > 1 and not args.pool:
        a, b = (g[0] for g in list(groups.values())[:2])
        diff = contracts.diff(a.results["contract"], b.results["contract"])
        shown = "\n  ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in diff[:10])
        raise Refused(f"the runs are of {len(groups)} configs, not repeats of one; {a.path} vs {b.path} differ "
                      f"in:\n  {shown}\n(give one config's repeats, or --pool to pool them)")
    if not loaded.runs:
        raise Refused("no complete run under " + ", ".join(map(str, args.dirs)))
    _, record = noises.measure(list(groups.values()), args.dirs)
    record["windows_not_steady"] = [str(r.path) for r in unsteady]
    first = args.dirs[0]
    out_dir = args.out if args.out is not None else (first if first.is_dir() and os.access(first, os.W_OK)
                                                      else Path.cwd())
    path = out_dir / noises.NOISE_FILE
    print(noises.summary(record))
    try:
        write_json(record, path)
        noises.plot(record, path.with_suffix(".png"))
    except OSError as e:
        raise Failed(f"cannot write {path}: {e.strerror or e}; choose a directory with --out DIR") from None
    print(f"written: {path}, {path.with_suffix('.png').name}\n  compare with it: moe-hydra compare DIR --noise {path}  (or set "
          f"compare.noise_file={path.resolve()} in a site file)")
    logged = figures.log("noise", [path.with_suffix(".png")], [r.path for r in loaded.runs], out_dir)
    if logged:
        print(f"W&B: noise.png logged with the runs ({logged})")
    return EXIT_OK
