"""Regression diagnosis of two runs (``moe-hydra diff``): what differs in their config and environment, how their
metrics moved, and which wall moved (from their profile.json when both have one)."""

from __future__ import annotations

import json
from typing import Any

from moe_hydra.analysis import profiles
from moe_hydra.analysis.compare import declared_floor
from moe_hydra.analysis.runs import Run, Warn
from moe_hydra.core import contract as contracts
from moe_hydra.core import results

METRICS = ("step_time_ms", "host_time_ms", "device_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu")
WALL_THRESHOLD = 0.05


def _memory(r: dict[str, Any]) -> float | None:
    m = r.get("peak_memory_gib") or {}
    return m.get("reserved") or m.get("allocated") or m.get("rss")


def _env(run: Run, warn: Warn) -> dict[str, Any]:
    """The run's env.json; {} (with a warning) when it is absent, unreadable or not a JSON object."""
    path = run.path / "env.json"
    if not path.exists():
        return {}
    try:
        env = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        warn(f"{path}: unreadable or not JSON ({type(e).__name__}); its environment is left out of the diff")
        return {}
    problem = "not a JSON object" if not isinstance(env, dict) else results.unfit(env)
    if problem:
        warn(f"{path}: {problem}; its environment is left out of the diff")
        return {}
    return env


def diagnose(a: Run, b: Run, warn: Warn, noise_floor: float | None = None) -> dict[str, Any]:
    """What differs between two complete runs: config, environment (env.json; a corrupt one is warned and left
    out), metrics, and which wall moved (from their profile.json when both have one, beyond ``noise_floor``,
    default the hardware's run-to-run noise)."""
    ra, rb = a.results, b.results
    order = ["parallel", "dispatcher", "routing", "precision", "recompute", "offload", "kernels", "overlap", "train",
             "timing", "model", "optimizer", "data", "hardware", "launcher", "software", "seed"]
    config = sorted(contracts.diff(ra["contract"], rb["contract"]),
                    key=lambda d: (order.index(d[0].split(".")[0]) if d[0].split(".")[0] in order else len(order), d[0]))
    ea, eb = _env(a, warn), _env(b, warn)
    env_keys = ("versions", "env", "runtime", "slurm", "hostname", "git")
    env = contracts.diff({k: ea.get(k) for k in env_keys}, {k: eb.get(k) for k in env_keys})
    metrics = {}
    for k in METRICS:
        va, vb = ra.get(k), rb.get(k)
        metrics[k] = (va, vb, (vb - va) / va if va and vb is not None else None)
    ma, mb = _memory(ra), _memory(rb)
    metrics["peak_memory_gib"] = (ma, mb, (mb - ma) / ma if ma and mb is not None else None)
    la, lb = ra["loss"]["last"], rb["loss"]["last"]
    metrics["loss.last"] = (la, lb, (lb - la) / la if la else None)

    def moved(key: str) -> str:
        rel = metrics[key][2]
        if rel is None:
            return "unknown (not measured on this backend)"
        return f"{'moved' if abs(rel) > WALL_THRESHOLD else 'steady'} ({rel:+.1%})"

    walls = {"memory": moved("peak_memory_gib")}
    pa, pb = profiles.read(a.path, warn), profiles.read(b.path, warn)
    if pa and pb:  # the profiles split the step: each wall's ms/step, moved or unchanged beyond the noise
        split = profiles.moved([pa], [pb], declared_floor([a, b], noise_floor))
        for wall, w in split["walls"].items():
            walls[wall] = (f"{'moved' if w['moved'] else 'unchanged'} ({w['a_ms_per_step']:.1f} -> "
                           f"{w['b_ms_per_step']:.1f} ms/step, {w['delta_ms_per_step']:+.1f}, 95% CI "
                           f"[{w['ci_ms_per_step'][0]:+.1f}, {w['ci_ms_per_step'][1]:+.1f}])")
        walls["which moved"] = split["summary"]
    else:
        walls["compute"] = moved("device_time_ms")
        walls["host"] = moved("host_time_ms")
        which = "either run" if not (pa or pb) else str((b if pa else a).path)
        walls["communication"] = profiles.NO_PROFILE.format(which=which)
    return {"config": config, "env": env, "metrics": metrics, "walls": walls}


