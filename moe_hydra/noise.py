"""``python -m moe_hydra.noise DIR [DIR ...] [--out DIR] [--pool]``: the run-to-run noise measured from repeated
runs of one config (e.g. ``repeat=0,1,2,3,4,5,6,7 -m``, locally or on Slurm), written to ``noise.json`` in the
first directory (or ``--out``). Point compare at it with ``--noise FILE`` or ``compare.noise_file`` (a site file
sets it once for a cluster). The estimate: :mod:`moe_hydra.analysis.noise`.

Exit codes: 0 written; 1 noise.json could not be written; 2 refused (fewer than two complete runs of one config,
runs of several configs without ``--pool``, a window of one step).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from moe_hydra.analysis import compare
from moe_hydra.analysis import noise as noises
from moe_hydra.core import contract as contracts

EXIT_ERROR, EXIT_REFUSED = 1, 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_hydra.noise", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories holding repeats of one config")
    ap.add_argument("--out", type=Path, help="where noise.json goes (created; default: the first directory when "
                    "writable, else the current directory)")
    ap.add_argument("--pool", action="store_true", help="runs of several configs: pool their between-run variance "
                    "(runs nested in configs) instead of refusing")
    args = ap.parse_args(argv)

    def warn(message: str) -> None:
        print(f"moe_hydra.noise: warning: {message}", file=sys.stderr)

    loaded = compare.load(args.dirs, warn)
    groups: dict[str, list[compare.Run]] = {}
    for r in loaded.runs:
        groups.setdefault(contracts.digest(r.results["contract"]), []).append(r)
    try:
        if len(groups) > 1 and not args.pool:
            a, b = (g[0] for g in list(groups.values())[:2])
            diff = contracts.diff(a.results["contract"], b.results["contract"])
            shown = "\n  ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in diff[:10])
            raise noises.BadNoise(f"the runs are of {len(groups)} configs, not repeats of one; {a.path} vs {b.path} "
                                  f"differ in:\n  {shown}\n(give one config's repeats, or --pool to pool them)")
        if not loaded.runs:
            raise noises.BadNoise("no complete run under " + ", ".join(map(str, args.dirs)))
        _, record = noises.measure(list(groups.values()), args.dirs)
    except noises.BadNoise as e:
        print(f"moe_hydra.noise: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    first = args.dirs[0]
    out_dir = args.out if args.out is not None else (first if first.is_dir() and os.access(first, os.W_OK)
                                                      else Path.cwd())
    path = out_dir / noises.NOISE_FILE
    print(noises.summary(record))
    try:
        from moe_hydra.core.io import write_json

        write_json(record, path)
    except OSError as e:
        print(f"moe_hydra.noise: error: cannot write {path}: {e.strerror or e}; choose a directory with --out DIR",
              file=sys.stderr)
        return EXIT_ERROR
    print(f"written: {path}\n  compare with it: python -m moe_hydra.compare DIR --noise {path}  (or set "
          f"compare.noise_file={path.resolve()} in a site file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
