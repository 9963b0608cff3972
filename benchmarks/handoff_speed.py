"""Export and ingest of every preset combination, against composing the same configs.

The combinations are the hand-off tests' (tests/test_handoff.py): every ``conf/mesh`` preset x every
``conf/dispatcher`` option x every ``conf/precision`` option, on a GPU preset that has the precision, those the rules
accept. For each: export to Megatron-LM flags and ingest them back, and the same for Megatron-Bridge overrides, in this
process (what ``moe-hydra export`` / ``ingest`` do after their imports). The baseline is composing the same configs
(:func:`moe_hydra.launch.compose.compose_typed`, as export composes them), timed in this run.

    python benchmarks/handoff_speed.py [--repeats 3]

Goal: export + ingest of all combinations, both formats, < 1 s together.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import conf_dir
from moe_hydra.core.versions import mcore_facts
from moe_hydra.core.violations import LayoutError
from moe_hydra.handoff import export, ingest
from moe_hydra.launch.compose import compose_typed
from moe_hydra.planning import rules

MESHES = {"ep8": ("qwen3_30b_a3b", 1), "ep16": ("qwen3_30b_a3b", 2), "dsv3_h100_1024": ("deepseek_v3", 128),
          "qwen3_235b_a22b_h100_256": ("qwen3_235b_a22b", 32), "qwen3_30b_a3b_h100_16": ("qwen3_30b_a3b", 2)}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in Path(conf_dir() / group).glob("*.yaml"))


def combos() -> list[list[str]]:
    return [[f"model={MESHES[m][0]}", f"hardware={'b200' if p in ('mxfp8', 'nvfp4') else 'h100_sxm'}",
             f"hardware.nodes={MESHES[m][1]}", f"mesh={m}", f"dispatcher={d}", f"precision={p}"]
            for m in _options("mesh") for d in _options("dispatcher") for p in _options("precision")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    all_combos = combos()
    compose_typed(all_combos[0])  # warm
    t0 = time.perf_counter()
    cfgs = [(ov, compose_typed(ov)) for ov in all_combos]
    t_compose = time.perf_counter() - t0
    legal = []
    for ov, cfg in cfgs:
        r = resolve(cfg)
        try:
            rules.validate(r, mcore=mcore_facts())
        except LayoutError:
            continue
        legal.append((ov, cfg, r))
    per_format: dict[str, list[float]] = {f: [] for f in export.FORMATS}
    for _ in range(args.repeats):
        for fmt in export.FORMATS:
            t0 = time.perf_counter()
            for ov, cfg, r in legal:
                x = export.export(fmt, cfg, r, ov)
                ingest.ingest(fmt, words=x.text.split())
            per_format[fmt].append(time.perf_counter() - t0)
    med = {f: statistics.median(t) for f, t in per_format.items()}
    total = sum(med.values())
    n = len(legal)
    print(f"combinations: {len(all_combos)} ({n} legal; the rest refused by the rules)")
    print(f"compose of all {len(all_combos)}:          {t_compose * 1000:8.1f} ms  "
          f"({t_compose / len(all_combos) * 1000:.1f} ms each)")
    for f in export.FORMATS:
        print(f"export + ingest {f:<12} x {n}:  {med[f] * 1000:8.1f} ms  ({med[f] / n * 1000:.2f} ms each), "
              f"median of {args.repeats}")
    print(f"export + ingest, both formats, all {n}:  {total * 1000:8.1f} ms  (goal < 1000 ms: "
          f"{'met' if total < 1 else 'NOT met'}); ratio to composing them: {total / t_compose:.3f}")


if __name__ == "__main__":
    main()
