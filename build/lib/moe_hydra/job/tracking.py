"""Weights & Biases, the way W&B users expect it, without ever failing or perturbing a run.

Rank 0 only, after the measured loop has ended (so the tracker takes no CPU from the steps it
measures): ``wandb.init`` with

    dir       the Hydra job directory (offline runs land in <job dir>/wandb/offline-run-*)
    mode      logger.mode, else WANDB_MODE, else offline without WANDB_API_KEY and online with one;
              logger=none: disabled (wandb is not even imported)
    group     the comparison: logger.group, else <sweep dir name>-<contract_hash>, else the contract hash
    job_type  the arm: the values of the swept variables ("dispatcher=alltoall"), else "run"
    config    the fully resolved composed config, with the contract, its hashes and the label

then every step's metrics under their step number (``define_metric``: the summary of ``steady/*`` is the
mean over the steady window, warmup excluded), the figures of results.json in the summary, and
``.hydra/*.yaml``, ``results.json``, ``env.json`` as an artifact. Any failure inside wandb is a
warning; ``finish()`` always runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("moe_hydra")


def mode(logger_cfg: Any) -> str:
    if logger_cfg.name == "none":
        return "disabled"
    if logger_cfg.mode:
        return logger_cfg.mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _history(results: dict[str, Any]) -> list[dict[str, Any]]:
    first, last = results["window"]
    tokens, world, fpt = results["tokens_per_step"], results["world_size"], results["flops_per_token"]
    rows = []
    memory = results.get("memory_gib_per_step") or [None] * len(results["step_times_ms"])
    for i, (t, loss, mem) in enumerate(zip(results["step_times_ms"], results["loss"]["per_step"], memory), start=1):
        tps = tokens / (t / 1e3 * world)
        row = {"train/step": i, "train/loss": loss, "time/step_ms": t, "throughput/tokens_per_s_per_gpu": tps,
               "throughput/tflops_per_gpu": fpt * tps / 1e12}
        if mem is not None:
            row["memory/peak_gib"] = mem
        if first <= i <= last:
            row.update({"steady/step_ms": t, "steady/tokens_per_s_per_gpu": tps,
                        "steady/tflops_per_gpu": fpt * tps / 1e12})
        rows.append(row)
    return rows


def log_run(cfg_container: dict[str, Any], results: dict[str, Any], out_dir: Path, tracking: dict[str, Any],
            logger_cfg: Any) -> str | None:
    """Mirror a finished (or failed) run to W&B; returns the run directory, or None."""
    m = mode(logger_cfg)
    if m == "disabled":
        return None
    run = None
    try:
        import wandb

        run = wandb.init(
            project=logger_cfg.project, dir=str(out_dir), mode=m, group=tracking["group"],
            job_type=tracking["job_type"], tags=list(cfg_container.get("tags") or []),
            name=f"{results.get('model')}-{tracking['job_type']}",
            config={**cfg_container, "contract": results.get("contract"), "contract_hash": results.get("contract_hash"),
                    "contract_full_hash": results.get("contract_full_hash"), "label": results.get("label"),
                    "label_reasons": results.get("label_reasons"), "swept": tracking.get("swept")},
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        run.define_metric("train/step")
        run.define_metric("*", step_metric="train/step")
        for key in ("steady/step_ms", "steady/tokens_per_s_per_gpu", "steady/tflops_per_gpu"):
            run.define_metric(key, step_metric="train/step", summary="mean")
        if results.get("status") == "ok":
            for row in _history(results):
                run.log(row)
        run.summary.update({k: results.get(k) for k in (
            "status", "step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "contract_hash",
            "contract_full_hash", "label", "error", "peak_memory_gib") if results.get(k) is not None})
        artifact = wandb.Artifact(f"evidence-{run.id}", type="run-evidence")
        for path in [*sorted((out_dir / ".hydra").glob("*.yaml")), out_dir / "results.json", out_dir / "env.json"]:
            if path.exists():
                artifact.add_file(str(path), name=str(path.relative_to(out_dir)))
        run.log_artifact(artifact)
        run_dir = str(Path(run.dir).parent)
        if m == "offline":
            print(f"moe_hydra: W&B run stored offline; upload it with: wandb sync {run_dir}", flush=True)
        return run_dir
    except Exception as e:  # noqa: BLE001 - the tracker is a mirror; a failure in it never fails a run
        log.warning("W&B logging failed (the run itself is unaffected; results.json holds it all): %s: %s",
                    type(e).__name__, e)
        return None
    finally:
        if run is not None:
            try:
                run.finish(exit_code=0 if results.get("status") == "ok" else 1)
            except Exception as e:  # noqa: BLE001
                log.warning("W&B finish failed: %s", e)
