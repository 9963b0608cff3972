"""Generated results.json files (hypothesis) and their check through ``results.read`` and compare, accept and diff
in-process: arbitrary JSON values, bytes that are not JSON, and valid files mutated (wrong types,
NaN/inf/negative/zero, windows, missing keys, versions, statuses, duplicated runs). The promise: no exception
escapes, the exit code is 0, 1 or 2, a file refused is refused with a warning naming the file and a field, and a
run given twice is never a verdict.

``cases`` and ``check_case`` are the strategy and the check: ``tests/test_results_fuzz.py`` draws a sample on every
commit, ``benchmarks/hardening_results.py`` runs 2,000 seeded cases and counts what escaped.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from moe_hydra.analysis.runs import NEED
from moe_hydra.commands import run_command
from moe_hydra.core import contract, results

VERDICT_WORD = re.compile(r"\b(faster|slower)\b")
# Phrases of a warning about the file as a whole (not one field): what read() says of non-objects and bad bytes.
WHOLE_FILE = ("not a JSON object", "truncated or not JSON", "not UTF-8", "nested", "status is missing")
WEIRD = [math.nan, math.inf, -math.inf, 0, 0.0, -1, -1e-9, 1e300, 10**30, 5e-324, 1e9, "", "x", "\ud800", "[/]",
         "$\\frac{", None, True, False, [], {}, [5, 9], [3, 2], [0, 3], [41, 500], [1, 1], [1], "[4, 23]",
         {"first": math.nan}]
# Arm names a renderer could misread: rich markup, matplotlib mathtext (an even number of "$"), escapes.
HOSTILE_NAMES = ["[/]", "[bold]", "[/bold]", "$x^$", "$\\frac{$", "a$b$c", "$$", "\\", "[link=x]y"]
# Where a mutation lands: top-level keys, and the nested ones a reader relies on.
PATHS = ["results_version", "run_id", "status", "signal", "stage", "steps", "warmup_steps", "window",
         "window_measured", "step_times_ms", "step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "loss",
         "loss.first", "loss.last", "loss.per_step", "loss.all_finite", "loss.nan_or_skipped", "contract",
         "contract.hardware", "contract.hardware.run_to_run_noise", "contract.dispatcher.name", "contract_hash",
         "swept", "tracking", "tracking.job_type", "label", "label_reasons", "evidence", "peak_memory_gib",
         "peak_memory_gib.rss"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def base_results(dispatcher: str, times: list[float], seed: int) -> dict[str, Any]:
    """A complete run's results.json as the job writes it (version 1), one arm of a dispatcher A/B."""
    c = {"dispatcher": {"name": dispatcher}, "train": {"seq_length": 128}, "hardware": {"run_to_run_noise": 0.2}}
    n = len(times)
    return {"results_version": 1, "run_id": uuid.UUID(int=seed).hex, "status": "ok", "stage": "run", "signal": None,
            "contract": c, **contract.hashes(c, ["dispatcher"]), "swept": ["dispatcher"],
            "tracking": {"job_type": f"dispatcher={dispatcher}"}, "steps": n, "warmup_steps": 3, "window": [4, n],
            "step_times_ms": times, "step_time_ms": sum(times[3:]) / (n - 3), "tokens_per_s_per_gpu": 1000.0,
            "tflops_per_gpu": 0.01, "mfu": None, "label": "training-equivalent", "label_reasons": [],
            "loss": {"first": 7.0, "last": 6.0, "per_step": [7.0] * (n - 1) + [6.0], "all_finite": True,
                     "nan_or_skipped": 0},
            "evidence": {"dispatcher_class": f"{dispatcher}Dispatcher"}, "peak_memory_gib": {"rss": 0.5}}


def _set(tree: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    if value is ...:
        tree.pop(leaf, None)
    else:
        tree[leaf] = value


@st.composite
def mutation(draw) -> tuple[str, Any]:
    """(path, new value) for a valid file; ``...`` deletes the key; ``step_times_ms[i]`` changes one step."""
    kind = draw(st.sampled_from(["set", "set", "delete", "step", "arbitrary"]))
    if kind == "step":
        return f"step_times_ms[{draw(st.integers(0, 22))}]", draw(st.sampled_from(WEIRD[:11]) | st.floats())
    path = draw(st.sampled_from(PATHS))
    if kind == "delete":
        return path, ...
    return path, draw(json_values if kind == "arbitrary" else st.sampled_from(WEIRD))


@dataclass
class Case:
    """Files for compare: ``texts[i]`` is run i's results.json (bytes); ``copies`` the runs also written a second
    time elsewhere; ``mode`` the compare command; ``mutated`` the top-level keys each file's mutations touched."""

    texts: list[bytes]
    copies: list[int]
    mode: str
    mutated: list[set[str]] = field(default_factory=list)


def _encode(res: Any, damage: str, cut: float) -> bytes:
    text = json.dumps(res).encode("utf-8", "surrogatepass")  # a lone surrogate stays what the file says
    if damage == "truncate":
        return text[: int(len(text) * cut)]
    if damage == "latin-1":
        return text + b"\xff"
    return text


@st.composite
def cases(draw) -> Case:
    """Two runs of a dispatcher A/B (one of them, or both, damaged) and sometimes a copy of one, for one command."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    texts, mutated = [], []
    names = draw(st.sampled_from([("alltoall", "allgather")] * 2 + [None])) or tuple(draw(
        st.sampled_from(HOSTILE_NAMES) | st.text("$[]/\\{}^_ab", min_size=1, max_size=6)) for _ in range(2))
    means = (100.0, draw(st.sampled_from([100.0, 130.0])))
    for i, (dispatcher, mean) in enumerate(zip(names, means)):
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "mutated", "arbitrary", "bytes"]))
        res: Any = base_results(dispatcher, [rng.gauss(mean, 3.0) for _ in range(23)], seed + i)
        touched: set[str] = set()
        if kind == "mutated":
            for path, value in draw(st.lists(mutation(), min_size=1, max_size=3)):
                index = re.fullmatch(r"step_times_ms\[(\d+)\]", path)
                if not index:
                    _set(res, path, value)
                elif isinstance(res.get("step_times_ms"), list) and int(index[1]) < len(res["step_times_ms"]):
                    res["step_times_ms"][int(index[1])] = value
                touched.add(path.split(".")[0].split("[")[0])
        elif kind == "arbitrary":
            res = draw(json_values)
        damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "latin-1"])) if kind != "valid" else "none"
        texts.append(_encode(res, damage, draw(st.floats(0, 1))) if kind != "bytes" else draw(st.binary(max_size=40)))
        mutated.append(touched)
    copies = draw(st.sampled_from([[], [], [0], [1], [0, 1]]))
    return Case(texts, copies, draw(st.sampled_from(["verdict", "verdict", "accept", "diff"])), mutated)


def _run(name: str, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_command(name, argv)
    return code, out.getvalue(), err.getvalue()


def check_case(case: Case, root: Path) -> int:
    """Write ``case`` under ``root``, read every file and run compare (or accept, or diff); its exit code.

    Raises:
        AssertionError: a promise broken (an exit code outside 0/1/2, a refusal that names no field, a verdict
            from a run given twice); any other exception is one that escaped ``results.read`` or the command.
    """
    runs = root / "D"
    for i, text in enumerate(case.texts):
        (runs / str(i)).mkdir(parents=True)
        (runs / str(i) / "results.json").write_bytes(text)
        if i in case.copies:
            (root / "copy" / str(i)).mkdir(parents=True)
            (root / "copy" / str(i) / "results.json").write_bytes(text)
    warnings = {}
    for i in range(len(case.texts)):
        path = runs / str(i) / "results.json"
        res, warning = results.read(path, NEED)
        assert (res is None) != (warning is None), (res, warning)
        if warning:
            assert warning.startswith(f"{path}: "), warning
            assert any(k in warning for k in (*case.mutated[i], *WHOLE_FILE)), (case.mutated[i], warning)
            warnings[i] = warning
    dirs = [str(runs / "0"), str(runs / "1")] if case.mode == "diff" else [str(runs)]
    dirs += [str(root / "copy")] if case.copies and case.mode != "diff" else []
    name = {"verdict": "compare", "accept": "accept", "diff": "diff"}[case.mode]
    code, out, err = _run(name, [*dirs, *(["--out", str(root / "out")] if name == "compare" else [])])
    assert code in (0, 1, 2), code
    assert "Traceback" not in out + err
    for warning in warnings.values():
        assert warning in err, (warning, err)
    if case.copies and case.mode == "verdict":
        assert not VERDICT_WORD.search(out), out
    return code
