"""What a profile costs: the tiny MoE with a 10-step ``profile=window`` against the same run unprofiled.

Both run the same steps (``train.train_iters``: the contract window, then the profiled steps), so the difference in
the command's wall time is the profiler's: tracing, exporting each rank's trace, the walls, profile.json. Runs
alternate (profiled, plain, profiled, plain, ...) and each side's figure is the median over its repeats. Also
printed: the profiled steps' mean step time against the measured window's (the profiler's perturbation of the
steps it traces) and rank 0's export-and-analysis time from profile.json.

    python benchmarks/profile_overhead.py [--repeats 3] [--procs 2] [--steps 10]

Goal: under 5 s beyond the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(args: list[str], cwd: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "moe_hydra", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2, help="processes (EP = procs)")
    ap.add_argument("--steps", type=int, default=10, help="profiled steps, after the window [4,10]")
    args = ap.parse_args()
    last = 10 + args.steps
    common = ["logger=none", f"hardware.devices_per_node={args.procs}", f"parallel.expert_model_parallel_size={args.procs}",
              "parallel.expert_tensor_parallel_size=1", f"train.train_iters={last}"]
    profiled, plain, docs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            run = f"{tmp}/profiled{i}"
            profiled.append(_run([f"hydra.run.dir={run}", *common, "profile=window", f"profile.steps=[11,{last}]"], tmp))
            docs.append(json.loads(Path(run, "profile.json").read_text()))
            plain.append(_run([f"hydra.run.dir={tmp}/plain{i}", *common], tmp))
    p, b = statistics.median(profiled), statistics.median(plain)
    ratio = statistics.median(d["step_time_ms"]["ratio"] for d in docs)
    overhead = statistics.median(d["overhead_s"] for d in docs)
    print(f"tiny_moe, {args.procs} process(es), {last} steps, {args.steps} profiled (11..{last}), "
          f"{args.repeats} alternating repeats (median)")
    print(f"command wall time   profiled {p:6.2f} s   unprofiled {b:6.2f} s   extra {p - b:+.2f} s   (goal < 5 s)")
    print(f"rank 0 trace export and walls: {overhead:.2f} s;  profiled steps / measured window steps: {ratio:.3f}")


if __name__ == "__main__":
    main()
