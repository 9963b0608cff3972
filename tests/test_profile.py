"""profile=window on the CPU: real Megatron-Core runs traced by torch.profiler, their walls in profile.json, and
compare --diff naming the wall that moved."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.core import contract, stats, walls
from moe_hydra.core.resolved import resolve
from tests.conftest import compose_config, run_cli

# the communication diff judges measured walls: run alone (make test)
pytestmark = pytest.mark.serial

# A declared window, the same steps in every EP2 run: the diffs below compare walls and routers over the same steps
# (contract.window=auto would stop each run on its own segment); the one-process run profiles after auto's window.
EP2 = ("hardware.devices_per_node=2", "expert_mesh=ep2", "logger=none", "contract.window=[4,10]")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """EP2 alltoall and allgather profiled (one sweep), EP2 alltoall unprofiled, and one process (EP1) profiled."""
    root = tmp_path_factory.mktemp("profile")
    for name, args in (("sweep", ("-m", f"hydra.sweep.dir={root}/sweep", *EP2, "profile=window",
                                  "dispatcher=alltoall,allgather")),
                       ("plain", (f"hydra.run.dir={root}/plain", *EP2)),
                       ("ep1", (f"hydra.run.dir={root}/ep1", "logger=none", "profile=window"))):
        r = run_cli(*args, cwd=root, timeout=600)
        assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
    return {"alltoall": root / "sweep/0", "allgather": root / "sweep/1", "plain": root / "plain", "ep1": root / "ep1",
            "root": root}


def profile(run: Path) -> dict:
    return json.loads((run / "profile.json").read_text())


@pytest.mark.parametrize("arm", ["alltoall", "allgather"])
def test_every_ranks_walls_sum_to_its_window(runs, arm):
    doc = profile(runs[arm])
    results = json.loads((runs[arm] / "results.json").read_text())
    first, last = results["window"]
    assert doc["steps"] == [last + 1, last + 5] and doc["window"] == [first, last] and doc["perturbs_window"] is False
    assert doc["activities"] == ["CPU"] and len(doc["ranks"]) == 2
    for rank in doc["ranks"]:
        parts = sum(rank[k] for k in walls.EXCLUSIVE)
        assert abs(parts - rank["wall_ms"]) <= 0.01 * rank["wall_ms"], rank
        assert rank["communication_ms"] > 0 and rank["compute_ms"] > 0
        assert len(rank["per_step_ms"]["wall_ms"]) == 5
        assert rank["top_compute"] and rank["top_communication"]
        # the trace it came from is there, compressed, with the steps marked
        with gzip.open(runs[arm] / doc["traces"][rank["rank"]], "rt") as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        assert {f"{walls.STEP}{s}" for s in range(last + 1, last + 6)} <= names
    assert doc["slowest_rank"]["wall_ms"] == max(r["wall_ms"] for r in doc["ranks"])
    assert results["steps"] == last + 5 and results["profile_steps"] == doc["steps"]
    assert results["profile"]["communication_ms"] == doc["slowest_rank"]["communication_ms"]


def test_one_process_has_no_communication_and_profiles_after_autos_window(runs):
    doc, results = profile(runs["ep1"]), json.loads((runs["ep1"] / "results.json").read_text())
    first, last = results["window"]  # the segment contract.window=auto (the default) stopped on, or its last steps
    assert results["window_declared"] == "auto" and doc["window"] == [first, last]
    assert doc["steps"] == [last + 1, last + 5] and results["steps"] == last + 5
    assert results["steady"]["judged"] == [4, last]  # the profiled steps after the window are not judged
    s = doc["slowest_rank"]
    assert s["communication_ms"] == 0 and s["exposed_communication_ms"] == 0
    assert abs(sum(s[k] for k in walls.EXCLUSIVE) - s["wall_ms"]) <= 0.01 * s["wall_ms"]


def test_a_profile_after_the_window_leaves_the_measurement_alone(runs):
    """Same contract as the unprofiled run, and the window's step time within the run-to-run noise of it."""
    profiled, plain = (json.loads((runs[k] / "results.json").read_text()) for k in ("alltoall", "plain"))
    assert profiled["contract_full_hash"] == plain["contract_full_hash"]
    noise = profiled["contract"]["hardware"]["run_to_run_noise"]
    window = [r["step_times_ms"][r["window"][0] - 1:r["window"][1]] for r in (plain, profiled)]  # each one's own
    assert stats.welch(*window, unit="steps", floor=noise).verdict == stats.SAME  # compare's verdict: no difference
    assert plain["profile"] is None and not (runs["plain"] / "profile.json").exists()


def test_a_profile_inside_the_window_is_part_of_the_contract():
    env = {"versions": {}, "env": {}}

    def timing(*overrides):
        cfg = compose_config(*overrides)
        return contract.build(cfg, resolve(cfg), env)["timing"]

    assert timing("profile=window") == timing()  # after the window: nothing measured changes
    declared = ("contract.window=[4,10]", "profile=window")
    assert timing(*declared) == timing("contract.window=[4,10]")
    assert timing(*declared, "profile.steps=[8,9]")["profiled_steps"] == [8, 9]
    # the machine's reference read between the window's steps: work in the loop, so arms that differ are not matched
    assert "reference_every" not in timing() and timing("contract.reference_every=4")["reference_every"] == 4


def _diff(runs, a, b, *extra) -> str:
    out = subprocess.run([sys.executable, "-m", "moe_hydra.compare", "--diff", str(runs[a]), str(runs[b]), *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_diff_names_communication_when_it_moved(runs):
    """One process (no communication) against EP2's all-to-all: communication moved, by what profile.json says. The
    floor is 2 % of the one-process step: gloo's all-to-all is about a tenth of a CPU step and varies from step to
    step, so at 5 % of a slow machine's 740 ms step its interval's low end (+34 ms) fell inside the floor."""
    text = _diff(runs, "ep1", "alltoall", "--noise-floor", "0.02")
    which = next(line for line in text.splitlines() if "which moved" in line)
    assert "communication +" in which.split("unchanged")[0], text
    comm = [statistics.fmean(profile(runs[k])["slowest_rank"]["per_step_ms"]["communication_ms"])
            for k in ("ep1", "alltoall")]
    assert f"communication: moved (0.0 -> {comm[1]:.1f} ms/step" in text


def test_diff_reads_both_dispatchers_walls(runs):
    text = _diff(runs, "alltoall", "allgather")
    means = [statistics.fmean(profile(runs[k])["slowest_rank"]["per_step_ms"]["exposed_communication_ms"])
             for k in ("alltoall", "allgather")]
    assert f"({means[0]:.1f} -> {means[1]:.1f} ms/step" in text
    assert "which moved" in text and "no profile" not in text
    # the same weights and tokens route alike whatever carries them: the routers' imbalance did not move
    assert "router imbalance: steady (worst layer" in text, text


def test_diff_without_profiles_says_how_to_get_them(runs):
    text = _diff(runs, "plain", "alltoall")
    assert "communication: unknown: no profile in" in text and "profile=window" in text
