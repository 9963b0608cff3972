"""Start-up of a local tiny_moe run: warm (ranks forked from a server that imported torch and Megatron-Core
already, moe_hydra.job.warm) against spawned ranks and against the bare ``python -c "import torch, megatron.core"``.

Measured in one run of this script, on this machine:

- the bare import: the wall time of ``python -c "import torch, megatron.core"`` (``--bare`` times, the median), the
  least any fresh process that trains pays before it builds anything;
- the start-up of ``python -m moe_hydra logger=none contract.window=[4,10]`` (tiny_moe, one process, 10 steps, so
  that every run trains the same steps), as its
  ``results.json`` ``startup.seconds`` records it: from the command's start (the kernel's start time of its
  process) to the start of step 1 on rank 0, on CLOCK_BOOTTIME; and each command's wall time, start to exit;
- spawned (``MOE_HYDRA_WARM=0``, ``--cold`` runs) and warm runs alternate; the first warm run starts the server
  (``warm_started``: its imports count), the others find it (``warm``, ``--warm`` runs). The server lives in a
  private socket directory of this run and is stopped at the end.

Every run's losses (``loss.per_step``) are compared with the first spawned run's, exactly: a warm start must train
bit for bit as a spawned one (the script exits 1 otherwise, or when a run fails).

    python benchmarks/startup.py [--bare 3] [--cold 2] [--warm 3]

Goal: a warm run's start-up <= 4 s (spawned here: ~6 s; the bare import alone ~4.7 s). The last line is the
summary: the warm start-up (median), the bare import, the spawned start-up, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 4.0
WINDOW = "contract.window=[4,10]"  # ten steps in every run (contract.window=auto stops each on its own steady segment)


def _bare() -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", "import torch, megatron.core"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"the bare import failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def _run(tmp: Path, name: str, env: dict[str, str]) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={tmp}/{name}", "logger=none", WINDOW], cwd=tmp,
                       env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        sys.exit(f"{name} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads((tmp / name / "results.json").read_text())
    return {"name": name, "wall_s": wall, "startup": res["startup"], "loss": res["loss"]["per_step"],
            "step_ms": res["step_time_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bare", type=int, default=3, help="times the bare import is timed")
    ap.add_argument("--cold", type=int, default=2, help="spawned runs")
    ap.add_argument("--warm", type=int, default=3, help="warm runs that find the server (after the one starting it)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="startup"))
    sockets = Path(tempfile.mkdtemp(prefix="mhw"))  # short: socket paths are limited to 107 bytes
    base = {**os.environ, "MOE_HYDRA_WARM_DIR": str(sockets), "MOE_HYDRA_WARM_IDLE_S": "60"}
    try:
        bare = [_bare() for _ in range(args.bare)]
        runs = []
        order = ["warm"] + [kind for i in range(max(args.cold, args.warm)) for kind in ("cold", "warm")
                            if i < (args.cold if kind == "cold" else args.warm)]
        counts = {"cold": 0, "warm": 0}
        for kind in order:
            counts[kind] += 1
            env = {**base, "MOE_HYDRA_WARM": "0" if kind == "cold" else "1"}
            runs.append(_run(tmp, f"{kind}{counts[kind]}", env))
    finally:
        for pid_file in sockets.glob("*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    reference = next(r for r in runs if r["startup"]["start"] == "spawn")
    print(f"tiny_moe, 1 process, 10 steps, logger=none; {sys.executable}")
    print(f"bare `python -c \"import torch, megatron.core\"`: {', '.join(f'{t:.2f}' for t in bare)} s, "
          f"median {statistics.median(bare):.2f} s")
    print(f"{'run':<8} {'start':<13} {'start-up s':>10} {'wall s':>7} {'step ms':>8}  losses vs {reference['name']}")
    identical = True
    for r in runs:
        same = r["loss"] == reference["loss"]
        identical &= same
        print(f"{r['name']:<8} {r['startup']['start']:<13} {r['startup']['seconds']:>10.2f} {r['wall_s']:>7.2f} "
              f"{r['step_ms']:>8.1f}  {'bit-identical' if same else 'DIFFERENT'}")
    print(f"start-up: {reference['startup']['counter']}")
    by = {kind: [r for r in runs if r["startup"]["start"] == kind] for kind in ("warm", "warm_started", "spawn")}
    warm_s = statistics.median(r["startup"]["seconds"] for r in by["warm"])
    cold_s = statistics.median(r["startup"]["seconds"] for r in by["spawn"])
    bare_s = statistics.median(bare)
    started = by["warm_started"][0]["startup"]["seconds"] if by["warm_started"] else float("nan")
    print(f"the run that started the server: {started:.2f} s ({started / cold_s:.2f} x spawned); "
          f"warm wall {statistics.median(r['wall_s'] for r in by['warm']):.2f} s against spawned "
          f"{statistics.median(r['wall_s'] for r in by['spawn']):.2f} s")
    print(f"goal: warm start-up <= {GOAL_S:g} s: {'met' if warm_s <= GOAL_S else 'MISSED'}")
    if not identical:
        print("losses of a warm run differ from the spawned run's", file=sys.stderr)
    print(f"startup: warm {warm_s:.2f} s (median of {len(by['warm'])}), bare import {bare_s:.2f} s, spawned "
          f"{cold_s:.2f} s; warm/bare {warm_s / bare_s:.2f}, warm/spawned {warm_s / cold_s:.2f}; losses "
          f"{'bit-identical' if identical else 'DIFFERENT'}")
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
