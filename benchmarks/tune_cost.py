"""What tune costs against an AutoConfigurator-style grid over the same space, and whether it finds as good a winner.

On tiny_moe with 2 processes, from the poor start tests/test_tune.py uses (full recompute, micro-batch 1 at GBS 8):

1. ``python -m moe_hydra.tune`` from that start (its defaults: up to tune.max_trials A/Bs); its cost is the
   journal's ``gpu_hours`` (each experiment's wall time x the processes it holds; here CPU-hours), its winner the
   validated one;
2. the grid NeMo's AutoConfigurator runs: every candidate of the same space trained once for 50 steps (steady
   window 41-50, as tune's validation), sorted by step time — the space being every legal layout the tune's own
   layout search found x train.micro_batch_size in {1, 2, 4} x recompute in {full, none} (x
   overlap.overlap_grad_reduce in {false, true} with --overlap), one Hydra sweep; its cost is the sweep's wall
   time x 2 processes;
3. the two winners against each other: a sequential A/B (repeat=auto, the tune's own experiment driver) of the
   grid's winner (A) and the tune's (B) when their overrides differ: "equivalent" or "undecided" means each lies
   within the other's interval, "faster" that the tune's is better, "slower" the grid's.

Prints the cost ratio tune / grid (the goal: <= 0.25) and the verdict. Takes about 20 minutes on 2 cores (40 with
--overlap); run it alone (another load moves the step times).

    python benchmarks/tune_cost.py [--dir DIR] [--overlap] [--max-trials 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moe_hydra.launch import experiments
from moe_hydra.planning import layouts_file

START = ["hardware.devices_per_node=2", "logger=none", "recompute=full", "train.micro_batch_size=1",
         "train.global_batch_size=8"]
PROCESSES = 2


def _tune(root: Path, max_trials: int) -> dict:
    d = root / "tune"
    r = subprocess.run([sys.executable, "-m", "moe_hydra.tune", *START, f"tune.max_trials={max_trials}",
                        f"hydra.sweep.dir={d}"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"tune failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads((d / "tune.json").read_text())


def _grid(root: Path, overlap: bool) -> tuple[float, list[dict]]:
    """The grid as one sweep: the layouts as options of the experiment group, crossed with MBS and recompute."""
    layouts = layouts_file.read(root / "tune" / "scale" / "layouts.json")
    legal = [c for c in layouts["candidates"] if c.get("rank")]
    search = root / "grid-search" / "experiment"
    search.mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(legal):
        overs = [o for o in c["overrides"] if not o.startswith("train.")]
        (search / f"layout_{i}.yaml").write_text(experiments.experiment_yaml(overs, c["layout"]))
    d = root / "grid"
    record = root / "grid.json"
    if record.exists():  # a rerun of the benchmark in the same --dir: the grid as it ran
        return json.loads(record.read_text())["cpu_hours"], _points(d)
    command = [sys.executable, "-m", "moe_hydra", "hardware.devices_per_node=2", "logger=none",
               "train.global_batch_size=8", "contract.window=[41,50]", f"hydra.searchpath=[file://{search.parent}]",
               "experiment=" + ",".join(f"layout_{i}" for i in range(len(legal))), "train.micro_batch_size=1,2,4",
               "recompute=full,none", *(["overlap.overlap_grad_reduce=false,true"] if overlap else []),
               f"hydra.sweep.dir={d}", "-m"]
    start = time.monotonic()
    subprocess.run(command, capture_output=True, text=True, check=False)  # refused and failed points are the grid's
    cpu_hours = (time.monotonic() - start) * PROCESSES / 3600
    record.write_text(json.dumps({"cpu_hours": cpu_hours, "command": command}))
    return cpu_hours, _points(d)


def _points(d: Path) -> list[dict]:
    """The grid's completed points: directory and steady step time."""
    from moe_hydra.launch.outcome import complete_results

    points = []
    for point in sorted(p for p in d.iterdir() if p.is_dir() and p.name.isdigit()):
        r = complete_results(point)
        if r and r.get("step_time_ms"):
            points.append({"dir": str(point), "step_time_ms": r["step_time_ms"]})
    return points


def _overrides_of(point_dir: Path, layouts_dir: Path) -> list[str]:
    """A grid point as overrides (its layout option expanded), as the A/B takes them."""
    import yaml

    task = yaml.safe_load((point_dir / ".hydra" / "overrides.yaml").read_text())
    out = []
    for o in task:
        key, value = o.split("=", 1)
        if key == "experiment":
            layout = layouts_file.read(layouts_dir / "layouts.json")
            legal = [c for c in layout["candidates"] if c.get("rank")]
            out += [x for x in legal[int(value.split("_")[1])]["overrides"] if not x.startswith("train.")]
        elif not key.startswith(("hydra", "contract", "logger")):
            out.append(o)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--overlap", action="store_true", help="the grid also over overlap.overlap_grad_reduce")
    ap.add_argument("--max-trials", type=int, default=16)
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="tune_cost-"))
    root.mkdir(parents=True, exist_ok=True)

    journal = _tune(root, args.max_trials)
    tune_h = journal["gpu_hours"]
    winner = journal["winner"]
    print(f"tune: {journal['start']['step_time_ms']:.1f} -> {winner['step_time_ms']:.1f} ms/step "
          f"({winner['verdict']} against the start), {tune_h * 3600:.0f} CPU-s "
          f"({', '.join(f'{k} {v * 3600:.0f}' for k, v in journal['gpu_hours_by_stage'].items())})")
    print(f"  winner: {' '.join(winner['overrides'])}")

    grid_h, points = _grid(root, args.overlap)
    if not points:
        sys.exit("the grid completed no point")
    best = min(points, key=lambda p: p["step_time_ms"])
    print(f"grid: {len(points)} completed points, {grid_h * 3600:.0f} CPU-s; fastest {best['step_time_ms']:.1f} "
          f"ms/step ({best['dir']})")

    grid_winner = [*START[:1], "train.global_batch_size=8", *_overrides_of(Path(best["dir"]), root / "tune" / "scale")]
    tune_winner = list(winner["overrides"])
    key = lambda arm: sorted(o for o in arm if not o.startswith(("logger", "hydra")))  # noqa: E731
    if key(grid_winner) == key(tune_winner):
        verdict = {"verdict": "the same configuration"}
    else:
        ab = {"experiments": {}}
        driver = experiments.Driver(root, ab, lambda: None, PROCESSES)
        e = driver.ab("winners", grid_winner, tune_winner, ["logger=none"], 8)
        verdict = e.result
    within = verdict.get("verdict") in ("the same configuration", "equivalent", "undecided", "faster")
    print(f"winners: tune's against the grid's: {verdict.get('verdict')}"
          + (f" {verdict['rel_step_time']:+.1%} [{verdict['interval'][0]:+.1%}, {verdict['interval'][1]:+.1%}]"
             if verdict.get("rel_step_time") is not None and verdict.get("interval") else ""))
    ratio = tune_h / grid_h
    print(f"cost ratio tune / grid: {ratio:.2f} (goal <= 0.25); the same or a better winner: "
          f"{'yes' if within else 'no'}")
    print(json.dumps({"tune_cpu_hours": tune_h, "grid_cpu_hours": grid_h, "ratio": ratio, "grid_points": len(points),
                      "winners_verdict": verdict.get("verdict"), "same_or_better": within}))


if __name__ == "__main__":
    main()
