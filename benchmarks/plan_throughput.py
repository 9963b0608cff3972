"""Layouts validated and estimated per second: DeepSeek-V3 on 1024 H100s.

Enumerates the layout search's candidates (TP, CP, PP, VPP, EP, ETP over the divisors of 1024) and
times, on the same candidates in this run:

    baseline   rules.check alone (legality, the cheapest thing a planner must do)
    plan       plan.assess, exactly what stage=plan runs per config: rules, per-rank parameters per
               pipeline stage, the memory estimate (no caches shared between candidates)
    search     Search.evaluate, the layout search's path through the same functions, sharing what
               candidates have in common (rules per mesh, parameters per split), trying up to three
               recompute levels and computing the step-time terms

    python benchmarks/plan_throughput.py [--limit 5000]

Goal: >= 10^4 layouts per second (the plan path) — the figure printed last.
"""

from __future__ import annotations

import argparse
import time

from moe_hydra.core.resolved import resolve
from moe_hydra.core.versions import mcore_facts
from moe_hydra.launch.compose import compose_typed
from moe_hydra.planning import plan, rules, search


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=5000, help="candidates to time (spread over the whole space)")
    args = ap.parse_args()
    cfg = compose_typed(["stage=plan", "model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128"])
    s = search.Search(cfg)
    every = list(search.enumerate_layouts(s.base))
    stride = max(1, len(every) // args.limit)
    cands = every[::stride][: args.limit]
    configs = [s.config(c) for c in cands]
    mcore, base_plan = mcore_facts(), resolve(cfg)
    plans = [resolve(c, base_plan.impl, base_plan.arch) for c in configs]

    t = time.perf_counter()
    legal = sum(not rules.check(r, mcore) for r in plans)
    base = time.perf_counter() - t

    t = time.perf_counter()
    fits = 0
    for c in configs:
        try:
            a = plan.assess(resolve(c, base_plan.impl, base_plan.arch), mcore)
        except rules.LayoutError:
            continue
        fits += a.peak.total <= cfg.hardware.memory_gib * 2**30
    planned = time.perf_counter() - t

    t = time.perf_counter()
    for c in cands:
        s.evaluate(c)
    searched = time.perf_counter() - t

    n = len(cands)
    print(f"{n} of {len(every)} candidate layouts of DeepSeek-V3 on 1024 x H100 ({legal} legal, {fits} fit without recompute)")
    print(f"  baseline rules.check : {n / base:9.0f} layouts/s")
    print(f"  plan.assess          : {n / planned:9.0f} layouts/s  ({planned / base:.2f}x the baseline's time)")
    print(f"  Search.evaluate      : {n / searched:9.0f} layouts/s  ({searched / base:.2f}x the baseline's time)")
    print(f"goal >= 10^4 layouts/s validated and estimated: {'met' if n / planned >= 1e4 else 'NOT met'} "
          f"({n / planned:.0f}/s on the plan path)")


if __name__ == "__main__":
    main()
