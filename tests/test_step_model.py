"""The layout search's step-time model against published measured step times (its calibration data)."""

from __future__ import annotations

import pytest

from moe_hydra.planning import search
from moe_hydra.planning.step_model import PUBLISHED
from tests.conftest import compose_config


def _modelled(p):
    """The published run as the search evaluates it: same rules, memory estimate and terms."""
    s = search.Search(compose_config("stage=plan", *p.overrides))
    tp, cp, pp, vpp, ep, etp, mbs = p.layout
    r = s.evaluate(search.Candidate(tp, cp, pp, vpp, ep, etp, mbs, search.pipeline_split(s.arch, pp, vpp) or "even"))
    assert r.legal and r.fits, (p.name, r.violations, r.memory_gib)  # they ran, so they must fit here
    return r.terms["step"]


def test_the_model_orders_the_published_runs_as_measured_and_within_15_percent():
    modelled = [_modelled(p) for p in PUBLISHED]
    for p, step in zip(PUBLISHED, modelled):
        assert step == pytest.approx(p.step_s, rel=0.15), p.name
    # the order that matters for ranking: cross-node EP with DeepEP and EP overlap first, TP4 EP8 last
    measured = sorted(range(len(PUBLISHED)), key=lambda i: PUBLISHED[i].step_s)
    assert sorted(range(len(PUBLISHED)), key=lambda i: modelled[i]) == measured
