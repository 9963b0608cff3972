"""Whole-process latency of ``python -m moe_hydra stage=plan`` against a bare Hydra app.

The baseline composes the same ``conf/`` against the same schema and does nothing else, so the
ratio is what moe_hydra's planning (override checks, rules, counts, the rich table, plan.json)
costs on top of Hydra itself. Both are timed in this run, interleaved, as median wall time.

    python benchmarks/plan_latency.py [--runs 9] [extra overrides ...]

Goal: ratio <= 1.5.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


BARE_APP = """
import sys
import hydra
from moe_hydra.core.schema import register_configs
from moe_hydra.launch import points

register_configs()
points.register()  # conf/config.yaml selects this sweeper
sys.argv.append("~hydra.callbacks.outcomes")  # Hydra alone: not moe_hydra's exit-code callback

@hydra.main(config_path="pkg://moe_hydra.conf", config_name="config", version_base="1.3")
def app(cfg):
    pass

app()
"""

DEFAULT_OVERRIDES = ["stage=plan", "model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128", "mesh=dsv3_h100_1024"]


def _time(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_app.py"
        bare.write_text(BARE_APP)
        out = [f"hydra.run.dir={tmp}/out"]
        moe = [sys.executable, "-m", "moe_hydra", *out, *args.overrides]
        base = [sys.executable, str(bare), *out, *args.overrides]
        _time(moe, tmp), _time(base, tmp)  # warm the file cache
        t_moe, t_base = [], []
        for _ in range(args.runs):
            t_moe.append(_time(moe, tmp))
            t_base.append(_time(base, tmp))
    m, b = statistics.median(t_moe), statistics.median(t_base)
    print(f"overrides: {' '.join(args.overrides)}")
    print(f"bare hydra app (same conf/):     median {b * 1000:7.1f} ms over {args.runs} runs")
    print(f"python -m moe_hydra stage=plan:  median {m * 1000:7.1f} ms over {args.runs} runs")
    print(f"ratio: {m / b:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
