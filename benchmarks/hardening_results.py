"""Generated results.json files through ``results.read`` and compare's ``main``, in-process: how many exceptions
escape (tracebacks) and how many promises break (a refusal naming no field, a verdict from a run given twice, an
exit code outside 0/1/2).

The cases are :mod:`moe_hydra.testing.results`' strategy (``tests/test_results_fuzz.py`` draws from it too): two
runs of a dispatcher A/B per case (arbitrary JSON, bytes that are not JSON, valid files with one to three
mutations), sometimes a copy of a run, through the verdict, ``--accept`` or ``--diff``. Seeded: the same ``--seed``
generates the same files.

    python benchmarks/hardening_results.py [--files 2000] [--seed 0]

Goal: 0 tracebacks, 0 broken promises.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from moe_hydra.testing.results import Case, cases, check_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000, help="results.json files to generate (two per case)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    copies, codes = [0], collections.Counter()
    escaped: collections.Counter = collections.Counter()
    broken: list[str] = []
    first: dict[str, str] = {}

    @seed(args.seed)
    @settings(max_examples=(args.files + 1) // 2, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def one(case: Case) -> None:
        copies[0] += len(case.copies)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                codes[check_case(case, Path(tmp))] += 1
            except AssertionError as e:
                broken.append(repr(e)[:300])
            except Exception as e:  # what escaped read() or main(): the figure this benchmark counts
                escaped[type(e).__name__] += 1
                first.setdefault(type(e).__name__, traceback.format_exc())

    start = time.perf_counter()
    one()
    seconds = time.perf_counter() - start
    for name, text in first.items():
        print(f"first {name}:\n{text}", file=sys.stderr)
    for b in broken[:5]:
        print(f"broken promise: {b}", file=sys.stderr)
    cases_run = sum(codes.values()) + len(broken) + sum(escaped.values())
    print(f"{cases_run} cases, {copies[0]} copied runs; exit codes {dict(sorted(codes.items()))}; {len(broken)} broken "
          f"promises; {seconds:.1f} s")
    print(f"{2 * cases_run} files, {sum(escaped.values())} tracebacks" + (f" ({dict(escaped)})" if escaped else ""))
    return 1 if escaped or broken else 0


if __name__ == "__main__":
    sys.exit(main())
