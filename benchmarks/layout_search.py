"""Wall time of the whole layout search for DeepSeek-V3 on 1024 H100s (no screening).

Each measurement runs in a fresh process (no caches carried over), alternating, median of --runs:

    baseline   enumerate every candidate, resolve its config and run the legality rules on it
               (rules.check): the least any exhaustive search over the legal space must do
    search     what hydra/sweeper=layout runs: Search(cfg, <the sweeper's communication settings>).run():
               enumerate -> rules -> parameters -> memory (least recompute that fits) -> the fastest
               communication setting that fits -> step-time terms -> rank, the candidates evaluated as numpy
               columns in one process

Then the scaling table: the same model on --gpus (default 128, 1024, 8192 and 16,384 H100s), one run of the
baseline and the median of --runs of the search: candidates, wall time, layouts/s and the peak memory (the largest
resident set of the search's processes).

    python benchmarks/layout_search.py [--runs 5] [--model deepseek_v3] [--nodes 128] [--gpus 128,1024,8192,16384]

Goals (issue 38): the search under 1 s on 1024 GPUs, under 3 s on 16,384, memory under 1 GiB.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = """
import dataclasses, resource, sys, time
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
seconds = time.perf_counter() - t
rss = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(n, seconds, rss / 2**20)
"""


def _run(baseline: bool, model: str, nodes: int) -> tuple[int, float, float]:
    """(candidates, seconds, peak resident GiB) of one fresh process."""
    code = CODE.format(model=model, nodes=nodes, baseline=baseline)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), float(out[1]), float(out[2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="deepseek_v3")
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--gpus", default="128,1024,8192,16384", help="the scaling table's world sizes (H100s, 8 a "
                    "node); empty: none")
    args = ap.parse_args()
    base, full = [], []
    for _ in range(args.runs):
        n, t, _ = _run(True, args.model, args.nodes)
        base.append(t)
        n, t, _ = _run(False, args.model, args.nodes)
        full.append(t)
    b, f = statistics.median(base), statistics.median(full)
    print(f"{args.model} on {args.nodes * 8} x H100: {n} candidate layouts, median of {args.runs} fresh processes, "
          "one process each")
    print(f"  baseline (rules only) : {b:.3f} s")
    print(f"  search                : {f:.3f} s  ({f / b:.2f}x the baseline)")
    print(f"goal: the search under 1 s: {'met' if f < 1 else 'NOT met'}", flush=True)
    gpus = [int(g) for g in args.gpus.split(",") if g]
    if gpus:
        print(f"scaling, {args.model}, fresh processes (search: median of {args.runs}):\n"
              f"  {'GPUs':>6} {'candidates':>10} {'baseline s':>10} {'search s':>9} {'layouts/s':>9} {'x baseline':>10} "
              f"{'peak GiB':>8}")
    for g in gpus:
        _, b, _ = _run(True, args.model, g // 8)
        runs = [_run(False, args.model, g // 8) for _ in range(args.runs)]
        n, t, rss = runs[0][0], statistics.median(r[1] for r in runs), max(r[2] for r in runs)
        print(f"  {g:>6} {n:>10} {b:>10.2f} {t:>9.2f} {n / t:>9.0f} {t / b:>10.2f} {rss:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
