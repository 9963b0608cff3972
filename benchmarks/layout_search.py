"""Wall time of the whole layout search for DeepSeek-V3 on 1024 H100s (no screening).

Each measurement runs in a fresh process (no caches carried over), alternating, median of --runs:

    baseline   enumerate every candidate, resolve its config and run the legality rules on it
               (rules.check): the least any exhaustive search over the legal space must do
    search     what hydra/sweeper=layout runs: Search(cfg, <the sweeper's communication settings>).run():
               enumerate -> rules -> parameters -> memory (least recompute that fits) -> the fastest
               communication setting that fits -> step-time terms -> rank (forked over this machine's CPUs)
    serial     the same in one process (MOE_HYDRA_SEARCH_WORKERS=1)

    python benchmarks/layout_search.py [--runs 5] [--model deepseek_v3] [--nodes 128]

Goal: the search under 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from moe_hydra.planning.search import search_workers

CODE = """
import dataclasses, sys, time
from moe_hydra.launch.compose import compose_typed
from moe_hydra.core.resolved import resolve
from moe_hydra.core.versions import mcore_facts
from moe_hydra.launch.layout_sweeper import LayoutSweeperImpl
from moe_hydra.planning import rules, search
cfg = compose_typed(["stage=plan", "model={model}", "hardware=h100_sxm", "hardware.nodes={nodes}"])
t = time.perf_counter()
if {baseline}:
    mcore, base = mcore_facts(), resolve(cfg)
    n = 0
    for c in search.enumerate_layouts(base):
        candidate = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **c.fields()))
        rules.check(resolve(candidate, base.impl, base.arch), mcore)
        n += 1
else:
    dispatchers, ep_overlap = LayoutSweeperImpl().communication(cfg, set())
    n = len(search.Search(cfg, dispatchers=dispatchers, ep_overlap=ep_overlap).run())
print(n, time.perf_counter() - t)
"""


def _run(baseline: bool, model: str, nodes: int, workers: str = "") -> tuple[int, float]:
    code = CODE.format(model=model, nodes=nodes, baseline=baseline)
    env = {**os.environ, "MOE_HYDRA_SEARCH_WORKERS": workers}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="deepseek_v3")
    ap.add_argument("--nodes", type=int, default=128)
    args = ap.parse_args()
    base, full, serial = [], [], []
    for _ in range(args.runs):
        n, t = _run(True, args.model, args.nodes)
        base.append(t)
        n, t = _run(False, args.model, args.nodes)
        full.append(t)
        n, t = _run(False, args.model, args.nodes, workers="1")
        serial.append(t)
    b, f, s = statistics.median(base), statistics.median(full), statistics.median(serial)
    print(f"{args.model} on {args.nodes * 8} x H100: {n} candidate layouts, median of {args.runs} fresh processes, "
          f"{search_workers(n)} worker(s) on this machine")
    print(f"  baseline (rules only) : {b:.3f} s")
    print(f"  search                : {f:.3f} s  ({f / b:.2f}x the baseline)")
    print(f"  search, one process   : {s:.3f} s  ({s / b:.2f}x the baseline)")
    print(f"goal: the search under 1 s: {'met' if f < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
