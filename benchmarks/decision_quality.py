"""How trustworthy compare's verdicts are on this machine, from real repeated runs of the tiny MoE.

Runs the same config N times (one sweep, ``repeat=0..N-1``, 20 steady steps each) and reports:

- A/A false-verdict rate, one run per arm: over all pairs of runs, how often two runs of the same config
  are called different — by a step-level Welch test alone (runs shift as a whole on a shared machine, so
  this is far above 5 %), and as compare calls them, beyond hardware.run_to_run_noise;
- A/A with repeats: the runs split into two arms of N/2, the run as the unit;
- the smallest effect detected at 20 steady steps: the median minimum detectable effect (80 % power) of
  the one-run pairs, and of the repeated split.

    python benchmarks/decision_quality.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from moe_hydra.core import stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repeats = ",".join(map(str, range(args.repeats)))
        subprocess.run([sys.executable, "-m", "moe_hydra", f"hydra.sweep.dir={tmp}/aa", "logger=none",
                        "contract.window=[4,23]", f"repeat={repeats}", "-m"], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs = [json.loads(Path(tmp, "aa", str(i), "results.json").read_text()) for i in range(args.repeats)]
    windows = [r["step_times_ms"][3:23] for r in runs]
    means = [statistics.fmean(w) for w in windows]
    floor = runs[0]["contract"]["hardware"]["run_to_run_noise"]
    combos = list(itertools.combinations(range(len(runs)), 2))
    bare = [stats.welch(windows[i], windows[j], "steps") for i, j in combos]
    pairs = [stats.welch(windows[i], windows[j], "steps", floor=floor) for i, j in combos]
    false_bare = sum(e.verdict != stats.SAME for e in bare)
    false = sum(e.verdict != stats.SAME for e in pairs)
    half = len(runs) // 2
    split = stats.welch(means[:half], means[half:2 * half], "runs")
    print(f"tiny_moe, 1 process, {len(runs)} runs of the same config, 20 steady steps each")
    print(f"run means (ms): {', '.join(f'{m:.1f}' for m in means)}  (spread {min(means):.1f}..{max(means):.1f})")
    print(f"A/A, one run per arm, step-level Welch alone: {false_bare} false verdicts in {len(bare)} pairs = "
          f"{false_bare / len(bare):.0%}; median MDE {statistics.median(e.mde for e in bare):.1%}")
    print(f"A/A, one run per arm, with the run-to-run floor {floor:.0%} (what compare does): {false} false verdicts in "
          f"{len(pairs)} pairs = {false / len(pairs):.0%}; median MDE {statistics.median(e.mde for e in pairs):.1%}")
    print(f"A/A, {half} vs {half} repeats (unit: runs): verdict '{split.verdict}', "
          f"{split.rel_step_time:+.1%} [{split.ci_low:+.1%}, {split.ci_high:+.1%}], MDE {split.mde:.1%}")


if __name__ == "__main__":
    main()
