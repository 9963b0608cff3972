"""What real data costs: the tiny MoE on a Megatron indexed dataset (``data.kind=megatron``, prepared from the
repository's docs with ``python -m moe_hydra.data prepare``) against the same run on mock data.

Runs alternate (real, mock, real, mock, ...), one process each, the same steps and window, under two routings:

- ``force_balance`` (``routing.moe_router_force_load_balancing=true``): every expert gets the same tokens whatever
  the text, so the step does the same work on both kinds and the ratio is the data path's own cost;
- ``natural`` (what a training-equivalent run measures): real text routes unevenly (a learned router sends common
  bytes to a few experts), mock sequences almost evenly, so the ratio also holds the imbalance that real data brings
  to the MoE layers: a property of the data, not of the data path.

Each side's figure is the median over its repeats of the step time (``step_time_ms``: the timed step, the window's
mean) and of the loop time per window step (``window_loop_ms_per_step``: also the assembly of each step's
micro-batches). Last, in this process, what drawing one micro-batch costs: GPTDataset's samples (``MegatronData``)
against MockData's generator.

    python benchmarks/data_overhead.py [--repeats 3] [--window 11,40] [--routing both|natural|force_balance]

Goal: real-data step time within 5 % of mock data (the data path is not the bottleneck).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "moe_hydra", *args], cwd=cwd, capture_output=True, text=True,
                       check=False)
    if r.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{r.stderr[-3000:]}")
    run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir="))
    return json.loads(Path(run_dir, "results.json").read_text())


def _batch_ms(prefix: str, cache: str, draws: int = 500) -> dict[str, float]:
    """Median ms to draw one tiny-model micro-batch (4 x 128 tokens), real against mock."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from moe_hydra.job.data import MegatronData, MockData

        data = SimpleNamespace(path=[prefix], split="969,30,1", seed=1234, mmap_bin_files=True)
        sources = {"real": MegatronData(data, vocab_size=1024, seq_length=128, micro_batch_size=4, global_batch_size=4,
                                        microbatches=1, samples=4 * draws, cache_dir=cache),
                   "mock": MockData(1024, 128, 4, 4, 1, 1234)}
    out = {}
    for name, source in sources.items():
        times = []
        for step in range(draws):
            t0 = time.perf_counter()
            source.batch(step, 0, 0)
            times.append((time.perf_counter() - t0) * 1e3)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", default="11,40", help="the measured steps FIRST,LAST (the run is LAST steps)")
    ap.add_argument("--routing", default="both", choices=["both", "natural", "force_balance"])
    args = ap.parse_args()
    first, last = (int(x) for x in args.window.split(","))
    routings = ["force_balance", "natural"] if args.routing == "both" else [args.routing]
    with tempfile.TemporaryDirectory() as tmp:
        prefix = f"{tmp}/ds/docs"
        docs = [*sorted(str(p) for p in (ROOT / "docs").glob("*.md")), str(ROOT / "README.md")]
        made = subprocess.run([sys.executable, "-m", "moe_hydra.data", "prepare", "--out", prefix, *docs],
                              capture_output=True, text=True, check=False)
        if made.returncode:
            sys.exit(made.stderr[-3000:])
        print(f"tiny_moe, 1 process, {last} steps, window {first}..{last}, {args.repeats} alternating repeats "
              f"(median); {made.stdout.splitlines()[0]}")
        for routing in routings:
            common = ["logger=none", f"contract.window=[{first},{last}]", f"routing={routing}"]
            real = ["data.kind=megatron", f"data.path=[{prefix}]"]
            sides: dict[str, list[dict]] = {"real": [], "mock": []}
            for i in range(args.repeats):
                sides["real"].append(_run([f"hydra.run.dir={tmp}/{routing}/real{i}", *common, *real], tmp))
                sides["mock"].append(_run([f"hydra.run.dir={tmp}/{routing}/mock{i}", *common], tmp))
            step = {k: statistics.median(r["step_time_ms"] for r in v) for k, v in sides.items()}
            loop = {k: statistics.median(r["window_loop_ms_per_step"] for r in v) for k, v in sides.items()}
            labels = {k: sorted({r["label"] for r in v}) for k, v in sides.items()}
            print(f"routing={routing} (labels: real {', '.join(labels['real'])}; mock {', '.join(labels['mock'])})")
            print(f"  step time      real {step['real']:7.2f} ms   mock {step['mock']:7.2f} ms   "
                  f"ratio {step['real'] / step['mock']:.3f}   (goal within 5 %)")
            print(f"  loop per step  real {loop['real']:7.2f} ms   mock {loop['mock']:7.2f} ms   "
                  f"ratio {loop['real'] / loop['mock']:.3f}   (with the batches' assembly)")
        draw = _batch_ms(prefix, f"{tmp}/cache")
    print(f"drawing one micro-batch: real {draw['real']:.3f} ms, mock {draw['mock']:.3f} ms "
          f"({draw['real'] / step['mock']:.2%} of a mock step)")


if __name__ == "__main__":
    main()
