"""What live logging costs a run: the same CPU run with the W&B logger (offline, a history row and the routers'
counts every step) against ``logger=none`` (no W&B; the routers' counts still taken), alternating.

Each pair runs the default tiny MoE twice back to back in alternating order (live, none, none, live, ...), on the
same processes, steps and window. Two ratios, each the geometric mean over pairs of live / none with its 95 %
t-interval (scipy): the timed step (``step_time_ms``: what a live row must not slow) and the whole loop per window
step (``window_loop_ms_per_step``: the step plus everything between steps — the routers' all-reduce, queueing the
row; W&B itself writes on its own thread and process). Goal (issue 37): <= 1.01.

    python benchmarks/logging_overhead.py [--pairs 6] [--steps 40] [--procs 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scipy import stats

GOAL = 1.01


def run(out: Path, logger: str, procs: int, steps: int) -> dict:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, "-m", "moe_hydra", f"logger={logger}", f"hardware.devices_per_node={procs}",
                        f"contract.window=[6,{steps}]", f"hydra.run.dir={out}"], capture_output=True, text=True,
                       env=env, timeout=1800, check=False)
    if r.returncode:
        sys.exit(f"the run with logger={logger} failed: {(r.stdout + r.stderr)[-2000:]}")
    return json.loads((out / "results.json").read_text())


def ratio(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Geometric mean of a / b over the pairs and its 95 % t-interval."""
    logs = [math.log(a / b) for a, b in pairs]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40, help="steps a run; the window is 6..steps")
    ap.add_argument("--procs", type=int, default=1)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="moe_hydra_logging_overhead_"))
    step, loop = [], []
    for i in range(a.pairs):
        order = ("wandb", "none") if i % 2 == 0 else ("none", "wandb")
        got = {logger: run(root / f"{i}-{logger}", logger, a.procs, a.steps) for logger in order}
        live, bare = got["wandb"], got["none"]
        assert live["router"] and bare["router"], "the routers' counts are taken with and without W&B"
        step.append((live["step_time_ms"], bare["step_time_ms"]))
        loop.append((live["window_loop_ms_per_step"], bare["window_loop_ms_per_step"]))
        print(f"pair {i + 1}: step {live['step_time_ms']:.1f} vs {bare['step_time_ms']:.1f} ms, loop "
              f"{live['window_loop_ms_per_step']:.1f} vs {bare['window_loop_ms_per_step']:.1f} ms a step", flush=True)
    for name, pairs in (("timed step", step), ("loop per window step", loop)):
        r, lo, hi = ratio(pairs)
        print(f"live logging / none, {name}: {r:.4f} (95 % interval {lo:.4f}..{hi:.4f}) over {len(pairs)} pairs; "
              f"goal <= {GOAL}")


if __name__ == "__main__":
    main()
