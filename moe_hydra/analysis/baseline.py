"""Golden values: an accepted run kept as a baseline file, and later runs judged against it.

    moe-hydra accept RUN --save-baseline golden/tiny_moe.json
    moe-hydra regress golden/tiny_moe.json RUN [RUN ...] [--variable KEY ...]

Megatron-Bridge checks its nightly runs against golden values with fixed thresholds; here the baseline keeps its
steady-window samples, so a later run is judged with the statistics of an A/B (:mod:`moe_hydra.core.stats`: Welch's
95 % interval of the step-time difference, beyond the run-to-run noise floor) and under the same contract matching
as compare: a run whose contract differs from the baseline's in anything but the ``--variable`` keys (e.g.
``software`` for a new release under test) is refused, with the differences shown.

A run **regressed** when its step time is slower beyond the noise, its peak memory is more than
``memory_tolerance`` (5 %) above the baseline's, or its loss over the window differs from the baseline's by more
than ``loss_tolerance`` (2 %, relative; same data, seed and contract give the same losses up to numerics). Exit code
:data:`~moe_hydra.core.errors.EXIT_REGRESSED` (3) then, so CI fails.

The baseline file (``baseline_version`` 1, JSON): ``created``, ``source`` (the run's directory), ``run_id``,
``contract``, ``contract_hash``, ``contract_full_hash``, ``label``, ``window``, ``window_step_times_ms`` (the
samples), ``step_time_ms`` (``mean``, ``ci95``, ``n``), ``tokens_per_s_per_gpu``, ``tflops_per_gpu``, ``mfu``,
``peak_memory_gib``, ``memory_counter``, ``loss`` (``first``, ``last``, ``window_mean``), ``evidence``, ``noise_floor``.

Reads files only.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.core import contract as contracts
from moe_hydra.core import stats
from moe_hydra.core.errors import Refused

BASELINE_VERSION = 1
MEMORY_TOLERANCE, LOSS_TOLERANCE = 0.05, 0.02


def _window_losses(results: dict[str, Any]) -> list[float]:
    first, last = results["window"]
    return results["loss"]["per_step"][first - 1:last]


def _memory(results: dict[str, Any]) -> float | None:
    m = results.get("peak_memory_gib") or {}
    return m.get("allocated") or m.get("rss")


def make(path: Path, results: dict[str, Any], samples: list[float]) -> dict[str, Any]:
    """The baseline file's content for an accepted run (``samples``: its steady-window step times)."""
    mean, low, high = stats.mean_interval(samples)
    losses = _window_losses(results)
    return {
        "baseline_version": BASELINE_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": str(path),
        **{k: results.get(k) for k in ("run_id", "contract", "contract_hash", "contract_full_hash", "label", "window",
                                       "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_gib",
                                       "memory_counter", "evidence")},
        "window_step_times_ms": list(samples),
        "step_time_ms": {"mean": mean, "ci95": [low, high], "n": len(samples)},
        "loss": {"first": results["loss"]["first"], "last": results["loss"]["last"],
                 "window_mean": statistics.fmean(losses)},
        "noise_floor": _noise(results["contract"]),
    }


def _noise(contract: dict[str, Any]) -> float:
    """hardware.run_to_run_noise of a contract: compare's floor for one-run arms."""
    return float((contract.get("hardware") or {}).get("run_to_run_noise") or 0.0)


def save(doc: dict[str, Any], path: Path) -> None:
    from moe_hydra.core.io import write_json

    write_json(doc, path)


def load(path: Path) -> dict[str, Any]:
    """A baseline file.

    Raises:
        Refused: unreadable, not JSON, another version, or a field missing.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise Refused(f"{path}: unreadable or not JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("baseline_version") != BASELINE_VERSION:
        got = doc.get("baseline_version") if isinstance(doc, dict) else type(doc).__name__
        raise Refused(f"{path}: baseline_version {got!r}, not {BASELINE_VERSION}: not a baseline file "
                          "(write one with moe-hydra accept RUN --save-baseline FILE)")
    samples = doc.get("window_step_times_ms")
    if not isinstance(doc.get("contract"), dict) or not isinstance(samples, list) or len(samples) < 2 or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in samples):
        raise Refused(f"{path}: contract or window_step_times_ms (>= 2 finite step times) missing")
    if not isinstance(doc.get("loss"), dict) or not isinstance(doc["loss"].get("window_mean"), (int, float)):
        raise Refused(f"{path}: loss.window_mean missing")
    return doc


@dataclass
class Judgement:
    """One run against the baseline: ``refused`` (why it cannot be judged) or the checks, and ``regressed``."""

    path: Path
    refused: str | None = None
    effect: stats.Effect | None = None
    memory: tuple[float | None, float | None, float | None] = (None, None, None)  # baseline, run, relative
    loss: tuple[float, float, float] | None = None  # baseline, run window mean, relative
    regressions: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)


def judge(baseline: dict[str, Any], path: Path, results: dict[str, Any], samples: list[float], variables: list[str],
          noise_floor: float | None = None, memory_tolerance: float = MEMORY_TOLERANCE,
          loss_tolerance: float = LOSS_TOLERANCE) -> Judgement:
    """``results`` (a complete run; ``samples`` its steady-window step times) against ``baseline``."""
    j = Judgement(path)
    a = contracts.excluding(baseline["contract"], variables)
    b = contracts.excluding(results["contract"], variables)
    if contracts.digest(a) != contracts.digest(b):
        diff = contracts.diff(a, b)
        shown = "; ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in diff[:8]) + (" ..." if len(diff) > 8 else "")
        j.refused = (f"its contract differs from the baseline's in {len(diff)} field(s): {shown} (never judged across "
                     "contracts; name the variable under test with --variable KEY)")
        return j
    if len(samples) < 2:
        j.refused = f"{len(samples)} steady sample(s): a verdict needs 2"
        return j
    floor = _noise(results["contract"]) if noise_floor is None else noise_floor
    j.effect = stats.welch(baseline["window_step_times_ms"], samples, "steps", floor=floor)
    if j.effect.verdict == stats.SLOWER:
        j.regressions.append(f"step time {j.effect.rel_step_time:+.1%} (95% CI [{j.effect.ci_low:+.1%}, "
                             f"{j.effect.ci_high:+.1%}], beyond the noise floor {floor:.0%})")
    mb, mr = _memory(baseline), _memory(results)
    if mb and mr is not None:
        j.memory = (mb, mr, mr / mb - 1)
        if mr / mb - 1 > memory_tolerance:
            j.regressions.append(f"peak memory {mr / mb - 1:+.1%} ({mb:.3f} -> {mr:.3f} GiB; tolerance "
                                 f"{memory_tolerance:.0%})")
    lb, lr = baseline["loss"]["window_mean"], statistics.fmean(_window_losses(results))
    rel = (lr - lb) / abs(lb) if lb else math.inf
    j.loss = (lb, lr, rel)
    if not math.isfinite(lr) or abs(rel) > loss_tolerance:
        j.regressions.append(f"window loss {lb:.4f} -> {lr:.4f} ({rel:+.2%}; tolerance {loss_tolerance:.0%})")
    return j


def table(baseline: dict[str, Any], judgements: list[Judgement]):
    from rich.markup import escape
    from rich.table import Table

    s = baseline["step_time_ms"]
    t = Table(title=f"against the baseline {escape(str(baseline['source']))}: step {s['mean']:.2f} ms "
                    f"[{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}], n={s['n']}, contract {baseline['contract_hash']}",
              title_justify="left")
    for col in ("run", "step ms", "vs baseline (95% CI)", "verdict", "peak memory", "window loss", "outcome"):
        t.add_column(col)
    for j in judgements:
        if j.refused:
            t.add_row(escape(str(j.path)), "", "", "", "", "", f"[yellow]refused: {escape(j.refused)}")
            continue
        e = j.effect
        mem = "" if j.memory[2] is None else f"{j.memory[1]:.3f} GiB ({j.memory[2]:+.1%})"
        loss = f"{j.loss[1]:.4f} ({j.loss[2]:+.2%})"
        outcome = ("[red]regressed: " + escape("; ".join(j.regressions))) if j.regressed else "[green]holds"
        t.add_row(escape(str(j.path)), f"{e.mean_b_ms:.2f}", f"{e.rel_step_time:+.2%} [{e.ci_low:+.2%}, "
                  f"{e.ci_high:+.2%}]", e.verdict, mem, loss, outcome)
    return t
