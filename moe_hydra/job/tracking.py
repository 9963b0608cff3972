"""Weights & Biases, the way W&B users expect it, without ever failing or perturbing a run.

Rank 0 only, on a thread of its own while the job builds its model and trains (moe_hydra.job.live: the
training thread only queues rows); ``wandb.init`` with

    dir       the Hydra job directory (offline runs land in <job dir>/wandb/offline-run-*)
    mode      logger.mode, else WANDB_MODE, else offline without WANDB_API_KEY and online with one;
              logger=none: disabled (wandb is not even imported)
    group     the comparison: logger.group, else <sweep dir name>-<contract_hash>, else the contract hash
    job_type  the arm: the values of the swept variables ("dispatcher=alltoall"), else "run"
    config    the fully resolved composed config, with the contract, its hashes and the label

then every logged step's row as it happens (:func:`moe_hydra.job.live.row`; ``define_metric``: the summary of
``steady/*`` is the mean over the steady window, warmup excluded), the figures of results.json in the summary, and
``.hydra/*.yaml``, ``results.json``, ``env.json`` as an artifact. Any failure inside wandb is a
warning; ``finish()`` always runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from moe_hydra.core.env import wandb_mode

log = logging.getLogger("moe_hydra")


def mode(logger_cfg: Any) -> str:
    return wandb_mode(logger_cfg.name, logger_cfg.mode)


def start(cfg_container: dict[str, Any], plan: dict[str, Any], out_dir: Path, tracking: dict[str, Any],
          logger_cfg: Any) -> Any:
    """``wandb.init`` for the run of ``plan``, its step metrics defined; the run, or None with logger=none.

    Raises:
        Exception: whatever wandb raises (the callers turn it into a warning).
    """
    m = mode(logger_cfg)
    if m == "disabled":
        return None
    import wandb

    run = wandb.init(
        project=logger_cfg.project, dir=str(out_dir), mode=m, group=tracking["group"],
        job_type=tracking["job_type"], tags=list(cfg_container.get("tags") or []),
        name=f"{plan.get('model')}-{tracking['job_type']}",
        config={**cfg_container, "contract": plan.get("contract"), "contract_hash": plan.get("contract_hash"),
                "contract_full_hash": plan.get("contract_full_hash"), "label": plan.get("label"),
                "label_reasons": plan.get("label_reasons"), "swept": tracking.get("swept")},
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    run.define_metric("train/step")
    run.define_metric("*", step_metric="train/step")
    for key in ("steady/step_ms", "steady/tokens_per_s_per_gpu", "steady/tflops_per_gpu"):
        run.define_metric(key, step_metric="train/step", summary="mean")
    return run


def finish(run: Any, results: dict[str, Any], out_dir: Path, logger_cfg: Any) -> str | None:
    """The figures of ``results.json`` in the run's summary, the evidence as an artifact, ``run.finish``; returns
    the run directory. Any failure inside wandb is a warning."""
    try:
        import wandb

        run.summary.update({k: results.get(k) for k in (
            "status", "step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "contract_hash",
            "contract_full_hash", "label", "error", "peak_memory_gib") if results.get(k) is not None})
        router = results.get("router")
        if router:
            run.summary.update({f"router/imbalance_layer_{x['layer']}": x["imbalance"] for x in router["layers"]})
        if results.get("window_declared") == "auto" and results.get("step_time_ms") is not None:
            # the window was found at the end: its means, as a declared window's steady/* summaries are
            run.summary.update({"steady/step_ms": results["step_time_ms"],
                                "steady/tokens_per_s_per_gpu": results.get("tokens_per_s_per_gpu"),
                                "steady/tflops_per_gpu": results.get("tflops_per_gpu")})
        judged = results.get("steady")
        if judged:  # the judgment of the run's step times (moe_hydra.core.steady)
            segment, window = judged.get("segment") or [None, None], results.get("window_measured") or [None, None]
            run.summary.update({"steady/class": judged["class"], "steady/segment_first": segment[0],
                                "steady/segment_last": segment[1], "steady/window_steady": judged["window_steady"],
                                "steady/window_first": window[0], "steady/window_last": window[1]})
        artifact = wandb.Artifact(f"evidence-{run.id}", type="run-evidence")
        for path in [*sorted((out_dir / ".hydra").glob("*.yaml")), out_dir / "results.json", out_dir / "env.json"]:
            if path.exists():
                artifact.add_file(str(path), name=str(path.relative_to(out_dir)))
        run.log_artifact(artifact)
        run_dir = str(Path(run.dir).parent)
        if mode(logger_cfg) == "offline":
            print(f"moe_hydra: W&B run stored offline; upload it with: wandb sync {run_dir}", flush=True)
        return run_dir
    except Exception as e:  # noqa: BLE001 - the tracker is a mirror; a failure in it never fails a run
        log.warning("W&B logging failed (the run itself is unaffected; results.json holds it all): %s: %s",
                    type(e).__name__, e)
        return None
    finally:
        try:
            run.finish(exit_code=0 if results.get("status") == "ok" else 1)
        except Exception as e:  # noqa: BLE001
            log.warning("W&B finish failed: %s", e)
