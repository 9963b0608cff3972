"""Generated override sets through ``stage=plan`` in-process (:mod:`moe_hydra.testing.overrides`): no exception
escapes, nothing hangs, every refusal names a key it was given. Each commit draws its own sample (seeded by the
commit, :func:`moe_hydra.testing.commit_seed`), so the sets tried grow with the history; the 10,000-set run is
``benchmarks/hardening_overrides.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings

from moe_hydra.testing import commit_seed
from moe_hydra.testing.overrides import check_one, override_sets

pytestmark = pytest.mark.slow


@seed(commit_seed())
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(override_sets)
def test_generated_override_sets_plan_or_are_refused_naming_a_key(overrides):
    with tempfile.TemporaryDirectory() as d:
        check_one(overrides, Path(d))  # the 2 s per plan is benchmarks/hardening_overrides.py's to measure
