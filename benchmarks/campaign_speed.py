"""How fast a campaign is queued and followed: ``launcher.detach=true`` of 100 points and ``sweep status`` of them,
each against the bare Slurm commands measured in the same run.

The partition is held (a partition of its own, created DOWN with ``scontrol create``: the jobs are accepted and
stay PENDING), so what is timed is the submission and the reading, never the jobs. Then it is released and the
campaign cancelled (``sweep cancel``, timed against ``scancel``), and the partition deleted.

    python benchmarks/campaign_speed.py [--points 100] [--runs 3]

Baselines: ``sbatch --wrap true`` of as many trivial jobs (one call each, as a script loop would) and one
``sbatch --array`` of them; ``squeue`` and ``sacct`` of the array.
Goals: detach of 100 points < 10 s (the whole command, Python and Hydra included); status of them < 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTITION = "moe_bench"


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def _time(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = _run(cmd, **kw)
    return time.perf_counter() - t0, r


def _median_time(cmd: list[str], runs: int, **kw) -> float:
    return statistics.median(_time(cmd, **kw)[0] for _ in range(runs))


def _sbatch_id(out: str) -> str:
    return out.strip().split(";")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3, help="repeats of the read-only timings (median)")
    args = ap.parse_args()
    if not shutil.which("sbatch") or _run(["sinfo", "-h"]).returncode:
        print("campaign_speed: no Slurm answers here (launchers/local-slurm/start)", file=sys.stderr)
        return 2
    n = args.points
    node = _run(["sinfo", "-h", "-o", "%N", "-p", "debug"]).stdout.split()[0].split(",")[0]
    _run(["scontrol", "delete", f"partitionname={PARTITION}"])
    made = _run(["scontrol", "create", f"partitionname={PARTITION}", f"nodes={node}", "state=down",
                 "maxtime=infinite"])
    if made.returncode:
        print(f"campaign_speed: cannot create partition {PARTITION}: {made.stderr.strip()}", file=sys.stderr)
        return 2
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    env.pop("MOE_HYDRA_SITE", None)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # ---- baselines: plain sbatch
            t0 = time.perf_counter()
            ids = [_sbatch_id(_run(["sbatch", "--parsable", f"--partition={PARTITION}", "--output=/dev/null",
                                    "--wrap", "true"], cwd=tmp).stdout) for _ in range(n)]
            sbatch_each = time.perf_counter() - t0
            array_s, r = _time(["sbatch", "--parsable", f"--partition={PARTITION}", "--output=/dev/null",
                                f"--array=0-{n - 1}", "--wrap", "true"], cwd=tmp)
            array = _sbatch_id(r.stdout)
            squeue_s = _median_time(["squeue", "-h", "-p", PARTITION], args.runs)
            sacct_s = _median_time(["sacct", "-n", "-P", "-o", "JobID,State", "-j", array], args.runs)
            scancel_s, _ = _time(["scancel", *ids, array])
            # ---- moe_hydra: detach, status, cancel
            results = {}
            variants = {"repeat": [f"repeat=range(0,{n})"],
                        "distinct": ["train.micro_batch_size=1,2", f"optimizer.lr=range(1,{n // 2 + 1})"]}
            for name, sweep in variants.items():
                sweep_dir = Path(tmp) / name
                cmd = [sys.executable, "-m", "moe_hydra", "launcher=slurm", f"launcher.partition={PARTITION}",
                       "launcher.detach=true", "hardware.devices_per_node=1", "logger=none",
                       f"hydra.sweep.dir={sweep_dir}", *sweep, "-m"]
                detach_s, r = _time(cmd, cwd=tmp, env=env)
                if r.returncode:
                    print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
                    return 1
                queued = len(json.loads((sweep_dir / "sweep.json").read_text())["points"])
                status_cmd = [sys.executable, "-m", "moe_hydra.sweep", "status", str(sweep_dir)]
                status_s = _median_time(status_cmd, args.runs, env=env)
                results[name] = (detach_s, status_s, queued, sweep_dir)
            _run(["scontrol", "update", f"partitionname={PARTITION}", "state=up"])  # released
            cancel_s = {}
            for name, (_, _, _, sweep_dir) in results.items():
                cancel_s[name], r = _time([sys.executable, "-m", "moe_hydra.sweep", "cancel", str(sweep_dir)], env=env)
            rows = [
                (f"detach {n} points, repeat sweep", results["repeat"][0], 10.0, sbatch_each, f"{n} x sbatch"),
                (f"detach {n} points, all distinct", results["distinct"][0], 10.0, sbatch_each, f"{n} x sbatch"),
                ("  (one sbatch --array of them)", array_s, None, None, ""),
                (f"sweep status, {n} pending points", results["repeat"][1], 3.0, squeue_s, "squeue"),
                ("  (sacct of the array)", sacct_s, None, None, ""),
                (f"sweep cancel, {n} points", cancel_s["repeat"], None, scancel_s, f"scancel of {n + 1} jobs"),
            ]
            assert results["repeat"][2] == n and results["distinct"][2] == n
    finally:
        _run(["scancel", "-p", PARTITION])
        for _ in range(20):
            if not _run(["squeue", "-h", "-p", PARTITION]).stdout.strip():
                break
            time.sleep(0.5)
        _run(["scontrol", "delete", f"partitionname={PARTITION}"])
    print(f"{'figure':40s} {'seconds':>8s} {'goal':>6s} {'baseline':>9s} {'ratio':>7s}  baseline")
    ok = True
    for label, value, goal, base, base_name in rows:
        ratio = f"{value / base:6.1f}x" if base else ""
        met = "" if goal is None else ("  (goal met)" if value < goal else "  (GOAL MISSED)")
        ok &= goal is None or value < goal
        print(f"{label:40s} {value:8.3f} {f'< {goal:g}' if goal else '':>6s} {f'{base:.3f}' if base else '':>9s} "
              f"{ratio:>7s}  {base_name}{met}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
