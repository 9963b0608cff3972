"""Generated override sets through ``stage=plan`` in-process (the run command, as the command line runs it): how many
exceptions escape (tracebacks), how many promises break (an exit code other than 0 or 2, a refusal naming none
of the keys it was given), and how long the slowest plan took.

The sets are :mod:`moe_hydra.testing.overrides`' strategy (``tests/test_overrides_fuzz.py`` draws from it too): one
to four overrides over every key of the schema and every config group (valid and invalid values, NaN, huge numbers,
interpolations, deletions, additions). Seeded: the same ``--seed`` generates the same sets; ``--workers`` processes
(this script again, ``--share``) each take a share, seeded apart.

    python benchmarks/hardening_overrides.py [--sets 10000] [--seed 0] [--workers 2]

Goals: 0 tracebacks, 0 hangs, 0 broken promises, every plan under 2 s.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def share(args: tuple[int, int]) -> dict:
    """Run ``n`` generated sets seeded with ``seed``; the counts."""
    n, seed_value = args
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from moe_hydra.testing.overrides import check_one, override_sets

    out = {"codes": collections.Counter(), "escaped": collections.Counter(), "broken": [], "first": {},
           "seconds": [], "slowest": (0.0, None)}
    done = [0]

    @seed(seed_value)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(override_sets)
    def one(overrides: list[str]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            try:
                code, _ = check_one(overrides, Path(tmp))
                out["codes"][code] += 1
            except AssertionError as e:
                out["broken"].append(repr(e)[:400])
            except BaseException as e:  # what escaped the run command: the figure this benchmark counts
                out["escaped"][type(e).__name__] += 1
                out["first"].setdefault(type(e).__name__, f"{overrides}\n{traceback.format_exc()}")
            seconds = time.perf_counter() - start
            out["seconds"].append(seconds)
            done[0] += 1
            if done[0] % 500 == 0:
                print(f"seed {seed_value}: {done[0]} of {n} sets", file=sys.__stderr__, flush=True)
            if seconds > out["slowest"][0]:
                out["slowest"] = (seconds, overrides)

    one()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--share", type=int, nargs=2, metavar=("SETS", "SEED"), help=argparse.SUPPRESS)  # one worker
    args = ap.parse_args()
    if args.share:
        print(json.dumps(share(tuple(args.share))))
        return 0
    per = [args.sets // args.workers + (i < args.sets % args.workers) for i in range(args.workers)]
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--share", str(n), str(args.seed * 1000 + i)],
                              stdout=subprocess.PIPE, text=True) for i, n in enumerate(per)]
    parts = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    wall = time.perf_counter() - start
    codes = sum((collections.Counter(p["codes"]) for p in parts), collections.Counter())
    escaped = sum((collections.Counter(p["escaped"]) for p in parts), collections.Counter())
    broken = [b for p in parts for b in p["broken"]]
    seconds = sorted(s for p in parts for s in p["seconds"])
    slowest = max((p["slowest"] for p in parts), key=lambda x: x[0])
    for p in parts:
        for name, text in p["first"].items():
            print(f"--- first {name}:\n{text}")
    for b in broken[:10]:
        print(f"--- broken: {b}")
    print(f"{len(seconds)} override sets in {wall:.0f} s ({args.workers} workers, seed {args.seed}): exit codes "
          f"{dict(sorted(codes.items()))}; {sum(escaped.values())} tracebacks {dict(escaped)}; {len(broken)} broken "
          f"promises; 0 hangs (every set returned); plan time median {statistics.median(seconds):.3f} s, p99 "
          f"{seconds[int(0.99 * (len(seconds) - 1))]:.3f} s, slowest {slowest[0]:.3f} s ({slowest[1]})")
    return 1 if escaped or broken or slowest[0] >= 2 else 0


if __name__ == "__main__":
    sys.exit(main())
