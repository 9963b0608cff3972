"""Regression diagnosis of two runs (``moe-hydra diff``): what differs in their config, what differs that changes
how their figures read (steps, window, warm-up, profiling, the work a step: like with like,
:func:`moe_hydra.core.contract.measure`), their environment, how their metrics moved, each beside the run-to-run
noise it is read against, and which wall moved (from their profile.json when both have one)."""

from __future__ import annotations

import json
from typing import Any

from moe_hydra.analysis import noise as noises
from moe_hydra.analysis import profiles
from moe_hydra.analysis.compare import declared_floor
from moe_hydra.analysis.runs import Run, Warn
from moe_hydra.core import contract as contracts
from moe_hydra.core import results, stats
from moe_hydra.core.errors import Refused

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


def _reading(a: Run, b: Run, variables: list[str]) -> tuple[list[tuple[str, Any, Any, str]], str, str | None]:
    """What differs between the runs that changes how their figures read, though it is no knob of the config:
    (what, in A, in B, what it changes) each; the figure the two may be compared on (``contract.measure``: step time
    when they train the same tokens a step, else time per token) and, when even that is unlike, why."""
    ra, rb = a.results, b.results
    out = []
    if ra.get("steps") != rb.get("steps"):
        out.append(("steps", ra.get("steps"), rb.get("steps"), "the runs trained different numbers of steps: the "
                    "loss is read at the last step both ran"))
    wa, wb = results.measured_window(ra), results.measured_window(rb)
    if wa != wb:
        out.append(("window measured", wa, wb, "the step times are means over different steps"))
    if ra.get("warmup_steps") != rb.get("warmup_steps"):
        out.append(("warmup_steps", ra.get("warmup_steps"), rb.get("warmup_steps"), "a different warm-up is left "
                    "out of each mean"))
    pa, pb = ra.get("profile_steps"), rb.get("profile_steps")
    if bool(pa) != bool(pb) or (ra.get("profile") is None) != (rb.get("profile") is None):
        out.append(("profiled steps", pa, pb, "one run was traced (profile=window): its traced steps carry the "
                    "profiler's overhead" + (" inside the window" if pa and wa and pa[0] <= wa[1] and wa[0] <= pa[1]
                                             or pb and wb and pb[0] <= wb[1] and wb[0] <= pb[1] else
                                             ", outside the window")))
    works = [contracts.Work.of(r["contract"]) for r in (ra, rb)]
    why = None
    try:
        metric = contracts.measure(works, variables, ["A", "B"])
    except Refused as e:
        metric, why = contracts.THROUGHPUT, str(e)
    if metric == contracts.THROUGHPUT:
        out.append(("tokens a step per GPU", works[0] and works[0].tokens_per_gpu, works[1] and works[1].tokens_per_gpu,
                    "different work a step: compared on time per token (tokens/s/GPU), not step time"))
    return out, metric, why


def _noise(a: Run, b: Run, noise_floor: float | None, warn: Warn) -> noises.Floor:
    """The run-to-run noise the figures are read against: ``--noise-floor``, else a measured one the runs name
    (compare.noise_file), else the hardware's declared one."""
    if noise_floor is None:
        measured = noises.measured_floor(None, [a.path, b.path], warn)
        if measured is not None:
            return measured
    return noises.Floor(declared_floor([a, b], noise_floor), noises.OPTION if noise_floor is not None
                        else noises.DECLARED)


def _step_effect(a: Run, b: Run, metric: str, noise: noises.Floor) -> stats.Effect | None:
    """B's window against A's, beyond the noise (measured: the run means against it; else a floor); per token
    when ``metric`` says so. None when a window has fewer than two steps."""
    def steps(run: Run) -> list[float]:
        work = contracts.Work.of(run.results["contract"])
        per = work.tokens_per_gpu if metric == contracts.THROUGHPUT and work else 1.0
        return [t / per for t in run.window_steps]

    xa, xb = steps(a), steps(b)
    if len(xa) < 2 or len(xb) < 2:
        return None
    if noise.source == noises.MEASURED:
        return stats.measured([stats.RunStat.of(xa)], [stats.RunStat.of(xb)], noise.value, noise.df,
                              step_noise=noise.step_noise, step_df=noise.step_df)
    return stats.welch(xa, xb, "steps", floor=noise.value)


def diagnose(a: Run, b: Run, warn: Warn, noise_floor: float | None = None) -> dict[str, Any]:
    """What differs between two complete runs: config, what changes the reading (steps, window, warm-up, profiling,
    the work a step), environment (env.json; a corrupt one is warned and left out), metrics each with the noise it
    is read against, and which wall moved (from their profile.json when both have one, beyond the noise)."""
    ra, rb = a.results, b.results
    order = ["parallel", "dispatcher", "routing", "precision", "recompute", "offload", "kernels", "overlap", "train",
             "timing", "model", "optimizer", "data", "hardware", "launcher", "software", "seed"]
    config = sorted(contracts.diff(ra["contract"], rb["contract"]),
                    key=lambda d: (order.index(d[0].split(".")[0]) if d[0].split(".")[0] in order else len(order), d[0]))
    reading, metric, unlike = _reading(a, b, [k for k, _, _ in config])
    ea, eb = _env(a, warn), _env(b, warn)
    env_keys = ("versions", "env", "runtime", "slurm", "hostname", "git")
    env = contracts.diff({k: ea.get(k) for k in env_keys}, {k: eb.get(k) for k in env_keys})
    noise = _noise(a, b, noise_floor, warn)
    effect = _step_effect(a, b, metric, noise)
    timed = (f"{effect.verdict}: {'time per token' if metric == contracts.THROUGHPUT else 'step time'} "
             f"{effect.rel_step_time:+.2%}, 95% CI [{effect.ci_low:+.2%}, {effect.ci_high:+.2%}] against the "
             f"run-to-run noise {noise.value:.1%} ({noise.source})" if effect else
             f"no interval: a window of fewer than 2 steps; run-to-run noise {noise.value:.1%} ({noise.source})")
    metrics = {}
    for k in METRICS:
        va, vb = ra.get(k), rb.get(k)
        metrics[k] = (va, vb, (vb - va) / va if va and vb is not None else None,
                      timed if k in (contracts.STEP_TIME, contracts.THROUGHPUT) else
                      f"run-to-run noise {noise.value:.1%} ({noise.source})" if va and vb is not None else None)
    ma, mb = _memory(ra), _memory(rb)
    metrics["peak_memory_gib"] = (ma, mb, (mb - ma) / ma if ma and mb is not None else None,
                                  "deterministic for one config (no run-to-run noise)")
    step = min(len(ra["loss"].get("per_step") or []), len(rb["loss"].get("per_step") or []))
    if step:  # the loss at the last step both ran, never step 15 against step 10
        la, lb = ra["loss"]["per_step"][step - 1], rb["loss"]["per_step"][step - 1]
        key, said = f"loss at step {step}", "the last step both ran"
    else:
        la, lb, key, said = ra["loss"]["last"], rb["loss"]["last"], "loss.last", "each run's last step"
    metrics[key] = (la, lb, (lb - la) / la if la and lb is not None else None, said)

    def moved(key: str) -> str:
        rel = metrics[key][2]
        if rel is None:
            return "unknown (not measured on this backend)"
        return f"{'moved' if abs(rel) > max(WALL_THRESHOLD, noise.value) else 'steady'} ({rel:+.1%})"

    walls = {"memory": moved("peak_memory_gib")}
    pa, pb = profiles.read(a.path, warn), profiles.read(b.path, warn)
    if pa and pb:  # the profiles split the step: each wall's ms/step, moved or unchanged beyond the noise
        split = profiles.moved([pa], [pb], noise.value)
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
    imbalance = router_moved(ra.get("router"), rb.get("router"))
    if imbalance:
        walls["router imbalance"] = imbalance
    return {"config": config, "reading": reading, "metric": metric, "unlike": unlike, "env": env,
            "noise_floor": noise.as_dict(), "step_time": effect.as_dict() if effect else None, "metrics": metrics,
            "walls": walls}


def router_moved(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """How the routers' imbalance (results.json ``router``: max over mean tokens per expert, the window's mean)
    moved from run ``a`` to ``b``, layer by layer: "moved on layer 1 (1.26 -> 1.64, +30.2%)" for the layers whose
    imbalance changed by more than :data:`WALL_THRESHOLD`, else "steady" with the worst layer's; None when either
    run has no router figures (a dense model, or a run from before they were counted)."""
    if not a or not b:
        return None
    before = {x["layer"]: x.get("imbalance") for x in a.get("layers") or []}
    changes = []
    for x in b.get("layers") or []:
        old, new = before.get(x["layer"]), x.get("imbalance")
        if old and new is not None:
            changes.append((x["layer"], old, new, new / old - 1))
    if not changes:
        return None
    moved = [c for c in changes if abs(c[3]) > WALL_THRESHOLD]
    if moved:
        return "moved on " + ", ".join(f"layer {i} ({o:.2f} -> {n:.2f}, {r:+.1%})" for i, o, n, r in moved)
    i, o, n, r = max(changes, key=lambda c: c[2])
    return f"steady (worst layer {i}: {o:.2f} -> {n:.2f}, {r:+.1%})"
