"""The file-system boundary over every command: how many bad paths end in a traceback, and how many break a promise
(an exit other than 1 or 2, a message that names no path). The cases are :mod:`moe_hydra.testing.files`' (every
path argument of every command as nonexistent, a directory, a file, binary, Latin-1, truncated, empty, unreadable;
ledgers and site files corrupt), run in-process; then the concurrent case: pairs of commands started together into
one run directory, which one of them must get (exit 0) while the other is refused (exit 2) or runs after it, and
whose files must stay one command's.

    python benchmarks/hardening_files.py [--pairs 3]

Goal: 0 tracebacks, 0 broken promises. Unreadable paths need a user that a mode of 000 keeps out: as root they are
counted as skipped.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moe_hydra.testing import files


def _concurrent(pairs: int) -> tuple[int, int, list[str]]:
    """Pairs of stage=plan commands into one hydra.run.dir, started together: (pairs, broken, what broke)."""
    broken = []
    for i in range(pairs):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            models = ("tiny_moe", "qwen3_30b_a3b")
            procs = [subprocess.Popen([sys.executable, "-m", "moe_hydra", "stage=plan", f"model={m}",
                                       f"hydra.run.dir={run_dir}"], cwd=tmp, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for m in models]
            outs = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
            codes = sorted(c for c, _ in outs)
            plan = json.loads((run_dir / "plan.json").read_text()) if (run_dir / "plan.json").exists() else {}
            config = (run_dir / ".hydra" / "config.yaml").read_text() if (run_dir / ".hydra").exists() else ""
            named = [m for m in models if f"name: {m}" in config]
            if any("Traceback" in e for _, e in outs):
                broken.append(f"pair {i}: a traceback")
            elif codes not in ([0, 0], [0, 2]):
                broken.append(f"pair {i}: exits {codes}")
            elif len(named) != 1 or plan.get("model", named[0]) != named[0]:
                broken.append(f"pair {i}: the directory mixes two commands' files ({named})")
    return pairs, len(broken), broken


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="concurrent pairs into one run directory")
    args = ap.parse_args()
    by_command: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_kind: collections.Counter = collections.Counter()
    broken: list[str] = []
    start = time.perf_counter()
    cases = files.cases()
    for case in cases:
        if case.kind == files.UNREADABLE and not files.permissions_apply():
            by_command[case.command]["skipped"] += 1
            continue
        with tempfile.TemporaryDirectory() as tmp:
            outcome = files.check(case, Path(tmp))
        by_command[case.command]["cases"] += 1
        by_command[case.command][f"exit {outcome.code}"] += 1
        by_kind[case.kind] += 1
        if outcome.traceback:
            by_command[case.command]["tracebacks"] += 1
        if outcome.broken:
            broken.append(f"{case.id}: {outcome.broken}: {outcome.said.strip()[-200:]}")
    seconds = time.perf_counter() - start
    for line in broken[:10]:
        print(f"broken: {line}", file=sys.stderr)
    print(f"{len(cases)} cases in {seconds:.1f} s, by command:")
    for name, counts in sorted(by_command.items()):
        print(f"  {name:8s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print("by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    pairs, concurrent_broken, why = _concurrent(args.pairs)
    for line in why:
        print(f"broken: {line}", file=sys.stderr)
    tracebacks = sum(c["tracebacks"] for c in by_command.values())
    print(f"concurrent: {pairs} pairs of commands into one run directory, {concurrent_broken} broken")
    print(f"tracebacks {tracebacks}, broken promises {len(broken) + concurrent_broken} "
          f"(goal 0 and 0){'' if files.permissions_apply() else '; unreadable paths skipped: running as root'}")
    return 1 if tracebacks or broken or concurrent_broken else 0


if __name__ == "__main__":
    sys.exit(main())
