"""How well the steady-state judgment (moe_hydra.core.steady) tells a steady window from one that is not.

Two parts:

**Synthetic series with known truth** (seeded; ``--series`` each case): step times of 100 ms with multiplicative
noise (log-normal, 1-20 %), judged from step 1 (no declared warmup):

- ``flat``: no change, 30 / 100 / 300 steps; some with isolated stalls (one 3x step, or 2x steps at 2 % of the steps,
  never two in a row), some with bursts (3-5 steps 1.4x slow, one per 50 steps, not in the last 15). Counted: how often the judgment calls the last 10 steps not steady (goal <= 5 %), and how
  often its class is not ``flat``.
- ``warmup``: a warm-up of L = 0-200 steps, then 100 steady steps; its shape a level (the first L steps slower by A,
  as a cache or a compile that ends), or a ramp (slower by A at step 1, falling linearly to the steady time at step
  L+1), A = 20 %, 50 % or 100 %, where A is at least twice the noise (a smaller one is not a warm-up the noise lets
  anyone see). Counted: the steady segment's first step within +-3 of L+1 (goal >= 90 %). Also an exponential decay
  (A e^(-4 i / L)), whose end is not sharp: how far before L+1 the segment starts (reported, not a goal).
- ``slowdown``: 100 steps, the last 40 slower by 10 % (or faster: a late warm-up). Counted: the class ``slowdown``
  (goal >= 90 % at 2 % noise) and the change's step within +-3.
- ``drift``: a slow drift of +10 % over 100 steps: how often the judgment sees a change.
- ``auto``: ``contract.window=auto``'s decision replayed on flat series and on ramps and exponential warm-ups
  (``--series`` / 4 each): the step it stops at and its window's mean against the known steady time, with its drift
  rule and without it (the same series), the rule's cost and what it buys.

**Real runs on this machine** (``--real``, a few minutes): ``--repeats`` runs of 100 steps of the default (tiny MoE,
1 process) and of a 2-process layout (``expert_mesh=ep2``): where the steady segment starts and the class, and where
``contract.window=auto`` would have stopped on that very series, its window's mean against the run's own steady
segment (a later run would be judged against the machine's drift between runs, tens of percent here); then each with
``contract.window=auto`` itself: the steps it took, the window it measured, the steps it ran after that window (goal
<= 10 %), and the judgment's seconds against the run's wall time (goal <= 1 %).

    python benchmarks/steady_state.py [--series 200] [--real] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moe_hydra.core import steady

NOISES = (0.01, 0.02, 0.05, 0.10, 0.20)
WINDOW = 10  # the window judged at a series' end


def noisy(levels: list[float], noise: float, rng: random.Random) -> list[float]:
    return [x * math.exp(rng.gauss(0, noise)) for x in levels]


def stalls(times: list[float], rng: random.Random, lone: bool) -> list[float]:
    """One 3x stall somewhere (``lone``), or 2x stalls at 2 % of the steps, never two in a row."""
    out = list(times)
    if lone:
        i = rng.randrange(len(out))
        out[i] *= 3
        return out
    picked = set()
    for _ in range(max(1, len(out) // 50)):
        i = rng.randrange(len(out))
        if not {i - 1, i, i + 1} & picked:
            picked.add(i)
            out[i] *= 2
    return out


def bursts(times: list[float], rng: random.Random) -> list[float]:
    """A burst of 3-5 steps 1.4x slow, about one per 50 steps (at least 10 steps apart), before the last 15 steps:
    this CPU's other processes' work."""
    out, taken = list(times), set()
    for _ in range(max(1, len(out) // 50)):
        length = rng.randint(3, 5)
        i = rng.randrange(0, len(out) - 15 - length)
        if taken & set(range(i - 10, i + length + 10)):  # bursts apart: one at a time
            continue
        taken |= set(range(i, i + length))
        for k in range(i, i + length):
            out[k] *= 1.4
    return out


def rate(hits: int, n: int) -> str:
    return f"{hits / n:6.1%}" if n else "   n/a"


def flat(series: int, rng: random.Random) -> list[str]:
    rows = ["flat series: the last 10 steps called not steady (goal <= 5 %); the class not flat",
            f"  {'noise':>6} {'steps':>6} {'stalls':>12} {'not steady':>11} {'not flat':>9}"]
    worst = 0.0
    for noise in NOISES:
        for n in (30, 100, 300):
            for kind in ("none", "lone 3x", "2x at 2 %", "1.4x bursts"):
                bad = not_flat = 0
                for _ in range(series):
                    t = noisy([100.0] * n, noise, rng)
                    if kind == "1.4x bursts":
                        t = bursts(t, rng)
                    elif kind != "none":
                        t = stalls(t, rng, lone=kind == "lone 3x")
                    j = steady.judge(t, window=[n - WINDOW + 1, n])
                    bad += not j.window_steady
                    not_flat += j.kind != steady.FLAT
                worst = max(worst, bad / series)
                rows.append(f"  {noise:6.0%} {n:6d} {kind:>12} {rate(bad, series):>11} {rate(not_flat, series):>9}")
    rows.append(f"  worst case: {worst:.1%} not steady")
    return rows


def warmup_levels(shape: str, length: int, amplitude: float, steady_steps: int = 100) -> list[float]:
    if shape == "level":
        excess = [amplitude] * length
    elif shape == "ramp":
        excess = [amplitude * (1 - i / length) for i in range(length)]
    else:  # exponential: not a sharp end
        excess = [amplitude * math.exp(-4 * i / length) for i in range(length)]
    return [100.0 * (1 + e) for e in excess] + [100.0] * steady_steps


def warmups(series: int, rng: random.Random) -> list[str]:
    rows = ["warm-ups of L steps: the steady segment's first step within +-3 of L+1 (goal >= 90 % for a level's sharp "
            "end); its mean within 1 % of the steady time (what a gradual end's tail, inside the noise, costs)",
            f"  {'shape':>6} {'noise':>6} {'found':>7} {'within 3':>9} {'median offset':>14} {'mean in 1 %':>12}"]
    levels = [0, 0]
    for shape in ("level", "ramp", "exp"):
        for noise in NOISES:
            hits = total = found = close = 0
            offsets = []
            for _ in range(series):
                length = rng.choice((0, 5, 10, 20, 30, 50, 100, 150, 200))
                amplitude = rng.choice([a for a in (0.2, 0.5, 1.0) if a >= 2 * noise])
                truth = warmup_levels(shape, length, amplitude)
                j = steady.judge(noisy(truth, noise, rng))
                total += 1
                if j.segment:
                    found += 1
                    offsets.append(j.segment[0] - (length + 1))
                    hits += abs(j.segment[0] - (length + 1)) <= 3
                    part = truth[j.segment[0] - 1:j.segment[1]]
                    close += abs(sum(part) / len(part) / 100.0 - 1) <= 0.01
            if shape == "level":
                levels[0] += hits
                levels[1] += total
            offsets.sort()
            median = offsets[len(offsets) // 2] if offsets else float("nan")
            rows.append(f"  {shape:>6} {noise:6.0%} {rate(found, total):>7} {rate(hits, total):>9} {median:14.0f} "
                        f"{rate(close, total):>12}")
    rows.append(f"  levels: {rate(*levels).strip()} within +-3 steps")
    return rows


def shifts(series: int, rng: random.Random) -> list[str]:
    rows = ["a 10 % shift at step 61 of 100 (slower: slowdown; faster: warmup), and a drift of +10 % over 100 steps",
            f"  {'noise':>6} {'slower: found':>14} {'at +-3':>7} {'faster: found':>14} {'drift: seen':>12}"]
    for noise in NOISES:
        up = up_at = down = drift = 0
        for _ in range(series):
            j = steady.judge(noisy([100.0] * 60 + [110.0] * 40, noise, rng))
            up += j.kind == steady.SLOWDOWN
            up_at += j.kind == steady.SLOWDOWN and any(abs(c - 61) <= 3 for c in j.changepoints)
            j = steady.judge(noisy([110.0] * 60 + [100.0] * 40, noise, rng))
            down += j.kind == steady.WARMUP
            j = steady.judge(noisy([100.0 * (1 + 0.1 * i / 99) for i in range(100)], noise, rng))
            drift += j.kind != steady.FLAT
        rows.append(f"  {noise:6.0%} {rate(up, series):>14} {rate(up_at, series):>7} {rate(down, series):>14} "
                    f"{rate(drift, series):>12}")
    return rows


def autos(series: int, rng: random.Random) -> list[str]:
    """contract.window=auto's decision on synthetic series, with its drift rule and without it (DRIFT_Z infinite),
    the same series: where it stops, and its window's mean against the known steady time."""
    rows = ["contract.window=auto on synthetic series (steady_steps 10, 300 steps at most): the step it stops at "
            "(median) and its window's mean against the steady time (median, 90th percentile); with the drift rule / "
            "without it (the same series)"]
    cases = [("flat", 0, 0.0), ("ramp", 30, 0.5), ("exponential", 30, 0.5), ("exponential", 80, 1.0)]
    for shape, length, amplitude in cases:
        for noise in (0.02, 0.10, 0.20):
            found = {True: [], False: []}
            for _ in range(series):
                levels = [100.0] * 300 if shape == "flat" else warmup_levels(shape, length, amplitude, 300 - length)
                times = noisy(levels, noise, rng)
                for drift in (True, False):
                    saved = steady.DRIFT_Z
                    steady.DRIFT_Z = saved if drift else math.inf
                    try:
                        stop = simulated_auto(times, 0, steady.STEADY_STEPS)
                    finally:
                        steady.DRIFT_Z = saved
                    if stop:
                        w = stop[1]
                        found[drift].append((stop[0], sum(times[w[0] - 1:w[1]]) / (w[1] - w[0] + 1) / 100.0 - 1))
            cells = []
            for drift in (True, False):
                got = sorted(found[drift], key=lambda x: x[1])
                if not got:
                    cells.append("never stops")
                    continue
                steps = sorted(x[0] for x in got)
                cells.append(f"step {steps[len(steps) // 2]}, {got[len(got) // 2][1]:+.1%} / "
                             f"{got[int(0.9 * (len(got) - 1))][1]:+.1%}")
            name = "flat" if shape == "flat" else f"{shape} {length} steps +{amplitude:.0%}"
            rows.append(f"  {name}, noise {noise:.0%}: {cells[0]}  |  without: {cells[1]}")
    return rows


def judge_time(rng: random.Random) -> str:
    t = noisy([100.0] * 100, 0.05, rng)
    start = time.perf_counter()
    for _ in range(200):
        steady.judge(t, window=[91, 100])
    return f"one judgment of 100 steps: {(time.perf_counter() - start) / 200 * 1e3:.2f} ms"


# ------------------------------------------------------------------------------------------------ real runs

def run(out: Path, *overrides: str) -> dict:
    cmd = [sys.executable, "-m", "moe_hydra", "logger=none", f"hydra.run.dir={out}", *overrides]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline"})
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    res = json.loads((out / "results.json").read_text())
    res["_wall_s"] = wall
    return res


LAYOUTS = (("default", ()), ("ep2", ("hardware.devices_per_node=2", "expert_mesh=ep2")))


def simulated_auto(times: list[float], warmup: int, k: int) -> tuple[int, tuple[int, int]] | None:
    """Where contract.window=auto would have stopped on this series (the job's decision, step by step), and its
    window; None when it would not have."""
    for step in range(warmup + steady.AUTO_HISTORY * k, len(times) + 1):
        j = steady.judge(times[:step], warmup_steps=warmup, steady_steps=k)
        if steady.settled(j):
            return step, j.segment
    return None


def real(root: Path, repeats: int) -> list[str]:
    rows = ["real runs on this machine (each layout: --repeats runs of 100 steps, then --repeats of contract.window=auto)"]
    for name, extra in LAYOUTS:
        biases = []
        for i in range(repeats):
            res = run(root / f"{name}-100-{i}", "contract.window=[91,100]", *extra)
            times, warmup = res["step_times_ms"], res["warmup_steps"]
            j = steady.of_results(res)
            stop = simulated_auto(times, warmup, steady.STEADY_STEPS)
            line = (f"  {name}, 100 steps #{i}: {j.kind}, steady from step {j.segment[0] if j.segment else None}, "
                    f"{j.mean_ms or float('nan'):.1f} ms, noise {(j.noise or float('nan')):.1%}; levels "
                    + ", ".join(f"{a}-{b} {m:.0f}" for a, b, m in j.levels))
            if stop and j.mean_ms:
                w = stop[1]
                mean = sum(times[w[0] - 1:w[1]]) / (w[1] - w[0] + 1)
                biases.append(mean / j.mean_ms - 1)
                line += (f"; auto would stop at step {stop[0]}, window {list(w)}: {mean:.1f} ms, {biases[-1]:+.1%} "
                         "against this run's own steady segment")
            rows.append(line)
        if biases:
            biases.sort()
            rows.append(f"  {name}: auto's window against the same run's steady segment, median {biases[len(biases) // 2]:+.1%}, "
                        f"range {biases[0]:+.1%} to {biases[-1]:+.1%}")
        for i in range(repeats):
            res = run(root / f"{name}-auto-{i}", "contract.window=auto", *extra)
            s = res["steady"]
            w = res["window_measured"]
            after = res["steps"] - w[1]  # steps run after the window it measured
            rows.append(f"  {name}, contract.window=auto #{i}: {res['steps']} steps, window {w} ({s['class']}, "
                        f"steady {s['window_steady']}), {res['step_time_ms']:.1f} ms; steps after the window {after} "
                        f"({after / res['steps']:.0%}, goal <= 10 %); judging {s['seconds'] * 1e3:.1f} ms of the run's "
                        f"{res['_wall_s']:.1f} s ({s['seconds'] / res['_wall_s']:.2%}, goal <= 1 %)")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--series", type=int, default=200, help="series per case (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--real", action="store_true", help="also real runs on this machine (a few minutes)")
    p.add_argument("--repeats", type=int, default=3, help="contract.window=auto runs of each layout (default 3)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    print(f"moe_hydra.core.steady: {steady.METHOD}; steady segment >= {steady.STEADY_STEPS} steps")
    for rows in (flat(args.series, rng), warmups(args.series, rng), shifts(args.series, rng),
                 autos(args.series // 4, rng), [judge_time(rng)]):
        print("\n".join(rows))
    if args.real:
        with tempfile.TemporaryDirectory() as d:
            print("\n".join(real(Path(d), args.repeats)))


if __name__ == "__main__":
    main()
