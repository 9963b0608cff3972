"""Campaigns without a cluster: how points compose, what the job script carries (containers, the environment
preset, requeue), how a point's state is told from its files and Slurm's word, sweep.json old and new, the
environment presets of a run, and the refusals of bad campaign settings. The runs on a real Slurm are
tests/test_campaign.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from moe_hydra.core import env
from moe_hydra.core.schema import register_configs, typed
from moe_hydra.commands import run_command
from moe_hydra.launch import attempts, follow, layout_sweeper, ledger, points, progress, slurm, slurm_jobs
from tests.conftest import compose_config, run_cli


def _loader_and_master(tmp_path: Path, *hydra_overrides: str):
    register_configs()
    slurm.register()
    points.register()
    layout_sweeper.register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://moe_hydra.conf"))
    master = loader.load_configuration("config", overrides=[f"hydra.sweep.dir={tmp_path}/sweep", *hydra_overrides],
                                       run_mode=RunMode.MULTIRUN)
    return loader, master


# ----------------------------------------------------------------------------- composing many points


def test_the_composer_gives_what_hydra_composes(tmp_path):
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "mine.yaml").write_text("# @package _global_\ntrain:\n  micro_batch_size: 2\n")
    loader, master = _loader_and_master(tmp_path, f"hydra.searchpath=[file://{tmp_path}/extra]")
    composer = points.Composer(loader, master)
    cases = [["launcher=slurm", "dispatcher=allgather", "repeat=3"],
             ["launcher=slurm", "dispatcher=allgather", "repeat=4"],
             ["launcher=slurm", "hardware=h100_sxm", "mesh=ep8", "train.seq_length=512",
              "~hardware.env.NVTE_FWD_LAYERNORM_SM_MARGIN", "++hardware.env.NCCL_IB_HCA=mlx5"],
             ["launcher=slurm", "expert_mesh=ep2", "hardware.devices_per_node=2", "experiment=mine"],
             ["launcher=slurm", "+launcher.additional_parameters.exclusive=true", "repeat=1"]]
    for point in cases:
        fast, slow = composer(point), loader.load_sweep_config(master, point)
        assert OmegaConf.to_container(fast) == OmegaConf.to_container(slow), point
        assert OmegaConf.to_container(fast.hydra.overrides.task) == point
    # the first two points select the same groups: composed by Hydra once
    assert len(composer._templates) == len(cases) - 1


def test_the_composer_raises_what_hydra_raises(tmp_path):
    loader, master = _loader_and_master(tmp_path)
    composer = points.Composer(loader, master)
    for point in (["train.micro_batch_size=abc"], ["dispatcher=nope"], ["no_such_key=1"]):
        with pytest.raises(ConfigCompositionException):
            composer(point)


# ----------------------------------------------------------------------------- the job script


def _job_script(tmp_path, monkeypatch, *overrides: str) -> str:
    """The sbatch script the launcher would submit for one point (nothing submitted; a fake srun is on PATH)."""
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    loader, master = _loader_and_master(tmp_path, "launcher=slurm")
    cfg = points.Composer(loader, master)(["launcher=slurm", *overrides])
    with open_dict(cfg.hydra.job):
        cfg.hydra.job.num = 0
    launcher = slurm.SlurmLauncherImpl.__new__(slurm.SlurmLauncherImpl)
    launcher.config = cfg
    job_cfg = typed(cfg)
    params = launcher.point_params(cfg, job_cfg, tmp_path / "sweep" / "0", tmp_path / "sweep")
    ex = launcher._executor(params)._executor
    return ex._make_submission_file_text(ex._submitit_command_str, "uid")


def test_the_job_script_carries_the_container_the_environment_and_requeue(tmp_path, monkeypatch):
    text = _job_script(tmp_path, monkeypatch, "hardware=h100_sxm", "hardware.devices_per_node=1",
                       "launcher.container_image=nvcr.io/nvidia/pytorch:25.09-py3",
                       "launcher.container_mounts=[/lustre:/lustre,/home/me/data:/data:ro]",
                       "launcher.container_workdir=/workspace", "launcher.container_env=[NCCL_IB_HCA]",
                       "launcher.container_mount_home=false", "launcher.container_writable=true",
                       "launcher.python=python", "launcher.max_num_timeout=2")
    lines = text.splitlines()
    (srun,) = [line for line in lines if line.startswith("srun ")]
    sweep_dir = (tmp_path / "sweep").resolve()
    for arg in ("--container-image=nvcr.io/nvidia/pytorch:25.09-py3", "--container-workdir=/workspace",
                f"--container-mounts=/lustre:/lustre,/home/me/data:/data:ro,{sweep_dir}:{sweep_dir}",
                "--container-env=NCCL_IB_HCA", "--no-container-mount-home", "--container-writable"):
        assert arg in srun, arg
    assert srun.index("--kill-on-bad-exit=1") < srun.index("--container-image") < srun.index("python -u -m submitit")
    assert "#SBATCH --requeue" in lines
    # the H100 preset, exported for every task before srun
    exports = [line for line in lines if line.startswith("export ") and "SUBMITIT" not in line]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in exports and "export NCCL_NVLS_ENABLE=0" in exports
    assert all(lines.index(e) < lines.index(srun) for e in exports)
    assert subprocess.run(["bash", "-n"], check=False, input=text, text=True).returncode == 0


def test_no_container_and_a_site_that_says_no_requeue(tmp_path, monkeypatch):
    text = _job_script(tmp_path, monkeypatch, "+launcher.additional_parameters.no-requeue=true")
    assert "--container" not in text and "#SBATCH --no-requeue" in text and "#SBATCH --requeue" not in text


def test_the_sweep_directory_is_not_mounted_twice(tmp_path):
    lc = compose_config("launcher=slurm", "launcher.container_image=img", f"launcher.container_mounts=[{tmp_path}:/x]")
    args = slurm.container_args(lc.launcher, tmp_path / "sweep")
    assert args == ["--container-image=img", f"--container-mounts={tmp_path}:/x"]
    assert slurm.container_args(compose_config("launcher=slurm").launcher, tmp_path) == []


def test_bad_launcher_settings_are_refused_naming_the_override():
    problems = slurm.launcher_violations(compose_config("launcher=slurm", "launcher.container_mounts=[/data]",
                                                        "+hardware.env.BAD-KEY=1"))
    text = "\n".join(v.render() for v in problems)
    assert {v.rule for v in problems} == {"S03"}
    assert "launcher.container_mounts is set without launcher.container_image" in text
    assert "'/data' is not SRC:DST[:FLAGS]" in text and "'BAD-KEY' is not an environment variable name" in text


def test_hybridep_ranks_per_domain_are_checked_against_the_layout():
    cfg = compose_config("stage=plan", "hardware=gb200_nvl72", "hardware.nodes=8", "dispatcher=hybridep",
                         "expert_mesh=ep32")
    from moe_hydra.core.resolved import resolve

    (note,) = slurm.env_notes(cfg, resolve(cfg).layout)
    assert "hardware.env.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=32" in note


# ----------------------------------------------------------------------------- the environment presets


def test_presets_set_recipe_environment_per_gpu_kind():
    h100, gb200 = compose_config("hardware=h100_sxm").hardware.env, compose_config("hardware=gb200_nvl72").hardware.env
    assert h100["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and gb200["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert gb200["USE_MNNVL"] == "1" and gb200["NVLINK_DOMAIN_SIZE"] == "72" and h100["NVLINK_DOMAIN_SIZE"] == "8"
    assert compose_config().hardware.env == {}
    assert env.redact({"NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "128", "HF_TOKEN": "x"}) == {
        "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "128", "HF_TOKEN": env.REDACTED}


def test_the_preset_callback_sets_and_restores(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    cb = slurm.PresetEnvironment()
    cfg = OmegaConf.create({"hardware": {"env": {"NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}}})
    cb.on_job_start(config=cfg, task_function=None)
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    cb.on_job_end(config=cfg, job_return=None)
    assert os.environ["NCCL_NVLS_ENABLE"] == "1" and "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ


@pytest.mark.slow
def test_a_run_records_its_preset_in_env_json_and_the_contract(tmp_path):
    r = run_cli(f"hydra.run.dir={tmp_path}/run", "stage=plan", "hardware=h100_sxm", "hardware.env.NCCL_NVLS_ENABLE=1",
                "~hardware.env.NVTE_BWD_LAYERNORM_SM_MARGIN", "+hardware.env.NCCL_IB_HCA=mlx5", cwd=tmp_path,
                env={"NCCL_NVLS_ENABLE": "7"})
    assert r.returncode == 0, r.stderr[-2000:]
    recorded = json.loads((tmp_path / "run" / "env.json").read_text())["env"]
    contract = json.loads((tmp_path / "run" / "plan.json").read_text())["contract"]
    assert recorded["NCCL_NVLS_ENABLE"] == "1" and recorded["NCCL_IB_HCA"] == "mlx5"  # the preset wins over the shell
    assert recorded["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and "NVTE_BWD_LAYERNORM_SM_MARGIN" not in recorded
    assert recorded["NUM_OF_TOKENS_PER_CHUNK_COMBINE_API"] == "64"
    assert contract["hardware"]["env"]["NCCL_NVLS_ENABLE"] == "1" and contract["launcher"]["env"] == recorded


@pytest.mark.slow
def test_bad_campaign_settings_exit_2_with_nothing_queued(tmp_path):
    detach = run_cli(f"hydra.sweep.dir={tmp_path}/a", "launcher.detach=true", "repeat=0,1", "-m", cwd=tmp_path)
    assert detach.returncode == 2 and "launcher.detach=true" in detach.stderr and "launcher=slurm" in detach.stderr
    assert not list((tmp_path / "a").glob("*/plan.json"))
    single = run_cli(f"hydra.run.dir={tmp_path}/s", "launcher.detach=true", cwd=tmp_path)
    assert single.returncode == 2 and "launcher=slurm" in single.stderr and not (tmp_path / "s" / "plan.json").exists()
    bad = run_cli(f"hydra.sweep.dir={tmp_path}/b", "launcher=slurm", "launcher.max_num_timeout=-1", "-m", cwd=tmp_path)
    assert bad.returncode == 2 and "launcher.max_num_timeout" in bad.stdout + bad.stderr
    entry = json.loads((tmp_path / "b" / "sweep.json").read_text())["points"][0]
    assert entry["state"] == "INVALID" and entry["slurm_job_id"] is None
    typo = run_cli(f"hydra.sweep.dir={tmp_path}/c", "launcher=slurm", "launcher.detach=maybe", "-m", cwd=tmp_path)
    assert typo.returncode == 2 and "launcher.detach" in typo.stderr and not (tmp_path / "c" / "sweep.json").exists()


# ----------------------------------------------------------------------------- a point's state


class _Job:
    """What :func:`moe_hydra.launch.follow.settle` reads of submitit's job object."""

    def __init__(self, folder: Path, job_id: str):
        from submitit.core.utils import JobPaths

        self.paths = JobPaths(folder, job_id=job_id, task_id=0)
        self.paths.folder.mkdir(parents=True, exist_ok=True)


def _results(status="ok", steps=10, **extra):
    from tests.test_results import valid

    return valid(steps, status=status, **extra) if status != "ok" else valid(steps, **extra)


def _point(tmp_path, num=0, state="PENDING") -> tuple[ledger.Point, _Job]:
    d = tmp_path / str(num)
    d.mkdir(parents=True, exist_ok=True)
    p = ledger.Point(num=num, overrides=[f"repeat={num}"], dir=str(d), state=state, slurm_job_id=f"7_{num}",
                    submitit_folder=str(tmp_path / ".submitit" / "%j"))
    return p, _Job(tmp_path / ".submitit" / "%j", f"7_{num}")


def test_states_come_from_slurm_and_the_files(tmp_path):
    from submitit.core.utils import cloudpickle_dump

    p, job = _point(tmp_path)
    follow.settle(p, {"State": "PENDING"}, job)
    assert p.state == "PENDING"
    job.paths.stderr.write_text("step    1  loss 7.0\nstep    2  loss 6.9\n")
    follow.settle(p, {"State": "RUNNING", "Elapsed": "00:01:12", "NodeList": "localhost"}, job)
    assert (p.state, p.elapsed_s, p.last_step, p.nodes) == ("RUNNING", 72, 2, "localhost")
    assert progress.progress(p) == "1:12 · step 2"
    # an attempt that ended, and Slurm holds the job again: requeued
    Path(p.dir, "attempts.json").write_text(json.dumps({"attempts": [{"attempt": 1, "ended_at": "t"}]}))
    follow.settle(p, {"State": "PENDING"}, job)
    assert p.state == "REQUEUED"
    follow.settle(p, {"State": "REQUEUED"}, job)
    assert p.state == "REQUEUED"
    # Slurm cancelled it while it ran: its results say how far it got; Slurm's word stays
    Path(p.dir, "results.json").write_text(json.dumps(_results("terminated", 4, signal="SIGTERM", window=[4, 40])))
    follow.settle(p, {"State": "CANCELLED by 0", "ExitCode": "0:15"}, job)
    assert p.state == "CANCELLED" and p.error.startswith("stopped by SIGTERM after 4 steps")
    # a node lost without a word from the run
    q, qjob = _point(tmp_path, 1, "RUNNING")
    follow.settle(q, {"State": "NODE_FAIL"}, qjob)
    assert q.state == "NODE_FAIL" and "Slurm: NODE_FAIL" in q.error
    # submitit did not requeue a run at its time limit: TIMEOUT
    r, rjob = _point(tmp_path, 2, "RUNNING")
    Path(r.dir, "results.json").write_text(json.dumps(_results("terminated", 6, signal="SIGUSR2", window=[4, 40])))
    cloudpickle_dump(("error", "Traceback...\nsubmitit.core.utils.UncompletedJobError: Job not requeued because: "
                               "timed-out too many times."), rjob.paths.result_pickle)
    follow.settle(r, {"State": "FAILED"}, rjob)
    assert r.state == "TIMEOUT" and "stopped by SIGUSR2 after 6 steps" in r.error and "timed-out" in r.error
    # a complete results.json is COMPLETED, whatever the accounting says yet
    s, sjob = _point(tmp_path, 3, "RUNNING")
    Path(s.dir, "results.json").write_text(json.dumps(_results()))
    follow.settle(s, {"State": "RUNNING"}, sjob)
    assert s.state == "COMPLETED" and s.step_time_ms and s.error is None
    # ... unless Slurm requeued the job after that attempt ended (it requeues a finished job too): a new attempt
    cloudpickle_dump(("success", None), sjob.paths.result_pickle)
    follow.settle(s, {"State": "REQUEUED"}, sjob, checked_at=time.time() + 1)
    assert s.state == "REQUEUED"
    follow.settle(s, {"State": "RUNNING", "Start": "2999-01-01T00:00:00"}, sjob)
    assert s.state == "RUNNING"
    follow.settle(s, {"State": "PENDING"}, sjob, checked_at=time.time() - 3600)  # Slurm's word is older than the file
    assert s.state == "COMPLETED"


def test_without_slurm_recorded_endings_stand(tmp_path):
    p, job = _point(tmp_path, 0, "CANCELLED")
    follow.settle(p, {}, job)
    assert p.state == "CANCELLED"
    q, qjob = _point(tmp_path, 1, "PENDING")
    follow.settle(q, {}, qjob)
    assert q.state == "PENDING"


def test_sweep_json_of_either_version_reads(tmp_path, capsys):
    old = {"points": [{"num": 0, "overrides": ["repeat=0"], "dir": str(tmp_path / "0"), "state": "CANCELLED",
                       "slurm_job_id": None, "step_time_ms": None, "tokens_per_s_per_gpu": None, "error": "x",
                       "logs": [], "from_the_future": 1}]}
    (tmp_path / "sweep.json").write_text(json.dumps(old))
    (p,) = follow.status(tmp_path, slurm=False)
    assert p.state == "CANCELLED" and p.attempts is None
    written = json.loads((tmp_path / "sweep.json").read_text())
    assert written["sweep_version"] == 2 and "from_the_future" not in written["points"][0]
    assert follow.exit_code([p]) == 1 and run_command("sweep", ["status", str(tmp_path)]) == 1


def test_still_out_and_exit_codes(tmp_path):
    points_ = [ledger.Point(num=i, overrides=[f"repeat={i}"], dir=str(tmp_path / str(i)), state=s)
               for i, s in enumerate(["COMPLETED", "PENDING", "RUNNING", "INVALID"])]
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "results.json").write_text(json.dumps(_results()))
    ledger.write_sweep(tmp_path, points_)
    note = follow.still_out(tmp_path)
    assert note.startswith(f"campaign {tmp_path}: 2 of 4 points still out (1 PENDING, 1 RUNNING)")
    assert follow.still_out(tmp_path / "nothing") is None
    assert follow.exit_code([points_[0]]) == 0 and follow.exit_code([points_[0], points_[3]]) == 2


def test_attempts_are_recorded_by_rank_0(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    attempts.attempt_started(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(_results("terminated", 5, signal="SIGUSR2", window=[4, 40])))
    attempts.attempt_ended(tmp_path, "stopped by SIGUSR2", requeued=True)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    attempts.attempt_started(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    attempts.attempt_ended(tmp_path, "completed", requeued=False)
    attempts.record_attempts_in_results(tmp_path)
    recorded = json.loads((tmp_path / "results.json").read_text())["attempts"]
    assert [(a["attempt"], a["restart_count"], a["steps"], a["requeued"]) for a in recorded] == [
        (1, 0, 5, True), (2, 1, 10, False)]
    assert recorded[0]["outcome"].startswith("stopped by SIGUSR2 after 5 steps")
    assert recorded[1]["outcome"] == "completed" and recorded[1]["slurm_job_id"] == "41"


def test_the_command_without_a_sweep_is_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "moe_hydra.sweep", "wait", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "no sweep.json" in r.stderr


def test_slurmctlds_word_on_a_job_still_out_is_newer_than_saccts(tmp_path, monkeypatch):
    """sacct reads the accounting database, which slurmctld fills asynchronously: a point training for a minute
    can still be PENDING there. squeue's word (slurmctld's) decides for the jobs sacct calls out; a job squeue no
    longer lists keeps sacct's word, and a job sacct says ended is not asked about. squeue is asked when sacct is
    (at the watcher's pace), not at every look at the files."""
    said = {"7_0": {"State": "PENDING"}, "7_1": {"State": "PENDING"}, "7_2": {"State": "COMPLETED"}}
    asked = []

    class Watcher:
        _last_status_check = 0

        def update(self):
            self._last_status_check += 1

        def update_if_long_enough(self, mode):
            pass  # not long enough: sacct is not asked, so neither is squeue

        def get_info(self, job_id, mode):
            return said[job_id]

    class Job(_Job):
        watcher = Watcher()

        def __init__(self, folder, job_id):
            super().__init__(folder, job_id)
            self.job_id = job_id

    monkeypatch.setattr(slurm_jobs, "job_class", lambda: Job)
    monkeypatch.setattr(slurm_jobs, "slurm_job", lambda p: Job(tmp_path / ".submitit" / "%j", p.slurm_job_id))
    monkeypatch.setattr(slurm_jobs, "queued", lambda ids: asked.extend(ids) or {"7_0": {"State": "RUNNING",
                                                                                  "NodeList": "localhost2"}})
    pts = [_point(tmp_path, num)[0] for num in range(3)]
    follow.refresh(pts)
    assert sorted(asked) == ["7_0", "7_1"]
    assert [p.state for p in pts[:2]] == ["RUNNING", "PENDING"] and pts[0].nodes == "localhost2"
    assert pts[2].state == "FAILED"  # sacct's COMPLETED without results.json or pickle
    follow.refresh(pts, force=False)  # wait's look at the files between sacct's polls: squeue's answer kept
    assert sorted(asked) == ["7_0", "7_1"] and pts[0].state == "RUNNING"


def test_wait_ends_when_slurm_says_the_settled_points_jobs_ended(tmp_path, monkeypatch):
    """A point whose results.json says it completed may still hold its job a moment: wait asks Slurm of that job
    itself (refresh asks only of unsettled points) and ends as soon as Slurm says it ended, not at LINGER_S."""
    said = {"7_0": {"State": "RUNNING"}}
    sleeps = []

    class Watcher:
        _last_status_check = 1.0
        updates = 0

        def clear(self):
            pass

        def update(self):
            Watcher.updates += 1
            if Watcher.updates >= 3:  # Slurm's accounting catches up with the job's end
                said["7_0"] = {"State": "COMPLETED"}

        def update_if_long_enough(self, mode):
            pass

        def get_info(self, job_id, mode):
            return said[job_id]

    class Job(_Job):
        watcher = Watcher()

        def __init__(self, folder, job_id):
            super().__init__(folder, job_id)
            self.job_id = job_id

    monkeypatch.setattr(slurm_jobs, "job_class", lambda: Job)
    monkeypatch.setattr(slurm_jobs, "slurm_job", lambda p: Job(tmp_path / ".submitit" / "%j", p.slurm_job_id))
    monkeypatch.setattr(slurm_jobs, "queued", lambda ids: {})
    monkeypatch.setattr(follow, "_slurm_here", lambda: True)
    monkeypatch.setattr(follow.time, "sleep", sleeps.append)
    p, _ = _point(tmp_path, 0, state="COMPLETED")
    (Path(p.dir) / "results.json").write_text(json.dumps(_results()))
    ledger.write_sweep(tmp_path, [p])
    (done,) = follow.wait(tmp_path)
    assert done.state == "COMPLETED" and said["7_0"]["State"] == "COMPLETED"
    assert sleeps == [follow.LINGER_TICK_S] * Watcher.updates  # a look a tick, until Slurm said it ended


def test_every_task_of_a_job_rendezvous_on_one_port_outside_the_ephemeral_range(monkeypatch):
    """A job's tasks derive one MASTER_PORT from the job id, below Linux's ephemeral range (an outgoing connection
    on a busy node held submitit's 33263: EADDRINUSE at the rendezvous); an array's points get their own; a port
    the job's environment sets stays."""
    ids = [f"{job}_{index}" for job in range(560, 600) for index in range(4)] + ["123456"]
    ports = [slurm.rendezvous_port(i) for i in ids]
    assert all(20000 <= p < 32768 for p in ports) and len(set(ports)) == len(ids)
    assert slurm.rendezvous_port("573_1") == slurm.rendezvous_port("573_1")
    task = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "574", "SLURM_ARRAY_JOB_ID": "573",
            "SLURM_ARRAY_TASK_ID": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
            "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost"}
    # what task_environment exports, set here first so that monkeypatch takes it back after the test
    exported = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    for name, value in {**task, **dict.fromkeys(exported, "")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT")
    slurm.task_environment()
    assert os.environ["MASTER_PORT"] == str(slurm.rendezvous_port("573_1"))
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]) == ("1", "2", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    slurm.task_environment()
    assert os.environ["MASTER_PORT"] == "29500"
