"""moe-hydra tune: the loop's parts (merging a change into an arm, the retune table, the walls, arms written as
experiment options), its refusals before anything runs, and the loop itself on tiny_moe from a poor start, killed
in the middle of a retune A/B and resumed by the same command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_hydra.analysis import figures
from moe_hydra.commands import run_command
from moe_hydra.core import overrides
from moe_hydra.launch import compose, experiments, tune
from moe_hydra.planning import retune

POOR = ["hardware.devices_per_node=2", "logger=none", "recompute=full", "train.micro_batch_size=1",
        "train.global_batch_size=8"]


def test_merge_replaces_the_key_and_a_groups_dotted_overrides():
    arm = ["recompute=selective", "recompute.recompute_modules=[core_attn]", "train.micro_batch_size=1", "seed=3"]
    assert overrides.merge(arm, ["recompute=none"]) == ["train.micro_batch_size=1", "seed=3", "recompute=none"]
    assert overrides.merge(arm, ["train.micro_batch_size=2"])[-1] == "train.micro_batch_size=2"
    assert tune.without_layout(["mesh=ep8", "parallel.expert_model_parallel_size=8", "seed=1"]) == ["seed=1"]


def test_the_retune_table_proposes_what_applies_here():
    cpu = compose.compose_typed(POOR)
    compute = [c.name for c, _ in retune.candidates(cpu, "compute")]
    assert compute[:2] == ["recompute off", "selective recompute"] and "lower precision (FP8)" not in compute
    host = dict((c.name, o) for c, o in retune.candidates(cpu, "host"))
    # the largest micro batch GBS 8 over DP 2 allows first, then twice the start's; no CUDA graphs on a CPU
    assert host == {"fewest micro-batches": ["train.micro_batch_size=4"],
                    "fewer, larger micro-batches": ["train.micro_batch_size=2"]}
    piped = compose.compose_typed([*POOR, "parallel.pipeline_model_parallel_size=2"])  # DP 1: at least 2 in flight
    assert dict((c.name, o) for c, o in retune.candidates(piped, "host"))["fewest micro-batches"] == [
        "train.micro_batch_size=4"]
    assert not retune.candidates(compose.compose_typed([*POOR[:3], "train.micro_batch_size=4",
                                                        "train.global_batch_size=8"]), "host")
    gpu = compose.compose_typed(["hardware=h100_sxm", "expert_mesh=ep8"])
    assert "lower precision (FP8)" not in [c.name for c, _ in retune.candidates(gpu, "compute")]
    assert "lower precision (FP8)" in [c.name for c, _ in retune.candidates(gpu, "compute", allow=["precision"])]
    assert any(c.name == "CUDA graphs" for c, _ in retune.candidates(gpu, "host"))


def test_walls_are_read_from_the_slowest_rank_and_memory_from_the_margin():
    prof = {"slowest_rank": {"wall_ms": 100.0, "compute_ms": 50.0, "exposed_communication_ms": 30.0,
                             "host_ms": 15.0, "idle_ms": 5.0, "memcpy_ms": 0.0}}
    walls = retune.walls_of(prof)
    assert list(walls) == ["compute", "communication", "host", "memory"] and walls["host"] == pytest.approx(0.2)
    assert next(iter(retune.walls_of(prof, fits_margin=0.03))) == "memory"


def test_an_arm_written_as_an_experiment_composes_as_its_overrides(tmp_path):
    arm = ["hardware.devices_per_node=2", "recompute=selective", "train.micro_batch_size=2",
           "parallel.expert_model_parallel_size=2"]
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "tune_a.yaml").write_text(experiments.experiment_yaml(arm, "arm A"))
    via = compose.compose([f"hydra.searchpath=[file://{tmp_path}]", "experiment=tune_a"])
    direct = compose.compose(arm)
    for key in ("recompute", "train", "parallel", "hardware"):
        assert via[key] == direct[key], key


@pytest.mark.parametrize("bad, said", [(["tune.allow=[precision,speed]"], "tune.allow names speed"),
                                       (["tune.budget_gpu_hours=0"], "tune.budget_gpu_hours"),
                                       (["tune.max_trials=0"], "tune.max_trials"),
                                       (["recompute=fastest"], "recompute"),
                                       (["hardware=h100_sxm"], "H03"), (["hardware.nodes=2"], "H01")])
def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys, bad, said):
    d = tmp_path / "tune"
    assert run_command("tune", [*POOR, *bad, f"hydra.sweep.dir={d}"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert not d.exists() or not any(p.name != tune.LOCK for p in d.iterdir())  # nothing ran


def test_a_directory_that_holds_another_tune_is_refused(tmp_path, capsys):
    d = tmp_path / "tune"
    d.mkdir()
    (d / tune.TUNE_FILE).write_text(json.dumps({"tune_version": 1, "start": {"overrides": ["model=qwen3_30b_a3b"]},
                                                "stages": [], "experiments": {}}))
    assert run_command("tune", [*POOR, f"hydra.sweep.dir={d}"]) == 2
    assert "holds another tune" in capsys.readouterr().err
    assert json.loads((d / tune.TUNE_FILE).read_text())["start"]["overrides"] == ["model=qwen3_30b_a3b"]


def test_later_ab_tests_pool_the_noise_of_the_ended_ones(tmp_path):
    """Each A/B starts from the run-to-run noise the loop's ended A/Bs measured (their arms pooled as configs, each
    scaled to one mean): written once per A/B, none before two degrees of freedom, none over the user's own."""
    import numpy as np

    from moe_hydra.analysis import noise as noises
    from tests.test_compare import fake_run

    journal: dict = {"experiments": {}}
    driver = experiments.Driver(tmp_path, journal, lambda: None, 2)
    assert driver.pooled_noise("retune-01", []) == []
    rng = np.random.default_rng(3)
    for name, (dispatcher, mean) in {"retune-01": ("alltoall", 100.0), "retune-02": ("allgather", 300.0)}.items():
        for i in range(4):  # a 10 % run-to-run noise at either speed
            shift = rng.normal(0.0, 0.10)
            fake_run(tmp_path / name, str(i), list(mean * (1 + shift + rng.normal(0.0, 0.02, 12))),
                     dispatcher=dispatcher)
        journal["experiments"][name] = {"name": name, "kind": "ab", "status": "done", "dir": str(tmp_path / name)}
    journal["experiments"]["profile-01"] = {"name": "profile-01", "kind": "run", "status": "done",
                                            "dir": str(tmp_path / "nowhere")}
    pooled = driver.pooled_noise("retune-03", ["logger=none"])
    path = Path(pooled[0].split("=", 1)[1])
    assert pooled[0].startswith("compare.noise_file=") and path == tmp_path / "noise" / "retune-03.json"
    rec = noises.load(path)
    assert rec["configs"] == 2 and rec["runs"] == 8 and rec["scaled"]
    alone = [noises.measure([g], [])[1]["run_to_run_noise"] for g in _groups(tmp_path)]
    assert min(alone) * 0.8 <= rec["run_to_run_noise"] <= max(alone) * 1.2, (alone, rec["run_to_run_noise"])
    mtime = path.stat().st_mtime_ns
    assert driver.pooled_noise("retune-03", []) == pooled and path.stat().st_mtime_ns == mtime  # read again
    assert driver.pooled_noise("retune-04", ["compare.noise_file=/site/noise.json"]) == []


def _groups(root: Path) -> list:
    from moe_hydra.analysis.runs import load

    runs = load([root / "retune-01", root / "retune-02"], lambda m: None).runs
    return [[r for r in runs if r.path.parent.name == name] for name in ("retune-01", "retune-02")]


def test_the_journal_counts_gpu_hours_per_stage_and_the_live_line_reads_it():
    journal = {"experiments": {"fit": {"gpu_hours": 0.01}, "scale": {"gpu_hours": 0.1},
                               "profile-00": {"gpu_hours": 0.02}, "retune-01": {"gpu_hours": 0.2, "result":
                               {"verdict": "faster"}}, "profile-01": {"gpu_hours": 0.02},
                               "retune-02": {"gpu_hours": 0.3, "result": {"verdict": "undecided"}},
                               "retune-03": {"gpu_hours": 0.05, "status": "started"}, "verdict": {"gpu_hours": 0.4}}}
    assert tune.by_stage(journal["experiments"]) == {"fit": 0.01, "scale": 0.1, "profile": 0.02, "retune": 0.57,
                                                     "validate": 0.4}
    line = tune.progress_line(journal, "retune-03", 16, 8)
    assert "retune: retune-03" in line and "A/Bs 2 of at most 16 (1 faster, 1 undecided)" in line
    assert "1.100 of 8 GPU-h" in line


def test_a_tune_logs_to_one_wandb_group(tmp_path):
    t = tune.Tune([*POOR[:1], "logger=wandb", f"hydra.sweep.dir={tmp_path / 'q3'}"])
    t.lock.close()
    assert [o for o in t.how if o.startswith("logger.group=")] == [f"logger.group=tune-{tmp_path.name}-q3"]
    t = tune.Tune([*POOR[:1], "logger=wandb", "logger.group=mine", f"hydra.sweep.dir={tmp_path / 'q4'}"])
    t.lock.close()
    assert [o for o in t.how if o.startswith("logger.group")] == ["logger.group=mine"]


def _tune(d: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "moe_hydra.tune", *POOR, "tune.max_trials=2", "tune.max_repeats=4",
                             "tune.screen_top_k=2", "contract.steady_steps=5", f"hydra.sweep.dir={d}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "WANDB_MODE": "offline"})


@pytest.mark.slow
@pytest.mark.serial  # its verdicts judge measured step times: another test's load would move them
def test_tune_from_a_poor_start_ends_faster_and_resumes_after_a_kill(tmp_path):
    """The loop on tiny_moe, 2 processes, from full recompute and micro-batch 1 at GBS 8: killed once the first
    retune A/B has a complete run, then the same command again: that run is kept (not measured again), the loop
    ends with every stage's evidence, a winner a verdict calls faster than the start, tune.md and best/."""
    d = tmp_path / "tune"
    proc = _tune(d)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        done = list((d / "retune-01").glob("*/results.json"))
        if done:
            break
        time.sleep(1)
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in out, out[-3000:]
    # the runs that completed before the kill (the one under way when it came records "terminated": measured again)
    before = {p: p.stat().st_mtime_ns for p in (d / "retune-01").glob("*/results.json")
              if json.loads(p.read_text())["status"] == "ok"}
    assert before
    journal = json.loads((d / tune.TUNE_FILE).read_text())
    assert journal["status"] == "running" and journal["experiments"]["retune-01"]["status"] == "started"
    finished = {n for n, e in journal["experiments"].items() if e["status"] == "done"}

    proc = _tune(d)
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-4000:]
    journal = json.loads((d / tune.TUNE_FILE).read_text())
    assert journal["status"] == "done" and {s["stage"] for s in journal["stages"]} >= set(tune.STAGES)
    for path, mtime in before.items():  # the runs measured before the kill were kept, not measured again
        assert path.stat().st_mtime_ns == mtime, path
    assert all(journal["experiments"][n]["status"] == "done" for n in finished)
    winner = journal["winner"]
    assert winner["verdict"] == "faster" and winner["step_time_ms"] < journal["start"]["step_time_ms"], winner
    retuned = next(s for s in journal["stages"] if s["stage"] == "retune")
    assert retuned["trials"] and retuned["profiles"][0]["dominant"] in retune.WALLS
    assert (d / "tune.md").read_text().count("## ") >= 6 and (d / "tune.png").stat().st_size > 1000
    assert "![tune](tune.png)" in (d / "tune.md").read_text()  # the report embeds its figure
    drawn = figures.drawn(d / "tune.png")["tune"]  # the start, then each accepted change, as the journal has them
    accepted = [t["step_time_ms"][1] for t in retuned["trials"] if t["outcome"] == "accepted"]
    assert drawn["steps"][0]["step_ms"] == journal["start"]["step_time_ms"]
    assert [s["step_ms"] for s in drawn["steps"][len(drawn["steps"]) - len(accepted):]] == accepted
    assert drawn["walls"]["first"] == retuned["profiles"][0]["walls"]
    assert set(journal["gpu_hours_by_stage"]) >= {"fit", "scale", "profile", "retune", "validate"}
    assert {p.name for p in (d / "best").iterdir()} >= {"megatron-lm.sh", "bridge.txt", "overrides.txt",
                                                        "baseline.json"}
