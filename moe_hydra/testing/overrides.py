"""Generated override sets (hypothesis) and their check through ``stage=plan`` in-process: every key of the schema
and every config group, valid and invalid values, deletions and additions. The promise: no exception escapes,
nothing hangs, every refusal names a key it was given. ``tests/test_overrides_fuzz.py`` draws a sample of them on
every commit; ``benchmarks/hardening_overrides.py`` runs 10,000 seeded sets and reports the slowest plan.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from pathlib import Path

from hypothesis import strategies as st

from moe_hydra.commands import _overrides, run_command
from moe_hydra.core import bounds
from moe_hydra.core.schema import leaves as schema_leaves

# stage (plan is the point), the launcher and the experiments (they start sweeps, on Slurm too) are left out
LEAVES = {p: t for p, t in schema_leaves() if p != "stage" and not p.startswith("launcher.")}
GROUPS = {g: options for g, options in _overrides.groups().items() if g not in ("launcher", "experiment")}
WEIRD = ["abc", "", "null", "nan", "inf", "-inf", "1e400", "10" * 20, "-1", "0", "[]", "[1", "{}", "'", "${env:HOME}",
         "${oc.env:HOME}", "${model.hidden_size}", "${nope}", "true", "[1,2,3]", "1.5", "-0.0", "\u00e9", "a b"]


def _numbers(path: str) -> st.SearchStrategy[str]:
    lo, hi = bounds.DOMAINS[path]
    integer = isinstance(lo, int) and isinstance(hi, int)
    inside = st.integers(int(lo), int(min(hi, 2**20))) if integer else st.floats(lo, hi, allow_nan=False)
    edges = st.sampled_from([lo, hi, lo - 1, hi + 1, 0, -1, 10**30]) if integer else \
        st.sampled_from([lo, hi, -1e-9, hi * 2, float("nan"), float("inf"), 0.0])
    return st.one_of(inside, edges).map(str)


def _values(path: str) -> st.SearchStrategy[str]:
    t = LEAVES[path]
    name = str(t)
    if path in bounds.DOMAINS:
        typed = _numbers(path)
    elif path in bounds.LIST_DOMAINS:
        typed = st.lists(st.integers(-3, 2**12), max_size=4).map(lambda xs: "[" + ",".join(map(str, xs)) + "]")
    elif "bool" in name:
        typed = st.sampled_from(["true", "false"])
    else:
        typed = st.text("abcdefghijklmnopqrstuvwxyz_|tEL0123456789", max_size=12)
    return st.one_of(typed, typed, st.sampled_from(WEIRD))


@st.composite
def override(draw) -> str:
    kind = draw(st.sampled_from(["key", "key", "key", "group", "delete", "add"]))
    if kind == "group":
        group = draw(st.sampled_from(sorted(GROUPS)))
        return f"{group}={draw(st.one_of(st.sampled_from(GROUPS[group]), st.sampled_from(['nope', '', 'ep'])))}"
    path = draw(st.sampled_from(sorted(LEAVES)))
    if kind == "delete":
        return f"~{path}"
    value = draw(_values(path))
    return f"{'+' if kind == 'add' else ''}{path}={value}"


override_sets = st.lists(override(), min_size=1, max_size=4)


def plan_in_process(overrides: list[str], run_dir: Path) -> tuple[int, str]:
    """``python -m moe_hydra stage=plan OVERRIDES`` in this process (the run command, as the command line runs it):
    (exit code, what it printed). An exception escaping it is a failure of the promise, and propagates.

    The process's logging is as it was afterwards: Hydra configures the root logger for each run (a file handler
    in ``run_dir``, which the caller removes), and a later test's log line would go to that file."""
    argv, root = sys.argv, logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = run_command("run", ["stage=plan", *overrides, f"hydra.run.dir={run_dir}"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    return code, out.getvalue()


def check_one(overrides: list[str], run_dir: Path) -> tuple[int, float]:
    """One set through stage=plan in-process: (exit code, seconds); raises AssertionError on a broken promise."""
    start = time.perf_counter()
    code, message = plan_in_process(overrides, run_dir)
    seconds = time.perf_counter() - start
    assert code in (0, 2), (overrides, code, message)
    assert "Traceback" not in message, (overrides, message)
    if code == 2:
        keys = {o.lstrip("~+").split("=", 1)[0] for o in overrides}
        assert any(k in message for k in keys), (overrides, message)
    return code, seconds
