"""How trustworthy compare's verdicts are on this machine, and how many runs a decision takes, from real repeated runs
of the tiny MoE.

Runs the same config N times (one sweep, ``repeat=0..N-1``, 20 steady steps each) and reports:

- the measured noise: ``python -m moe_hydra.noise`` on the sweep (sigma_between / mean with its 95 % interval, the
  steps' sigma_within, one run mean's noise), against the declared hardware.run_to_run_noise;
- A/A false verdicts over all pairs of one run each: a step-level Welch test alone (runs shift as a whole, so far
  above 5 %), beyond the declared floor (compare's fallback), and with the measured noise — measured from the
  *other* runs, so no pair judges itself;
- the minimum detectable effect (80 % power, 5 % two-sided) at 1, 2 and 4 runs per arm: one run each against the
  measured noise (t on the noise's df), repeated arms on their own run means (Welch, 2k - 2 df);
- repeat=auto (the group-sequential test of moe_hydra.launch.sequential) simulated at this machine's measured
  sigma_between and sigma_within, the noise file pooled: the runs per arm it uses and its verdicts for a 5 % effect
  and for A/A, at compare.max_repeats 6 and 8;
- with ``--auto``: one real repeat=auto campaign, train.micro_batch_size=4 vs 5 (25 % more tokens a step) with the
  measured noise file, its verdict and the runs it used.

    python benchmarks/decision_quality.py [--repeats 8] [--sims 2000] [--auto] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from moe_hydra.core import stats

WINDOW = (4, 23)  # 3 warmup steps, 20 steady ones


def _sweep(tmp: str, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_hydra", f"hydra.sweep.dir={tmp}/{name}", "logger=none",
                           f"contract.window=[{WINDOW[0]},{WINDOW[1]}]", *args], cwd=tmp, capture_output=True,
                          text=True, check=False)


def _mde(k: int, run_var: float, df: float) -> float:
    """The minimum detectable effect (relative) with k runs per arm, a run mean's relative variance, df."""
    from scipy import stats as st

    return float((st.t.ppf(0.975, df) + st.t.ppf(0.80, df)) * (2 * run_var / k) ** 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--sims", type=int, default=2000, help="simulated repeat=auto campaigns per case")
    ap.add_argument("--auto", action="store_true", help="also run a real repeat=auto campaign, MBS 4 vs 5")
    ap.add_argument("--dir", type=Path, help="keep the sweeps (and noise.json) here instead of a temporary directory")
    args = ap.parse_args()
    if args.dir:
        args.dir.mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(str(args.dir.resolve())) if args.dir else tempfile.TemporaryDirectory()) as tmp:
        r = _sweep(tmp, "aa", f"repeat={','.join(map(str, range(args.repeats)))}", "-m")
        if r.returncode:
            sys.exit(f"the A/A sweep failed:\n{r.stderr[-2000:]}")
        runs = [json.loads(Path(tmp, "aa", str(i), "results.json").read_text()) for i in range(args.repeats)]
        subprocess.run([sys.executable, "-m", "moe_hydra.noise", f"{tmp}/aa"], check=True, capture_output=True)
        noise_file = Path(tmp, "aa", "noise.json")
        measured = json.loads(noise_file.read_text())
        auto = _auto(tmp, noise_file) if args.auto else None
    windows = [r["step_times_ms"][WINDOW[0] - 1:WINDOW[1]] for r in runs]
    means = [statistics.fmean(w) for w in windows]
    declared = runs[0]["contract"]["hardware"]["run_to_run_noise"]
    n = WINDOW[1] - WINDOW[0] + 1
    nz = stats.run_noise([windows])
    print(f"tiny_moe, 1 process, {len(runs)} runs of the same config, {n} steady steps each")
    print(f"run means (ms): {', '.join(f'{m:.1f}' for m in means)}  (spread {min(means):.1f}..{max(means):.1f}, "
          f"{(max(means) - min(means)) / statistics.fmean(means):.1%})")
    lo, hi = measured["interval"]
    print(f"measured noise (python -m moe_hydra.noise): run-to-run {measured['run_to_run_noise']:.2%} "
          f"[{lo:.2%}, {hi:.2%}] (df {measured['df']:.1f}); steps {measured['step_noise']:.2%}; one run's mean "
          f"{measured['run_mean_noise']:.2%}; declared hardware.run_to_run_noise {declared:.0%}")

    pairs = list(itertools.combinations(range(len(runs)), 2))
    bare = sum(stats.welch(windows[i], windows[j], "steps").verdict in (stats.FASTER, stats.SLOWER) for i, j in pairs)
    floor = sum(stats.welch(windows[i], windows[j], "steps", floor=declared).verdict in (stats.FASTER, stats.SLOWER)
                for i, j in pairs)
    held_out = 0
    for i, j in pairs:
        others = stats.run_noise([[w for k, w in enumerate(windows) if k not in (i, j)]])
        e = stats.measured([stats.RunStat.of(windows[i])], [stats.RunStat.of(windows[j])], others.relative,
                           max(others.df, 1.0), step_noise=others.step_noise, step_df=others.df_within)
        held_out += e.verdict in (stats.FASTER, stats.SLOWER)
    print(f"A/A, one run per arm, {len(pairs)} pairs: faster/slower by a step-level Welch alone {bare} "
          f"({bare / len(pairs):.0%}); beyond the declared {declared:.0%} floor {floor} ({floor / len(pairs):.0%}); "
          f"with the noise measured on the other runs {held_out} ({held_out / len(pairs):.0%})")

    run_var = nz.run_mean_noise ** 2
    df_noise = max(nz.df, 1.0)
    mde = {1: _mde(1, run_var, df_noise), 2: _mde(2, run_var, 2), 4: _mde(4, run_var, 6)}
    pooled = {k: _mde(k, run_var, df_noise + 2 * k - 2) for k in (2, 4)}
    floor_mde = statistics.median(stats.welch(windows[i], windows[j], "steps", floor=declared).mde for i, j in pairs)
    print(f"MDE (80 % power, 5 % two-sided): 1 run per arm {mde[1]:.1%} (measured noise, t on {df_noise:.1f} df); "
          f"2 runs per arm {mde[2]:.1%}, 4 runs per arm {mde[4]:.1%} (their own run means, Welch: compare's "
          f"repeats); with the measured noise pooled (repeat=auto's variance) {pooled[2]:.1%} and {pooled[4]:.1%}; "
          f"one run per arm beyond the declared floor {floor_mde:.1%}")

    print(f"repeat=auto, simulated at sigma_b {nz.relative:.2%}, sigma_w {nz.step_noise:.2%}, {n} steps, the noise "
          f"file pooled ({args.sims} campaigns each):")
    margin = stats.EQUIVALENCE  # declared (compare.equivalence), never derived from the noise
    for cap in (6, 8):
        design = stats.Design(max_repeats=cap, margin=margin, noise=nz.relative, noise_df=max(nz.df, 1.0),
                              step_noise=nz.step_noise)
        for effect in (0.05, 0.0):
            sim = stats.simulate(effect, design, nz.relative, nz.step_noise, n, sims=args.sims, seed=19)
            v = sim["verdicts"]
            if effect:
                what = (f"5 % effect: slower {v['slower']:.1%} (power), slower within 6 runs per arm "
                        f"{sim['verdict_within']['slower'][min(6, cap)]:.1%}")
            else:
                what = (f"A/A: faster/slower {v['faster'] + v['slower']:.1%}, equivalent within ±{margin:.1%} "
                        f"{v['equivalent']:.1%}")
            print(f"  max_repeats {cap}, {what}; runs per arm {sim['runs_per_arm_mean']:.1f} on average "
                  f"({', '.join(f'{k}: {p:.0%}' for k, p in sim['runs_per_arm'].items() if p >= 0.005)})")
    if auto:
        print(auto)


def _auto(tmp: str, noise_file: Path) -> str:
    """One real repeat=auto campaign, MBS 4 vs 5, with the measured noise: its line."""
    r = _sweep(tmp, "auto", "train.global_batch_size=20", "train.micro_batch_size=4,5", "repeat=auto",
               f"compare.noise_file={noise_file}", "-m")  # one global batch: the same tokens a step (like with like)
    seq = Path(tmp, "auto", "sequential.json")
    if r.returncode or not seq.exists():
        return f"repeat=auto (real, MBS 4 vs 5): did not run ({(r.stderr.strip().splitlines() or ['?'])[-1]})"
    rec = json.loads(seq.read_text())
    (pair,) = rec["pairs"]
    ci = pair["ci"] or [float("nan")] * 2
    return (f"repeat=auto (real, MBS 4 vs 5, measured noise): {pair['verdict']} {pair['rel_step_time']:+.1%} "
            f"[{ci[0]:+.1%}, {ci[1]:+.1%}] after {len(rec['rounds'])} rounds; runs used {rec['runs_used']}")


if __name__ == "__main__":
    main()
