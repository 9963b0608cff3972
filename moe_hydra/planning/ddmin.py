"""Delta debugging over the units that separate a good configuration from a bad one (Zeller and Hildebrandt,
"Simplifying and Isolating Failure-Inducing Input", IEEE TSE 2002: the ``ddmin`` algorithm).

A *test* applies a subset of the bad side's units to the good side and says whether the regression is there:
:data:`FAIL` (it reproduces: the subset's run is slower than good), :data:`PASS` (it does not: equivalent, or
faster), :data:`UNRESOLVED` (the verdict stayed undecided at its cap) or :data:`REFUSED` (the rules refuse that
subset: it cannot run). ``ddmin``
returns a 1-minimal failing subset: the regression reproduces with it, and with no unit of it left out — one unit,
or an interaction (two units slow only together). A culprit is shown minimal only when each leaving-out *passes*
(or is refused: the culprit is then the smallest set that can run); one that stayed unresolved leaves the culprit a
failing set that may hold a unit it does not need (``undecided``). Every subset is tested at most once (a cache), and the tests can
be bounded (``max_tests``: the search stops, and says so, with the smallest failing subset it has).

Pure: no measurement here; moe_hydra.launch.bisect measures a subset with the sequential test of ``repeat=auto``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FAIL, PASS, UNRESOLVED, REFUSED = "fail", "pass", "unresolved", "refused"


@dataclass(frozen=True)
class Trial:
    subset: tuple[int, ...]  # indices of the units applied to good
    outcome: str  # FAIL | PASS | UNRESOLVED | REFUSED


@dataclass
class Result:
    culprit: tuple[int, ...]  # the smallest failing subset found (1-minimal when ``minimal``)
    trials: list[Trial] = field(default_factory=list)
    minimal: bool = False  # every unit of the culprit left out once: the regression gone each time (or refused)
    stopped: str | None = None  # why the search stopped early ("max_tests")
    undecided: list[int] = field(default_factory=list)  # units of the culprit whose leaving out was UNRESOLVED


class _Budget(Exception):
    pass


def split(units: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """``units`` in ``n`` contiguous parts of (nearly) equal size, the larger first."""
    size, extra = divmod(len(units), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(tuple(units[start:end]))
        start = end
    return [p for p in out if p]


def ddmin(count: int, test: Callable[[tuple[int, ...]], str], max_tests: int | None = None,
          known: dict[tuple[int, ...], str] | None = None) -> Result:
    """The 1-minimal failing subset of ``range(count)``, the whole of which fails (the caller's reproduction).

    ``test(subset)`` returns FAIL, PASS, UNRESOLVED or REFUSED for a sorted tuple of unit indices; ``known``: outcomes
    already measured (a resumed search, the reproduction), never tested again and not counted as trials.
    """
    cache: dict[tuple[int, ...], str] = dict(known or {})
    result = Result(culprit=tuple(range(count)))

    def outcome(subset: tuple[int, ...]) -> str:
        key = tuple(sorted(subset))
        if key not in cache:
            if max_tests is not None and len(result.trials) >= max_tests:
                raise _Budget
            cache[key] = test(key)
            result.trials.append(Trial(key, cache[key]))
        return cache[key]

    c, n = result.culprit, 2
    try:
        while len(c) >= 2:
            parts = split(c, n)
            reduced = next((p for p in parts if outcome(p) == FAIL), None)
            if reduced is not None:  # the regression is in one part
                c, n = reduced, 2
                result.culprit = c
                continue
            if n > 2:  # in what is left without one part (with n == 2 that is the other part, tested already)
                complement = next((r for p in parts if outcome(r := tuple(u for u in c if u not in p)) == FAIL),
                                  None)
                if complement is not None:
                    c, n = complement, max(n - 1, 2)
                    result.culprit = c
                    continue
            if n >= len(c):
                break
            n = min(len(c), 2 * n)
        # a unit whose leaving out stayed unresolved may not be needed: the culprit is then not shown minimal
        without = {u: outcome(tuple(x for x in c if x != u)) for u in c} if len(c) > 1 else {}
        result.undecided = [u for u, o in without.items() if o == UNRESOLVED]
        result.minimal = all(o in (PASS, REFUSED) for o in without.values())
    except _Budget:
        result.stopped = "max_tests"
    return result
