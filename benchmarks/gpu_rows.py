"""The runs of benchmarks/gpu_check.sh as rows of benchmarks/data/measured_runs.yaml (source ``moe-hydra-gpu``).

    python benchmarks/gpu_rows.py RUNS_DIR OUT.yaml

Each run directory (``hydra.run.dir``) holds ``plan.json`` and, for ``stage=run``, ``results.json``; a row takes its
columns from the plan, its overrides from ``.hydra/overrides.yaml`` (less the output directory), and its figures
from the results: the window's mean step time, TFLOP/s/GPU and tokens/s/GPU, the allocator's peak and the memory
phases. Paste the rows under ``runs:`` (with a ``moe-hydra-gpu`` source naming the machine and date) and run
``python benchmarks/step_model_calibration.py --write-overrides``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

GPU = {"h100_sxm": "h100", "h200_sxm": "h200", "b200": "b200", "b300": "b300", "gb200_nvl72": "gb200",
       "gb300_nvl72": "gb300", "local_cpu": "cpu"}


def row(run: Path) -> dict | None:
    plan_file, results_file = run / "plan.json", run / "results.json"
    if not plan_file.exists():
        return None
    plan = json.loads(plan_file.read_text())
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    p, b = plan["parallel"], plan["batch"]
    overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text()) if (run / ".hydra").exists() else []
    peak = results.get("peak_memory_gib") or {}
    return {
        "name": f"{run.name} [{plan['hardware']}, moe_hydra gpu_check]", "source": "moe-hydra-gpu",
        "model": plan["model"], "gpu": GPU.get(plan["hardware"], plan["hardware"]), "num_gpus": plan["world_size"],
        "precision": plan["contract"]["precision"]["name"] if "precision" in plan.get("contract", {}) else None,
        "seq_length": plan["seq_length"], "global_batch_size": b["global_batch_size"],
        "micro_batch_size": b["micro_batch_size"],
        **{k: p[k] for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                             "virtual_pipeline_model_parallel_size", "context_parallel_size",
                             "expert_model_parallel_size", "expert_tensor_parallel_size")},
        "implementation": plan["implementation"],
        "extra_overrides": [o for o in overrides if not o.startswith(("hydra.", "stage="))],
        "published": {
            "step_time_s": results["step_time_ms"] / 1e3 if results.get("step_time_ms") else None,
            "tokens_per_s_per_gpu": results.get("tokens_per_s_per_gpu"),
            "tflops_per_gpu": results.get("tflops_per_gpu"),
            "memory_gib": peak.get("allocated"),
            "memory_counter": results.get("memory_counter"),
            "memory_phases_gib": results.get("memory_phases_gib"),
        },
        "estimate": {"memory_gib": plan["memory"]["total"] - plan["memory"]["allowance"],
                     "step_time_s": (plan.get("step_time") or {}).get("seconds")},
        "notes": "planned only (dry run)" if not results else "",
    }


def main() -> None:
    runs, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows = [r for d in sorted(p for p in runs.iterdir() if p.is_dir()) if (r := row(d))]
    out.write_text(yaml.safe_dump({"runs": rows}, sort_keys=False, width=120))
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main()
