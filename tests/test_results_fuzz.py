"""Generated results.json files through ``results.read`` and compare, accept and diff in-process
(:mod:`moe_hydra.testing.results`): no exception escapes, the exit code is 0, 1 or 2, a file refused is refused
with a warning naming the file and a field, and a run given twice is never a verdict. Each commit draws its own
sample (:func:`moe_hydra.testing.commit_seed`); the 2,000-case run is ``benchmarks/hardening_results.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

from moe_hydra.analysis.runs import NEED
from moe_hydra.core import results
from moe_hydra.testing import commit_seed
from moe_hydra.testing.results import cases, check_case, json_values


@seed(commit_seed())
@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_generated_results_never_escape_read_or_compare(case):
    with tempfile.TemporaryDirectory() as tmp:
        check_case(case, Path(tmp))


@seed(commit_seed())
@settings(max_examples=200, deadline=None, database=None)
@given(json_values)
def test_any_json_value_gives_results_or_one_warning(value):
    found = results.problems(value, NEED)
    assert all(isinstance(p, str) and p for p in found)
    if not isinstance(value, dict):
        assert len(found) == 1 and found[0].startswith("the file holds ") and found[0].endswith(", not a JSON object")
