"""The step-time model's calibration, read from one data file: ``step_model_fit.json`` beside this module.

The file holds ``step_model.*``'s defaults (``fitted``: what the fit to benchmarks/data/measured_runs.yaml decides;
``priors``: what the dataset does not decide, set from outside it), the held-out figures every plan states
(``held_out``: ``plan.json``'s interval, the layout search's tie width), the spot checks the tests recompute, when
and at which commit it was fitted, and the fingerprint of the code and data it was fitted from. It is written by
``python benchmarks/step_model_calibration.py --fit --write`` (:mod:`moe_hydra.planning.calibration`) and read by
the schema (:class:`moe_hydra.core.schema.StepModelConfig`'s defaults) and the step model
(:data:`moe_hydra.planning.step_model.HELD_OUT`); nothing writes these numbers anywhere else.

Pure module: the standard library only.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
from pathlib import Path
from typing import Any

from moe_hydra.core import io

FILE = "step_model_fit.json"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: where the fingerprinted files are (the dataset is not in
# the wheel)
# What the fit is a function of, besides the defaults: the step model's terms; the calibration (the rows' settings,
# the fit, its bounds and priors, the held-out scheme, the spot checks); the dataset. Other code a prediction reads
# (the hardware and model presets, FLOPs, the memory estimate that sets a row's recompute, the rules) is left out,
# so that an unrelated edit calls for no refit: the record's spot checks, which the tests recompute, cover it.
FINGERPRINTED = ("moe_hydra/planning/step_model.py", "moe_hydra/planning/calibration.py",
                 "benchmarks/data/measured_runs.yaml")
REFIT = "python benchmarks/step_model_calibration.py --fit --write"


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    """The calibration record, read once per process (from the installed package: a wheel carries it)."""
    return json.loads(importlib.resources.files(__package__).joinpath(FILE).read_text())


def default(name: str) -> float:
    """The default of ``step_model.<name>``: its fitted value, or its prior where the dataset does not decide it.

    Raises:
        KeyError: ``name`` is in neither part of the file (a field added to the schema before the refit that
            records it).
    """
    fit = load()
    for part in ("fitted", "priors"):
        if name in fit[part]:
            return fit[part][name]
    raise KeyError(f"step_model.{name} has no default in moe_hydra/core/{FILE} (neither fitted nor a prior): add it "
                   f"to the file's priors, or to calibration.FREE and refit (benchmarks/step_model_calibration.py "
                   f"--fit --write)")


def held_out() -> dict[str, Any]:
    """How the fitted model predicts rows it was not fitted to (leave one source out): ``plan.json``'s
    ``held_out``."""
    return load()["held_out"]


def fingerprint(fitted: dict[str, float], priors: dict[str, float], root: Path = ROOT) -> dict[str, Any]:
    """sha256 of each of :data:`FINGERPRINTED` under ``root`` (its bytes, line ends as LF: the same on every Python
    and platform; a comment counts), and ``sha256`` over those and the defaults: what the record was fitted from."""
    files = {p: hashlib.sha256((root / p).read_bytes().replace(b"\r\n", b"\n")).hexdigest() for p in FINGERPRINTED}
    both = json.dumps({"files": files, "fitted": fitted, "priors": priors}, sort_keys=True)
    return {"sha256": hashlib.sha256(both.encode()).hexdigest(), "files": files}


def stale(root: Path = ROOT, fit: dict[str, Any] | None = None) -> str | None:
    """Why the record (the file's, or ``fit``) no longer matches the code and data under ``root``, naming what
    changed and the command that refits; None when it matches."""
    fit = fit or load()
    now, was = fingerprint(fit["fitted"], fit["priors"], root), fit["fingerprint"]
    if now["sha256"] == was["sha256"]:
        return None
    changed = [p for p in FINGERPRINTED if now["files"][p] != was["files"].get(p)] or ["the defaults (fitted, priors)"]
    return (f"moe_hydra/core/{FILE} was fitted to other code or data: {', '.join(changed)} changed since "
            f"(fingerprint {was['sha256'][:12]}, now {now['sha256'][:12]}). Refit and record it: `{REFIT}` "
            f"(a few minutes), and commit the file with the change")


def write(fit: dict[str, Any]) -> Path:
    """Write the record into the source tree (this module's directory); the path written."""
    path = Path(__file__).with_name(FILE)
    io.write_json(fit, path)
    return path
