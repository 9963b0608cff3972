"""The schema of ``results.json`` as code, and the one way to read it: results a reader may trust, or one
warning that names the file and the field.

The job writes ``results.json`` (``moe_hydra/job/train.py``, rank 0; docs/outputs.md lists every key). Every
reader (compare, ``python -m moe_hydra.sweep status``, the Slurm launcher's kept points, the layout sweeper's
screening) goes through :func:`read`, which never raises: not on any JSON value, an unreadable file, bad UTF-8 or
truncated JSON.

Versions (``results_version``):
    1   the job stamps ``results_version: 1`` and a ``run_id`` (uuid4 hex, unique per run); a run stopped by a
        signal writes ``status`` ``interrupted`` (SIGINT) or ``terminated`` with its ``signal`` and the steps
        measured so far
    0   a file written before the key existed (no ``results_version``): read under the same rules, without a
        ``run_id`` (compare then tells runs apart by path and by their step times)
    any other value is refused: this code does not know what it means

Rules, checked whatever the file's own flags (``loss.all_finite``, ``status``) claim:
    - a JSON object, nested at most :data:`MAX_DEPTH` levels, its text valid Unicode (no lone surrogate);
    - ``status`` one of :data:`STATUSES`; ``run_id`` a non-empty string; ``signal`` one of :data:`SIGNALS` or null;
    - every key of :data:`FIELDS` that is present has its type (a number there is finite);
    - a run with measured steps (status ``ok``, ``interrupted``, ``terminated``): ``step_times_ms`` a list of times
      0 < t <= :data:`MAX_STEP_MS`; ``steps`` equal to its length (> 0 when ``ok``); ``window`` two integers
      1 <= first <= last, and last <= steps when ``ok`` (a stopped run's window may reach beyond the steps it
      measured: :func:`measured_window` clips it, and such a run never enters a comparison);
    - ``need``: keys the caller uses from a complete (``ok``) run must be present; ``loss`` then has finite
      ``first`` and ``last`` and a finite ``per_step``.

Pure: standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from moe_hydra.core.startup import STARTS

RESULTS_VERSION = 1  # what the job writes; files without the key are version 0
OK, FAILED, INTERRUPTED, TERMINATED = "ok", "failed", "interrupted", "terminated"
STATUSES = (OK, FAILED, INTERRUPTED, TERMINATED)
STOPPED = (INTERRUPTED, TERMINATED)  # stopped by a signal: the steps measured so far, never a comparison
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR2")  # Slurm's timeout/cancel, a terminal's Ctrl-C, preemption
MAX_STEP_MS = 1e9  # about 11.6 days: beyond it a value is not a step time, and sums of squares would overflow
MAX_DEPTH = 64  # deeper nesting is not a results file (and would exhaust a recursive reader's stack)
SHOWN = 3  # problems named in one warning

# A check takes the field's name and value, and returns the problem (naming the field) or None.
Check = Callable[[str, Any], "str | None"]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    """A number that is not NaN or infinite (integers from JSON always are; no float conversion: no overflow)."""
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _show(v: Any) -> str:
    """A value as it reads in JSON (nan, inf as Python writes them), at most 60 characters."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    shown = json.dumps(v, default=str)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _wrong(name: str, value: Any, want: str) -> str:
    return f"{name} is {_show(value)} (want {want})"


def number(low: float | None = None, high: float | None = None, *, above: float | None = None,
           null: bool = True) -> Check:
    """A finite number, >= ``low``, > ``above``, <= ``high`` (each when given); null allowed when ``null``."""
    bounds = [f"{op} {x:g}" for op, x in ((">=", low), (">", above), ("<=", high)) if x is not None]
    want = "a finite number" + (" " + " and ".join(bounds) if bounds else "") + (" or null" if null else "")

    def check(name: str, v: Any) -> str | None:
        if v is None and null:
            return None
        ok = _finite(v) and (low is None or v >= low) and (above is None or v > above) and (high is None or v <= high)
        return None if ok else _wrong(name, v, want)

    return check


def integer(low: int = 0, *, null: bool = False) -> Check:
    """An integer >= low (not a boolean); null allowed when ``null``."""

    def check(name: str, v: Any) -> str | None:
        ok = (v is None and null) or (_is_int(v) and v >= low)
        return None if ok else _wrong(name, v, f"an integer >= {low}" + (" or null" if null else ""))

    return check


def text(*, choices: tuple[str, ...] = (), null: bool = False) -> Check:
    """A non-empty string, one of ``choices`` when given; null allowed when ``null``."""
    want = f"one of {', '.join(choices)}" if choices else "a non-empty string"

    def check(name: str, v: Any) -> str | None:
        ok = (v is None and null) or (isinstance(v, str) and v != "" and (not choices or v in choices))
        return None if ok else _wrong(name, v, want + (" or null" if null else ""))

    return check


def flag(name: str, v: Any) -> str | None:
    return None if isinstance(v, bool) else _wrong(name, v, "true or false")


def mapping(*, null: bool = False, values: Check | None = None) -> Check:
    """A JSON object (each value passing ``values`` when given); null allowed when ``null``."""

    def check(name: str, v: Any) -> str | None:
        if v is None and null:
            return None
        if not isinstance(v, dict):
            return _wrong(name, v, "an object" + (" or null" if null else ""))
        return next((p for k, x in v.items() if values and (p := values(f"{name}.{k}", x))), None)

    return check


def items(each: Check) -> Check:
    """A list whose items pass ``each``: the first bad item is named, and how many more there are."""

    def check(name: str, v: Any) -> str | None:
        if not isinstance(v, list):
            return _wrong(name, v, "a list")
        bad = [p for i, x in enumerate(v) if (p := each(f"{name}[{i}]", x))]
        return None if not bad else bad[0] + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")

    return check


def pair(*, null: bool = False) -> Check:
    """``[first, last]``: two integers (a window of 1-based steps); null allowed when ``null``."""

    def check(name: str, v: Any) -> str | None:
        ok = (v is None and null) or (isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v))
        return None if ok else _wrong(name, v, "[first, last], two integers" + (" or null" if null else ""))

    return check


def any_number(*, null: bool = False) -> Check:
    """A number, NaN and infinity allowed (a loss that went NaN is a fact of the run); null when ``null``."""

    def check(name: str, v: Any) -> str | None:
        ok = (v is None and null) or _is_number(v)
        return None if ok else _wrong(name, v, "a number" + (" or null" if null else ""))

    return check


def string(name: str, v: Any) -> str | None:
    return None if isinstance(v, str) else _wrong(name, v, "a string")


STEP_TIME = number(above=0, high=MAX_STEP_MS, null=False)
METRIC = number()
# Keys a reader relies on, by dotted path: checked wherever present. The job writes more (docs/outputs.md).
FIELDS: dict[str, tuple[Check, str]] = {
    "run_id": (text(), "unique per run (uuid4 hex); compare counts a run once"),
    "status": (text(choices=STATUSES), "ok | failed | interrupted | terminated"),
    "signal": (text(choices=SIGNALS, null=True), "the signal that stopped the run, else null"),
    "stage": (text(), "run"),
    "steps": (integer(0), "steps run (measured so far, when stopped)"),
    "warmup_steps": (integer(0), "warmup steps, never in a statistic"),
    "window": (pair(), "the steady window [first, last], 1-based, inclusive"),
    "window_measured": (pair(null=True), "the part of the window a stopped run measured"),
    "stopped_at_step": (integer(0, null=True), "the last step a stopped run finished"),
    "step_times_ms": (items(STEP_TIME), "every step's time, the slowest rank's, ms"),
    **{k: (METRIC, "a window figure, null when not measured") for k in (
        "step_time_ms", "step_time_ms_std", "host_time_ms", "device_time_ms", "tokens_per_s_per_gpu",
        "tflops_per_gpu", "mfu", "window_loop_ms_per_step")},
    "loss": (mapping(), "first, last, per_step, all_finite, nan_or_skipped"),
    "loss.first": (any_number(null=True), "the first step's loss (null: no step measured)"),
    "loss.last": (any_number(null=True), "the last step's loss"),
    "loss.per_step": (items(any_number()), "every step's loss"),
    "loss.all_finite": (flag, "every loss finite: a claim, checked against per_step"),
    "loss.nan_or_skipped": (integer(0), "steps with a non-finite loss or a skipped update"),
    "contract": (mapping(), "the measurement contract"),
    "contract.hardware": (mapping(), "the hardware preset"),
    "contract.hardware.run_to_run_noise": (number(0, 1), "compare's noise floor for one-run arms"),
    "contract_hash": (text(), "the contract without the swept variables"),
    "swept": (items(text()), "the keys the run's multirun swept"),
    "tracking": (mapping(null=True), "W&B group and arm"),
    "tracking.job_type": (string, "the arm: the swept overrides"),
    "label": (text(null=True), "training-equivalent | benchmark-only"),
    "label_reasons": (items(string), "why benchmark-only"),
    "evidence": (mapping(null=True), "what was built"),
    "peak_memory_gib": (mapping(null=True, values=METRIC), "allocated, reserved or rss, GiB"),
    "attempts": (items(mapping()), "launcher=slurm: every start of the point (attempts.json), the last one this run"),
    "startup": (mapping(null=True), "seconds from the command's start to step 1 on rank 0, and how the ranks started"),
    "startup.seconds": (number(0, null=False), "the start-up, s"),
    "startup.start": (text(choices=STARTS), "how the ranks started (moe_hydra.core.startup)"),
    "profile": (mapping(null=True), "profile=window: the slowest rank's walls (profile.json has the rest)"),
    "profile.steps": (pair(), "the profiled [first, last]"),
    **{f"profile.{k}": (number(0, null=False), "ms summed over the profiled steps") for k in (
        "wall_ms", "compute_ms", "communication_ms", "exposed_communication_ms", "memcpy_ms", "host_ms", "idle_ms")},
}


def measured_window(results: dict[str, Any]) -> list[int] | None:
    """The steady window clipped to the steps the run measured (a stopped run's may reach beyond them);
    None when no step of the window was measured. ``results`` must have passed :func:`problems`."""
    first, last = results["window"]
    last = min(last, len(results["step_times_ms"]))
    return [first, last] if first <= last else None


def _walk(obj: Any) -> Iterable[tuple[str, Any, int]]:
    """(dotted path, value, depth) of every node, iteratively (no recursion on hostile nesting)."""
    stack = [("", obj, 0)]
    while stack:
        path, v, depth = stack.pop()
        yield path, v, depth
        if depth >= MAX_DEPTH:
            continue
        if isinstance(v, dict):
            stack += [(f"{path}.{k}" if path else k, x, depth + 1) for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(f"{path}[{i}]", x, depth + 1) for i, x in enumerate(v)]


def unfit(obj: Any) -> str | None:
    """What makes a JSON value unfit to hand to any reader (deeper than :data:`MAX_DEPTH`, or a string with a
    lone surrogate, which no UTF-8 encoder writes), naming where; None when it is fit."""
    for path, v, depth in _walk(obj):
        if depth >= MAX_DEPTH:
            return f"{path.split('[')[0].split('.')[0]}... is nested deeper than {MAX_DEPTH} levels"
        for s in (v, *(v if isinstance(v, dict) else ())):
            if isinstance(s, str) and not s.isascii():
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{path or 'a key'} holds a lone surrogate (\\ud800-\\udfff): not Unicode text"
    return None


def _lookup(obj: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _steps(r: dict[str, Any]) -> list[str]:
    """A run with measured steps: times, their count and the window agree."""
    status, out = r.get("status"), []
    missing = [k for k in ("step_times_ms", "steps", "window") if k not in r]
    if missing:
        return [f"{k} is missing (a run with status {status} records it)" for k in missing]
    times, steps, window = r["step_times_ms"], r["steps"], r["window"]
    if not (isinstance(times, list) and _is_int(steps) and pair()("window", window) is None):
        return []  # the type is already named
    if steps != len(times):
        out.append(f"steps {steps} is not the {len(times)} entries of step_times_ms")
    if status == OK and not times:
        out.append("step_times_ms is empty (a complete run measured no step)")
    first, last = window
    if not 1 <= first <= last:
        out.append(f"window {_show(window)} is not [first, last] with 1 <= first <= last")
    elif status == OK and last > len(times):
        out.append(f"window {_show(window)} is outside the {len(times)} steps run")
    measured = r.get("window_measured")
    if measured is not None and pair()("", measured) is None and not (
            first <= measured[0] <= measured[1] <= min(last, len(times))):
        out.append(f"window_measured {_show(measured)} is not inside the window {_show(window)} and the "
                   f"{len(times)} steps run")
    return out


def _loss(r: dict[str, Any]) -> list[str]:
    """The loss a complete run's reader uses: finite, whatever ``loss.all_finite`` claims."""
    loss = r.get("loss")
    if not isinstance(loss, dict):
        return [] if "loss" in r else ["loss is missing"]
    claim = " (loss.all_finite says true)" if loss.get("all_finite") is True else ""
    out = [p + claim for k in ("first", "last") if (p := number(null=False)(f"loss.{k}", loss.get(k)))]
    if isinstance(loss.get("per_step"), list) and (p := items(number(null=False))("loss.per_step", loss["per_step"])):
        out.append(p + claim)
    return out


def problems(obj: Any, need: Iterable[str] = ()) -> list[str]:
    """Everything wrong with ``obj`` as a results.json, each problem naming its field; empty when it may be read.

    Args:
        obj: any JSON value (what ``json.loads`` returned).
        need: top-level keys the caller uses from a complete (status ok) run; ``loss`` must then be finite.
    """
    if not isinstance(obj, dict):
        return [f"the file holds {_show(obj)}, not a JSON object"]
    need = tuple(need)
    shape = unfit(obj)
    if shape:
        return [shape]
    out = []
    v = obj.get("results_version")
    if "results_version" in obj and not (_is_int(v) and v == RESULTS_VERSION):
        out.append(f"results_version {_show(v)} is not {RESULTS_VERSION} (this moe_hydra reads version "
                   f"{RESULTS_VERSION}, and files without the key as version 0)")
    if "status" not in obj:
        out.append(f"status is missing (want one of {', '.join(STATUSES)})")
    for path, (check, _) in FIELDS.items():
        found, value = _lookup(obj, path)
        if found and (p := check(path, value)):
            out.append(p)
    status, loss = obj.get("status"), obj.get("loss")
    checks_loss = status == OK and "loss" in need  # then every loss must be finite, whatever the flag says
    if not checks_loss and isinstance(loss, dict) and loss.get("all_finite") is True and isinstance(
            loss.get("per_step"), list):
        bad = next((i for i, x in enumerate(loss["per_step"]) if _is_number(x) and not _finite(x)), None)
        if bad is not None:
            out.append(f"loss.all_finite is true but loss.per_step[{bad}] is {_show(loss['per_step'][bad])}")
    if status in (OK, *STOPPED):
        out += _steps(obj)
    if status == OK:
        out += [f"{k} is missing" for k in need if k != "loss" and k not in obj]
        out += _loss(obj) if checks_loss else []
    return out


def read(path: Path, need: Iterable[str] = ()) -> tuple[dict[str, Any] | None, str | None]:
    """``(results, None)``, or ``(None, warning)`` naming the file and the field; never raises.

    Args:
        path: a results.json.
        need: as for :func:`problems`.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return None, f"{path}: unreadable ({e.strerror or type(e).__name__})"
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"{path}: not UTF-8 text (byte {e.start})"
    except RecursionError:
        return None, f"{path}: nested too deep to be a results file"
    except ValueError as e:
        return None, f"{path}: truncated or not JSON ({e})"
    found = problems(obj, need)
    if not found:
        return obj, None
    more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
    return None, f"{path}: {'; '.join(found[:SHOWN])}{more}"
