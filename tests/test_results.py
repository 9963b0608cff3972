"""results.json's schema and version (moe_hydra/core/results.py), and ``python -m moe_hydra.sweep status`` reading
results through it: every problem names its field, a stopped run is told as such, nothing raises."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from moe_hydra.core import results
from moe_hydra.commands import run_command
from moe_hydra.launch import follow, outcome

NEED = ("contract", "contract_hash", "loss")


def valid(n: int = 12, **changes) -> dict:
    """A complete run's results.json of ``n`` steps as the job writes it (version 1); ``changes`` replace keys,
    ``...`` deletes."""
    res = {"results_version": 1, "run_id": uuid.uuid4().hex, "status": "ok", "stage": "run", "signal": None,
           "steps": n, "warmup_steps": 3, "window": [4, n], "step_times_ms": [100.0 + i for i in range(n)],
           "step_time_ms": 107.5, "tokens_per_s_per_gpu": 1000.0, "tflops_per_gpu": 0.01, "mfu": None,
           "loss": {"first": 7.0, "last": 6.0, "per_step": [7.0] * (n - 1) + [6.0], "all_finite": True,
                    "nan_or_skipped": 0},
           "contract": {"hardware": {"run_to_run_noise": 0.2}}, "contract_hash": "abc", "swept": ["dispatcher"],
           "tracking": {"job_type": "dispatcher=alltoall"}, "label": "benchmark-only", "label_reasons": ["mock data"],
           "evidence": {}, "peak_memory_gib": {"rss": 0.5}}
    res.update(changes)
    return {k: v for k, v in res.items() if v is not ...}


def test_a_valid_file_and_a_file_from_before_the_version_pass():
    assert results.problems(valid(), NEED) == []
    legacy = valid(results_version=..., run_id=..., signal=...)
    assert results.problems(legacy, NEED) == []  # version 0: the same rules, no run_id


@pytest.mark.parametrize("value", [7, 0, "1", True, 1.0, None])
def test_any_other_version_is_refused(value):
    assert results.problems(valid(results_version=value)) == [
        f"results_version {json.dumps(value)} is not 1 (this moe_hydra reads version 1, and files without the key as "
        "version 0)"]


@pytest.mark.parametrize("obj", [[], 42, None, "ok", 1.5, True, [valid()]])
def test_not_an_object(obj):
    shown = json.dumps(obj) if len(json.dumps(obj)) <= 60 else json.dumps(obj)[:57] + "..."
    assert results.problems(obj) == [f"the file holds {shown}, not a JSON object"]


@pytest.mark.parametrize("changes, problem", [
    ({"run_id": ""}, 'run_id is "" (want a non-empty string)'),
    ({"run_id": 5}, "run_id is 5 (want a non-empty string)"),
    ({"status": ...}, "status is missing (want one of ok, failed, interrupted, terminated)"),
    ({"signal": "SIGKILL"}, 'signal is "SIGKILL" (want one of SIGTERM, SIGINT, SIGUSR2 or null)'),
    ({"step_times_ms": [100.0] * 3 + [float("nan")] + [100.0] * 8}, "step_times_ms[3] is nan (want a finite number > 0 "
                                                                    "and <= 1e+09)"),
    ({"step_times_ms": [0.0, -1.0] + [100.0] * 10}, "step_times_ms[0] is 0.0 (want a finite number > 0 and <= 1e+09) "
                                                    "(and 1 more)"),
    ({"step_times_ms": "fast"}, 'step_times_ms is "fast" (want a list)'),
    ({"steps": 11}, "steps 11 is not the 12 entries of step_times_ms"),
    ({"steps": True}, "steps is true (want an integer >= 0)"),
    ({"window": [4, 500]}, "window [4, 500] is outside the 12 steps run"),
    ({"window": [0, 3]}, "window [0, 3] is not [first, last] with 1 <= first <= last"),
    ({"window": [3, 2]}, "window [3, 2] is not [first, last] with 1 <= first <= last"),
    ({"window": [4.0, 12]}, "window is [4.0, 12] (want [first, last], two integers)"),
    ({"window": ...}, "window is missing (a run with status ok records it)"),
    ({"step_time_ms": float("inf")}, "step_time_ms is inf (want a finite number or null)"),
    ({"loss": {"first": 7.0, "last": 6.0, "per_step": [7.0, float("nan")], "all_finite": True}},
     "loss.all_finite is true but loss.per_step[1] is nan"),
    ({"contract": {"hardware": {"run_to_run_noise": "high"}}},
     'contract.hardware.run_to_run_noise is "high" (want a finite number >= 0 and <= 1 or null)'),
    ({"swept": "dispatcher"}, 'swept is "dispatcher" (want a list)'),
    ({"tracking": {"job_type": 3}}, "tracking.job_type is 3 (want a string)"),
    ({"peak_memory_gib": {"rss": "lots"}}, 'peak_memory_gib.rss is "lots" (want a finite number or null)'),
    ({"x": "\ud800"}, "x holds a lone surrogate (\\ud800-\\udfff): not Unicode text"),
])
def test_each_problem_names_its_field(changes, problem):
    assert problem in results.problems(valid(**changes))


@pytest.mark.parametrize("loss, problem", [
    ({"first": float("nan"), "last": 6.0, "all_finite": False}, "loss.first is nan (want a finite number)"),
    ({"first": 7.0, "last": None}, "loss.last is null (want a finite number)"),
    ({"first": 7.0, "last": 6.0, "per_step": [7.0, float("inf")], "all_finite": True},
     "loss.per_step[1] is inf (want a finite number) (loss.all_finite says true)"),
])
def test_a_reader_that_needs_the_loss_gets_it_finite_whatever_the_flag_says(loss, problem):
    assert problem in results.problems(valid(loss=loss), NEED)
    assert results.problems(valid(loss=loss, status="failed"), NEED) == results.problems(
        valid(loss=loss, status="failed"))  # only a complete run's loss is needed
    assert "loss is missing" in results.problems(valid(loss=...), NEED)


def test_a_diverged_run_is_a_fact_not_a_corrupt_file_when_the_loss_is_not_needed():
    loss = {"first": 7.0, "last": float("nan"), "per_step": [7.0, float("nan")], "all_finite": False,
            "nan_or_skipped": 1}
    assert results.problems(valid(loss=loss)) == []


def test_a_stopped_run_may_hold_a_window_beyond_its_steps():
    stopped = valid(5, status="terminated", signal="SIGTERM", window=[4, 400], window_measured=[4, 5])
    assert results.problems(stopped, NEED) == [] and results.measured_window(stopped) == [4, 5]
    none = valid(0, status="interrupted", signal="SIGINT", window=[4, 400], window_measured=None,
                 loss={"first": None, "last": None, "per_step": [], "all_finite": True, "nan_or_skipped": 0})
    assert results.problems(none, NEED) == [] and results.measured_window(none) is None
    assert "window_measured [4, 9] is not inside the window [4, 400] and the 5 steps run" in results.problems(
        valid(5, status="terminated", window=[4, 400], window_measured=[4, 9]))
    assert "window [4, 400] is outside the 12 steps run" in results.problems(valid(window=[4, 400]))


def test_a_failed_run_needs_no_steps():
    failed = {"status": "failed", "stage": "run", "error": "RuntimeError: boom", "contract": {}}
    assert results.problems(failed, NEED) == []


def test_nesting_beyond_the_limit_is_refused_without_recursion():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    (problem,) = results.problems({"status": "failed", "contract": {"x": deep}})
    assert problem == f"contract... is nested deeper than {results.MAX_DEPTH} levels"


@pytest.mark.parametrize("content, warning", [
    (b'{"status": "ok", "step_ti', "truncated or not JSON (Unterminated string"),
    (b"\xff\xfe{}", "not UTF-8 text (byte 0)"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep to be a results file"),
    (b"", "truncated or not JSON (Expecting value"),
    (b"NaN", "the file holds nan, not a JSON object"),
    (b'{"status": "ok", "step_times_ms": [1e999]}', "step_times_ms[0] is inf"),
])
def test_read_never_raises_and_names_the_file(tmp_path, content, warning):
    path = tmp_path / "results.json"
    path.write_bytes(content)
    res, message = results.read(path)
    assert res is None and message.startswith(f"{path}: ") and warning in message, message


def test_read_of_a_missing_file_or_a_directory(tmp_path):
    assert results.read(tmp_path / "nope.json") == (None, f"{tmp_path / 'nope.json'}: unreadable (No such file or "
                                                          "directory)")
    assert results.read(tmp_path)[1] == f"{tmp_path}: unreadable (Is a directory)"


def test_read_names_at_most_three_problems(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(valid(run_id="", signal="x", stage="", steps=-1, window=None)))
    _, message = results.read(path)
    assert message.count(";") == 2 and message.endswith("(and 2 more)"), message


# ----------------------------------------------------------------------------- python -m moe_hydra.sweep status

def _point(root: Path, num: int, state_recorded: str, content: str | None) -> dict:
    d = root / str(num)
    d.mkdir(parents=True)
    if content is not None:
        (d / "results.json").write_text(content)
    return {"num": num, "overrides": [f"repeat={num}"], "dir": str(d), "state": state_recorded}


def test_sweep_status_tells_stopped_and_unreadable_results(tmp_path, capsys):
    """Old code: a corrupt results.json of a point recorded COMPLETED still counted complete; a terminated run
    showed as FAILED (or as whatever sweep.json recorded)."""
    stopped = valid(5, status="terminated", signal="SIGTERM", window=[4, 400])
    points = [_point(tmp_path, 0, "COMPLETED", json.dumps(valid())),
              _point(tmp_path, 1, "FAILED", json.dumps(stopped)),
              _point(tmp_path, 2, "COMPLETED", "[]"),
              _point(tmp_path, 3, "COMPLETED", json.dumps(valid(window=[4, 99]))),
              _point(tmp_path, 4, "TIMEOUT", json.dumps(stopped))]
    (tmp_path / "sweep.json").write_text(json.dumps({"points": points}))
    told = {p.num: p for p in follow.status(tmp_path)}
    assert [told[n].state for n in range(5)] == ["COMPLETED", "TERMINATED", "UNKNOWN", "UNKNOWN", "TIMEOUT"]
    assert told[1].error == "stopped by SIGTERM after 5 steps (results.json status terminated)"
    assert "2/results.json: the file holds [], not a JSON object" in told[2].error
    assert "window [4, 99] is outside the 12 steps run" in told[3].error
    assert run_command("sweep", ["status", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "#1 TERMINATED" in out and "1 of 5 points complete" in out


def test_complete_results_is_read_through_the_schema(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(valid(step_times_ms=[float("nan")] * 12)))
    assert outcome.complete_results(tmp_path) is None
    (tmp_path / "results.json").write_text(json.dumps(valid()))
    assert outcome.complete_results(tmp_path)["status"] == "ok"
