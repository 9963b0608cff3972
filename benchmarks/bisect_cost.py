"""What bisect spends to name the culprit, against one-key-at-a-time bisection over the same difference.

For 4, 8 and 16 differing units, on a simulated machine with this machine's noise (or a noise.json's), two cases:
one unit slows the step (``single``), or two units slow it only together (``interaction``); every other unit is
neutral. Each A/B is the very test bisect runs: repeat=auto's group-sequential test
(:func:`moe_hydra.core.stats.sequential_looks`, ``bisect.max_repeats`` runs an arm at most) on synthetic runs —
a run's steps are its config's mean x (1 + a run effect N(0, sigma_b) + a step's N(0, sigma_w)), a config's mean
good's x (1 + effect) when the culprit is applied, else good's.

- **bisect**: the reproduction (bad against good), then :func:`moe_hydra.planning.ddmin.ddmin` over the units with
  "slower" as the regression (what :class:`moe_hydra.launch.bisect.Bisect` runs);
- **one key at a time**: the reproduction, then each unit alone on good in a random order until an A/B says
  "slower" (a person's manual bisection; it never finds an interaction: it ends after every unit, naming none).

Prints, per case and number of units, the mean A/Bs and runs (both arms, the reproduction included) of each, how
often each named exactly the culprit, and the ratio of runs bisect / one-at-a-time. Pure CPU arithmetic: seconds.

    python benchmarks/bisect_cost.py [--sims 200] [--effect 0.3] [--noise noise.json] [--sigma-b 0.08]
        [--sigma-w 0.10] [--steps 8] [--max-repeats 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np

from moe_hydra.core import stats
from moe_hydra.planning import ddmin


class Machine:
    """Synthetic A/Bs: each subset of units applied to good is a config; ``culprit``: the units that together slow
    the step by ``effect``."""

    def __init__(self, rng: np.random.Generator, culprit: set[int], effect: float, sigma_b: float, sigma_w: float,
                 steps: int, design: stats.Design):
        self.rng, self.culprit, self.effect = rng, culprit, effect
        self.sigma_b, self.sigma_w, self.steps, self.design = sigma_b, sigma_w, steps, design
        self.abs = self.runs = 0

    def _runs(self, mean: float) -> list[stats.RunStat]:
        k = self.design.max_repeats
        x = mean * (1 + self.rng.normal(0.0, self.sigma_b, k)[:, None]
                    + self.rng.normal(0.0, self.sigma_w, (k, self.steps)))
        return [stats.RunStat(float(r.mean()), float(r.var(ddof=1) / self.steps), self.steps) for r in x]

    def ab(self, subset: tuple[int, ...], margin: float | None = None) -> tuple[str, float]:
        """The verdict of the subset applied to good, against good, and its change; counts the A/B and its runs.
        ``margin``: the equivalence margin (the design's when None)."""
        slow = self.culprit <= set(subset)
        design = self.design if margin is None else dataclasses.replace(self.design, margin=margin)
        looks = stats.sequential_looks(self._runs(100.0), self._runs(100.0 * (1 + self.effect * slow)), design)
        self.abs += 1
        self.runs += 2 * (looks[-1].look if looks else design.max_repeats)
        return (looks[-1].verdict, looks[-1].rel_step_time) if looks else (stats.UNDECIDED, 0.0)


def bisect(m: Machine, n: int) -> tuple[int, ...] | None:
    verdict, regression = m.ab(tuple(range(n)))
    if verdict != stats.SLOWER:
        return None
    margin = max(m.design.margin or 0.0, regression / 2)  # Bisect.margin: a pass holds under half the regression
    outcome = {stats.SLOWER: ddmin.FAIL, stats.FASTER: ddmin.PASS, stats.EQUIVALENT: ddmin.PASS}
    result = ddmin.ddmin(n, lambda s: outcome.get(m.ab(s, margin)[0], ddmin.UNRESOLVED),
                         known={tuple(range(n)): ddmin.FAIL})
    return result.culprit


def one_at_a_time(m: Machine, n: int) -> tuple[int, ...] | None:
    if m.ab(tuple(range(n)))[0] != stats.SLOWER:
        return None
    for i in m.rng.permutation(n):
        if m.ab((int(i),))[0] == stats.SLOWER:
            return (int(i),)
    return None


def campaign(search, n: int, pair: bool, args, design: stats.Design, seed: int) -> tuple[int, int, bool]:
    rng = np.random.default_rng(seed)
    culprit = {int(i) for i in rng.choice(n, 2 if pair else 1, replace=False)}
    m = Machine(rng, culprit, args.effect, args.sigma_b, args.sigma_w, args.steps, design)
    named = search(m, n)
    return m.abs, m.runs, named is not None and set(named) == culprit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=200, help="campaigns per case, search and size")
    ap.add_argument("--effect", type=float, default=0.30, help="the culprit's slowdown (relative)")
    ap.add_argument("--noise", type=Path, help="a noise.json (moe-hydra noise): its sigma_b and sigma_w")
    ap.add_argument("--sigma-b", type=float, default=0.08, help="run-to-run noise, relative (this machine's: ~8 %%)")
    ap.add_argument("--sigma-w", type=float, default=0.10, help="step-to-step noise, relative")
    ap.add_argument("--steps", type=int, default=8, help="steady steps a run (bisect.window [4,11])")
    ap.add_argument("--max-repeats", type=int, default=8, help="runs an arm at most (bisect.max_repeats)")
    args = ap.parse_args()
    if args.noise:
        rec = json.loads(args.noise.read_text())
        args.sigma_b, args.sigma_w = rec["run_to_run_noise"], rec["step_noise"]
    design = stats.Design(max_repeats=args.max_repeats, margin=stats.EQUIVALENCE)
    print(f"noise: run-to-run {args.sigma_b:.1%}, steps {args.sigma_w:.1%}, {args.steps} steps a run; culprit "
          f"+{args.effect:.0%}; {args.sims} campaigns each; A/Bs and runs include the reproduction")
    print(f"{'case':<12}{'units':>6}  {'bisect A/Bs':>11} {'runs':>6} {'named':>6}  {'1-at-a-time A/Bs':>16} "
          f"{'runs':>6} {'named':>6}  {'runs ratio':>10}")
    record = []
    for pair in (False, True):
        for n in (4, 8, 16):
            row = {"case": "interaction" if pair else "single", "units": n}
            for name, search in (("bisect", bisect), ("one_at_a_time", one_at_a_time)):
                out = [campaign(search, n, pair, args, design, seed) for seed in range(args.sims)]
                row[name] = {"abs": statistics.fmean(o[0] for o in out), "runs": statistics.fmean(o[1] for o in out),
                             "named": sum(o[2] for o in out) / len(out)}
            row["runs_ratio"] = row["bisect"]["runs"] / row["one_at_a_time"]["runs"]
            record.append(row)
            b, o = row["bisect"], row["one_at_a_time"]
            print(f"{row['case']:<12}{n:>6}  {b['abs']:>11.1f} {b['runs']:>6.1f} {b['named']:>6.0%}  "
                  f"{o['abs']:>16.1f} {o['runs']:>6.1f} {o['named']:>6.0%}  {row['runs_ratio']:>10.2f}")
    print(json.dumps({"sigma_b": args.sigma_b, "sigma_w": args.sigma_w, "effect": args.effect, "rows": record}))


if __name__ == "__main__":
    main()
