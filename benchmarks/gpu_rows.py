"""The runs of benchmarks/gpu_check.sh as rows of benchmarks/data/measured_runs.yaml (source ``moe-hydra-gpu``).

    python benchmarks/gpu_rows.py RUNS_DIR OUT.yaml [--calibration FILE ...]

Each run directory (``hydra.run.dir``) holds ``plan.json`` and, for ``stage=run``, ``results.json``; a row takes its
columns from the plan, its overrides from ``.hydra/overrides.yaml`` (less the output directory), and its figures
from the results: the window's mean step time, TFLOP/s/GPU and tokens/s/GPU, the allocator's peak and the memory
phases. Paste the rows under ``runs:`` (with a ``moe-hydra-gpu`` source naming the machine and date) and run
``python benchmarks/step_model_calibration.py --write-overrides``.

With ``--calibration`` (a ``calibration.json`` of ``stage=calibrate`` on the same machine, which never ran these
configurations): each measured run is planned again with ``hardware.calibration=FILE`` and the row's
``estimate.calibrated_step_time_s`` is the calibration's prediction where it holds for the run; a line per run
prints predicted against measured, |ln(predicted/measured)|, and the median and worst over them (issue 36's held-out
check on a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
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


def calibrated(run: Path, calibrations: list[Path], scratch: Path) -> float | None:
    """The step time the first calibration that holds for ``run`` predicts for it (its overrides planned again
    with ``hardware.calibration``), or None."""
    overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text()) if (run / ".hydra").exists() else []
    kept = [o for o in overrides if not o.startswith(("hydra.", "stage=", "profile="))]
    for cal in calibrations:
        out = scratch / f"{run.name}-{cal.parent.name}"
        done = subprocess.run([sys.executable, "-m", "moe_hydra", "stage=plan", *kept,
                               f"hardware.calibration={cal.resolve()}", f"hydra.run.dir={out}"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            seconds = (json.loads((out / "plan.json").read_text()).get("step_time") or {})
            if (seconds.get("calibration") or {}).get("applies"):
                return seconds["seconds"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--calibration", type=Path, action="append", default=[],
                    help="a calibration.json of this machine: predict each measured run from it")
    a = ap.parse_args()
    dirs = sorted(p for p in a.runs.iterdir() if p.is_dir() and not (p / "calibration.json").exists())
    rows, errors = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for d in dirs:
            r = row(d)
            if r is None:
                continue
            measured = r["published"]["step_time_s"]
            if a.calibration and measured:
                predicted = calibrated(d, a.calibration, Path(scratch))
                r["estimate"]["calibrated_step_time_s"] = predicted
                if predicted is None:
                    print(f"{d.name}: no calibration holds for it")
                else:
                    errors.append(abs(math.log(predicted / measured)))
                    print(f"{d.name}: calibrated {predicted * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms, "
                          f"|ln| {errors[-1]:.3f}")
            rows.append(r)
    if errors:
        print(f"{len(errors)} runs held out from the calibration: median |ln| {statistics.median(errors):.3f}, "
              f"worst {max(errors):.3f}")
    a.out.write_text(yaml.safe_dump({"runs": rows}, sort_keys=False, width=120))
    print(f"{len(rows)} rows -> {a.out}: to add them to the dataset, paste them under runs: in "
          "benchmarks/data/measured_runs.yaml with a moe-hydra-gpu source naming the machine and date, then run "
          "python benchmarks/step_model_calibration.py --write-overrides")


if __name__ == "__main__":
    main()
