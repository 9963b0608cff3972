"""ddmin's bookkeeping against fake measurers with known effects (no machine noise): the culprit found alone or as
an interaction, 1-minimal, in no more tests than the algorithm needs, every subset tested once, refused subsets
stepped around, and the budget honoured."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from moe_hydra.planning import ddmin
from moe_hydra.planning.ddmin import FAIL, PASS, REFUSED, UNRESOLVED


def measurer(culprit: set[int], refused: Callable[[set[int]], bool] | None = None,
             undecided: Callable[[set[int]], bool] | None = None):
    calls = []

    def test(subset: tuple[int, ...]) -> str:
        calls.append(subset)
        if refused and refused(set(subset)):
            return REFUSED
        if undecided and undecided(set(subset)):
            return UNRESOLVED
        return FAIL if culprit <= set(subset) else PASS
    return test, calls


@pytest.mark.parametrize("count", [2, 3, 4, 6, 8, 13, 16, 32])
def test_one_culprit_is_found_alone_in_logarithmic_tests(count):
    for culprit in range(count):
        test, calls = measurer({culprit})
        r = ddmin.ddmin(count, test)
        assert r.culprit == (culprit,) and r.minimal and r.stopped is None
        assert len(calls) == len(set(calls)) == len(r.trials)  # each subset measured once
        assert len(calls) <= 2 * math.ceil(math.log2(count)), (culprit, calls)


def test_an_interaction_is_named_as_the_pair():
    rng = random.Random(7)
    for count in (4, 6, 8, 16):
        for pair in rng.sample(list(itertools.combinations(range(count), 2)), min(12, count * (count - 1) // 2)):
            test, calls = measurer(set(pair))
            r = ddmin.ddmin(count, test)
            assert r.culprit == pair and r.minimal, (count, pair, r)
            assert len(calls) == len(set(calls))
            assert len(calls) <= count * 2 + 2 * math.ceil(math.log2(count)), (count, pair, len(calls))


def test_subsets_the_rules_refuse_are_stepped_around_and_the_result_stays_minimal():
    """Unit 0 needs unit 1 (a rule refuses 0 without 1); the culprit is 0: the smallest testable failing set is
    {0, 1}, and removing either unit from it does not fail."""
    test, _ = measurer({0}, refused=lambda s: 0 in s and 1 not in s)
    r = ddmin.ddmin(6, test)
    assert set(r.culprit) == {0, 1} and r.minimal and not r.undecided
    assert any(t.outcome == REFUSED for t in r.trials)


def test_a_culprit_whose_leaving_out_stayed_undecided_is_not_called_minimal():
    """The noise leaves "unit 0 alone" undecided at its cap (a real slowdown the A/B could not show): ddmin keeps a
    failing set with a unit more than needed, and says which leaving-out it could not judge; with that test
    passing or failing instead, the same search is minimal."""
    test, _ = measurer({0}, undecided=lambda s: s == {0})
    r = ddmin.ddmin(6, test)
    assert 0 in r.culprit and len(r.culprit) > 1 and not r.minimal, r
    assert r.undecided and all(u != 0 for u in r.undecided) and r.stopped is None, r
    decided, _ = measurer({0})
    assert ddmin.ddmin(6, decided).minimal


def test_known_outcomes_are_not_measured_again_and_the_budget_stops_the_search():
    test, calls = measurer({5})
    first = ddmin.ddmin(8, test, max_tests=2)
    assert first.stopped == "max_tests" and len(first.trials) == 2 and not first.minimal
    assert set(first.culprit) >= {5}  # the smallest failing subset so far still holds the culprit
    known = {t.subset: t.outcome for t in first.trials}
    test2, calls2 = measurer({5})
    second = ddmin.ddmin(8, test2, known=known)
    assert second.culprit == (5,) and second.minimal and not set(calls2) & set(known)


def test_split_keeps_every_unit_once_in_order():
    for count, n in itertools.product(range(1, 12), range(2, 8)):
        parts = ddmin.split(tuple(range(count)), n)
        assert [u for p in parts for u in p] == list(range(count)) and len(parts) == min(n, count)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
