"""The layout search's step-time model (moe_hydra.planning.step_model) against published measured step times.

Each published row is evaluated as the search evaluates a layout (same rules, memory estimate and
terms), with the row's model, hardware, batch, dispatcher, EP overlap and recompute modules. Printed:
measured vs modelled step time per row, the error, the rms log error, and whether the model orders the
rows as the measurements do. ``--fit`` refits the free sustained fractions (scipy least squares on
log step time, within physical bounds) and prints them: the defaults in ``moe_hydra.core.schema.StepModelConfig``
come from this fit.

    python benchmarks/step_model_calibration.py [--fit]

The rows and their source: ``moe_hydra.planning.step_model.PUBLISHED``. Four rows cannot pin down every
fraction: gemm_efficiency, attention_efficiency, scaleout_efficiency, ep_overlap_efficiency and
host_ms_per_dense_layer stay at priors (H100 BF16 GEMMs ~70 % of peak, flash attention ~50 %, NCCL over
400 Gb/s InfiniBand ~85 %, half the all-to-all hidden by EP overlap: the overlapped row waits for the
host in the fit, so it does not decide the overlap), and the fit says nothing about other hardware.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import compose_config  # noqa: E402

from moe_hydra.planning import plan, search  # noqa: E402
from moe_hydra.planning.step_model import PUBLISHED, Published, StepModel  # noqa: E402

FREE = {  # fitted: name -> (lower, upper)
    "host_ms_per_moe_layer": (0.0, 30.0),
    "expert_rows_half": (0.0, 8192.0),
    "nvlink_efficiency": (0.1, 1.0),
}

class Row:
    """One published measurement, evaluated once (rules, memory); its terms re-evaluated per parameter set."""

    def __init__(self, p: Published):
        self.p = p
        self.cfg = compose_config("stage=plan", *p.overrides)
        s = search.Search(self.cfg)
        tp, cp, pp, vpp, ep, etp, mbs = p.layout
        c = search.Candidate(tp, cp, pp, vpp, ep, etp, mbs, search.pipeline_split(s.arch, pp, vpp) or "even")
        self.result = s.evaluate(c)
        if not self.result.legal:
            raise SystemExit(f"{p.name}: illegal here: {self.result.violations}")
        self.plan = s.resolved(c, self.result.recompute, self.result.comm)
        self.worst = max(plan.assess(self.plan).ranks, key=lambda r: r.total)

    def terms(self, step_model) -> dict[str, float]:
        r = self.result
        model = StepModel(self.plan.with_settings(step_model=step_model))
        return model.terms(self.plan, self.worst.dense, self.worst.expert, r.recompute, r.comm.flex, r.comm.ep_overlap)

def rms_log_error(rows: list[Row], k) -> float:
    return math.sqrt(sum(math.log(r.terms(k)["step"] / r.p.step_s) ** 2 for r in rows) / len(rows))

def fit(rows: list[Row], k):
    from scipy.optimize import least_squares

    names = list(FREE)
    lo, hi = zip(*(FREE[n] for n in names))

    def residuals(x):
        kk = replace(k, **dict(zip(names, x)))
        return [math.log(r.terms(kk)["step"] / r.p.step_s) for r in rows]

    x0 = [min(max(getattr(k, n), a), b) for n, a, b in zip(names, lo, hi)]
    out = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3)
    return replace(k, **dict(zip(names, out.x)))

def report(rows: list[Row], k) -> None:
    print(f"{'published row':36s} {'measured s':>10s} {'model s':>8s} {'error':>7s}  recompute  GiB   terms (s)")
    for r in rows:
        t = r.terms(k)
        terms = " ".join(f"{n}={v:.2f}" for n, v in t.items() if n != "step" and v)
        print(f"{r.p.name:36s} {r.p.step_s:10.1f} {t['step']:8.2f} {t['step'] / r.p.step_s - 1:+7.1%}  "
              f"{r.result.recompute:9s} {r.result.memory_gib:5.1f} {terms}")
    measured = sorted(rows, key=lambda r: r.p.step_s)
    modelled = sorted(rows, key=lambda r: r.terms(k)["step"])
    print(f"rms log error {rms_log_error(rows, k):.3f}; order measured {[rows.index(r) for r in measured]}, "
          f"modelled {[rows.index(r) for r in modelled]}")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="refit the free fractions and print them")
    args = ap.parse_args()
    rows = [Row(p) for p in PUBLISHED]
    k = rows[0].cfg.step_model
    print("defaults (moe_hydra.core.schema.StepModelConfig):")
    report(rows, k)
    if args.fit:
        k = fit(rows, k)
        print("\nfitted: " + ", ".join(f"{n}={getattr(k, n):.3g}" for n in FREE))
        report(rows, k)

if __name__ == "__main__":
    main()
