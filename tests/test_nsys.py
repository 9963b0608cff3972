"""profile.tool=nsys: each rank under ``nsys profile`` with a capture range over the profiled steps.

Nsight Systems is not installed here (nor a GPU): the refusal (H08) is tested for real, the rest with a fake
``nsys`` on PATH that runs the command after its options, which proves the local launcher's subprocess path
end to end on the CPU, and with the Slurm job script generated without submitting it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from moe_hydra.core import env
from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import typed
from moe_hydra.launch import local, slurm
from moe_hydra.launch.compose import compose
from moe_hydra.planning import plan

NSYS_WINDOW = ("profile=window", "profile.tool=nsys")
OPTIONS = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--trace=cuda,nvtx,osrt", "--sample=none",
           "--cuda-memory-usage=false", "--force-overwrite=true"]

# A stand-in for Nsight Systems: records its rank, pid and argv, writes the report nsys would name (%q{RANK}
# expanded), then runs the command that follows its options, as `nsys profile <options> <command>` does (in its
# own process: exec; its stderr to $FAKE_NSYS_ERR when set).
FAKE_NSYS = r"""#!/bin/bash
echo "rank=$RANK pid=$$ $*" >> "$FAKE_NSYS_LOG"
[[ "$1" == profile ]] || exit 64
shift
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in --output=*) out="${1#--output=}"; : > "${out//%q\{RANK\}/$RANK}.nsys-rep" ;; esac
  shift
done
[[ -n "$FAKE_NSYS_ERR" ]] && exec "$@" 2>>"$FAKE_NSYS_ERR"
exec "$@"
"""


def _executable(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _path_without_nsys() -> str:
    """This PATH less every directory that holds an ``nsys``."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not shutil.which("nsys", path=d))


def _compose(*overrides: str, hydra_config: bool = False):
    return compose(overrides, hydra=hydra_config)


# ------------------------------------------------------------------ (a) the refusal where nsys is absent

@pytest.mark.slow
def test_nsys_absent_is_refused_before_anything_starts(tmp_path):
    from tests.conftest import run_cli

    r = run_cli(f"hydra.run.dir={tmp_path}/run", "hardware=h200_sxm", "stage=run", *NSYS_WINDOW, "logger=none",
                cwd=tmp_path, env={"PATH": _path_without_nsys()})
    assert r.returncode == 2, r.stderr[-3000:]
    assert "[H08] profile.tool=nsys needs Nsight Systems (nsys) on PATH" in r.stderr
    assert "profile.tool=nsys" in r.stderr and "fix: profile.tool=torch" in r.stderr
    assert "Traceback" not in r.stderr
    run = tmp_path / "run"
    assert not (run / "ranks").exists() and not (run / "results.json").exists() and not (run / "profile").exists()
    rules = [v["rule"] for v in json.loads((run / "violations.json").read_text())["violations"]]
    assert "H08" in rules  # with this machine's others (no GPU: H03)


def test_machine_check_h08_follows_nsys_on_path(tmp_path, monkeypatch, compose_cfg):
    r = resolve(compose_cfg("hardware=h200_sxm", *NSYS_WINDOW))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    h08 = [v for v in local.machine(r) if v.rule == "H08"]
    assert len(h08) == 1 and dict(h08[0].fields) == {"profile.tool": "nsys"} and h08[0].fix == "profile.tool=torch"
    assert "not on this machine" in h08[0].message

    _executable(tmp_path / "bin", "nsys", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert "H08" not in [v.rule for v in local.machine(r)]


@pytest.mark.parametrize("overrides", [("profile=none",), ("profile=window",),
                                       ("profile=window", "profile.tool=torch")])
def test_no_nsys_needed_without_profile_tool_nsys(tmp_path, monkeypatch, compose_cfg, overrides):
    r = resolve(compose_cfg("hardware=h200_sxm", *overrides))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "H08" not in [v.rule for v in local.machine(r)]
    assert local.rank_wrapper(r.cfg, tmp_path) == []


# ------------------------------------------------------------------ (b) the nsys command

def test_nsys_command_argv(tmp_path):
    assert local.nsys_command(tmp_path) == ["nsys", "profile", *OPTIONS,
                                            f"--output={tmp_path}/profile/nsys.rank%q{{RANK}}"]
    slurm_argv = local.nsys_command(tmp_path / "3", rank_var="SLURM_PROCID")
    assert slurm_argv[-1] == f"--output={tmp_path}/3/profile/nsys.rank%q{{SLURM_PROCID}}"
    assert slurm_argv[:-1] == ["nsys", "profile", *OPTIONS]


def test_rank_wrapper_is_nsys_for_profile_tool_nsys(tmp_path, compose_cfg):
    cfg = compose_cfg("hardware=h200_sxm", *NSYS_WINDOW)
    assert local.uses_nsys(cfg) and local.rank_wrapper(cfg, tmp_path) == local.nsys_command(tmp_path)


# ------------------------------------------------------------------ (c) the local launcher's subprocess path

def _spec(out_dir: Path, *overrides: str) -> dict:
    """The job's spec as moe_hydra.commands.run builds it (``_job_spec``) for a CPU run of ``overrides``."""
    cfg = _compose("logger=none", *overrides)
    obj = OmegaConf.to_object(cfg)
    r = resolve(obj, local.implementation(obj))
    snapshot = env.snapshot()
    p = plan.make_plan(r, [], snapshot)
    p["tracking"] = {"group": p["contract_hash"], "job_type": "run", "swept": []}
    return {"resolved": r, "plan": p, "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
            "out_dir": str(out_dir), "env": snapshot}


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    """A fake ``nsys`` first on PATH; its log of calls."""
    log = tmp_path / "nsys_calls.log"
    _executable(tmp_path / "bin", "nsys", FAKE_NSYS)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    monkeypatch.setenv("WANDB_MODE", "offline")
    return log


@pytest.mark.slow
def test_local_ranks_run_as_programs_under_nsys(tmp_path, fake_nsys):
    out = tmp_path / "run"
    # a declared window: ten steps, whatever this machine's load (contract.window=auto would step until steady)
    spec = _spec(out, "hardware.devices_per_node=2", "expert_mesh=ep2", "contract.window=[4,10]")
    results = local.launch_local(spec, 2, out, wrapper=local.nsys_command(out))
    assert results == json.loads((out / "results.json").read_text())  # rank 0's, read back
    assert results["status"] == "ok" and results["steps"] == 10 and results["world_size"] == 2
    assert results["evidence"]["local_experts_per_rank"] == 4
    calls = sorted(fake_nsys.read_text().splitlines())
    assert [c.split()[0] for c in calls] == ["rank=0", "rank=1"]  # one nsys per rank, RANK set when it starts
    for call in calls:
        argv = call.split()[2:]
        assert argv[:7] == ["profile", *OPTIONS] and argv[7] == f"--output={out}/profile/nsys.rank%q{{RANK}}"
        assert argv[8:] == [sys.executable, "-m", "moe_hydra.job.rank", str(out / "ranks" / "spec.pkl")]
    assert sorted(p.name for p in (out / "profile").iterdir()) == ["nsys.rank0.nsys-rep", "nsys.rank1.nsys-rep"]


@pytest.mark.slow
def test_a_rank_failing_under_nsys_is_job_failed(tmp_path, fake_nsys):
    out = tmp_path / "run"
    with pytest.raises(local.JobFailed) as e:
        local.launch_local(_spec(out, "train.fail_at_step=2"), 1, out, wrapper=local.nsys_command(out))
    assert e.value.rank == 0 and "failing on purpose" in e.value.error
    assert json.loads((out / "results.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_a_signal_to_a_rank_under_nsys_is_recorded_then_job_stopped(tmp_path, fake_nsys, monkeypatch):
    # as Slurm signals every process of a step: the rank itself gets SIGTERM mid-window, records, exits 143
    err = tmp_path / "rank0.err"
    monkeypatch.setenv("FAKE_NSYS_ERR", str(err))
    out = tmp_path / "run"
    spec = _spec(out, "contract.warmup_steps=1", "contract.window=[2,400]")

    def stop_rank_at_step_5():
        deadline = time.monotonic() + 240
        # step 5's metric line (a step time field such as "step    512.3 ms" must not match)
        step5 = re.compile(r"^step\s+5\s+loss", re.M)
        while time.monotonic() < deadline and not (err.exists() and step5.search(err.read_text())):
            time.sleep(0.2)
        os.kill(int(re.search(r"pid=(\d+)", fake_nsys.read_text()).group(1)), signal.SIGTERM)

    stopper = threading.Thread(target=stop_rank_at_step_5, daemon=True)
    stopper.start()
    with pytest.raises(local.JobStopped) as e:
        local.launch_local(spec, 1, out, wrapper=local.nsys_command(out))
    stopper.join()
    assert e.value.signame == "SIGTERM" and e.value.code == 143
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "terminated" and res["signal"] == "SIGTERM" and 5 <= res["steps"] < 400
    assert "moe_hydra: rank 0 stopped by SIGTERM after step" in err.read_text() and "Traceback" not in err.read_text()


@pytest.mark.parametrize("exit_code,signame", [(143, "SIGTERM"), (130, "SIGINT"), (140, "SIGUSR2")])
def test_a_rank_stopped_by_a_signal_is_job_stopped(tmp_path, monkeypatch, exit_code, signame):
    # moe_hydra.job.rank exits 128 + the signal's number once the ranks recorded their steps
    _executable(tmp_path / "bin", "stopped", f"#!/bin/sh\nexit {exit_code}\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "run"
    with pytest.raises(local.JobStopped) as e:
        local.launch_local(_spec(out), 1, out, wrapper=["stopped"])
    assert e.value.signame == signame and e.value.code == exit_code


def test_a_wrapper_that_runs_no_rank_is_job_failed(tmp_path, monkeypatch):
    _executable(tmp_path / "bin", "noop", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "run"
    with pytest.raises(local.JobFailed, match="no usable results from rank 0"):
        local.launch_local(_spec(out), 1, out, wrapper=["noop"])


def test_rank_module_wrong_command_line():
    r = subprocess.run([sys.executable, "-m", "moe_hydra.job.rank"], check=False, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "usage: python -m moe_hydra.job.rank SPEC_FILE" in r.stderr


# ------------------------------------------------------------------ (d) the Slurm job script

def _job_script(tmp_path, monkeypatch, *overrides: str) -> str:
    """The sbatch script the Slurm launcher would submit for one point of ``overrides`` (nothing submitted)."""
    _executable(tmp_path / "fakebin", "srun", "#!/bin/sh\nexit 1\n")  # submitit looks for srun, never runs it
    monkeypatch.setenv("PATH", f"{tmp_path / 'fakebin'}{os.pathsep}{os.environ['PATH']}")
    cfg = _compose("launcher=slurm", f"hydra.sweep.dir={tmp_path}/sweep", *overrides, hydra_config=True)
    with open_dict(cfg.hydra.job):  # as the launcher's _point_config
        cfg.hydra.job.num = 0
    launcher = slurm.SlurmLauncherImpl.__new__(slurm.SlurmLauncherImpl)
    launcher.config = OmegaConf.create({"launcher": {"srun_args": [], "setup": ["module load nsight-systems"],
                                                     "additional_parameters": {}}})
    params = launcher.point_params(cfg, typed(cfg), tmp_path / "sweep" / str(cfg.hydra.sweep.subdir))
    ex = launcher._executor(params)._executor
    return ex._make_submission_file_text(ex._submitit_command_str, "uid")


def test_slurm_tasks_run_under_nsys(tmp_path, monkeypatch):
    text = _job_script(tmp_path, monkeypatch, "hardware=h200_sxm", *NSYS_WINDOW)
    lines = text.splitlines()
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert "nsys profile" in srun and "--capture-range=cudaProfilerApi" in srun and "--capture-range-end=stop" in srun
    point = tmp_path / "sweep" / "0"
    assert f"'--output={point}/profile/nsys.rank%q{{SLURM_PROCID}}'" in srun  # quoted for the shell
    nsys_at, python_at = srun.index("nsys profile"), srun.index(f"{sys.executable} -u -m submitit.core._submit")
    assert srun.index("--kill-on-bad-exit=1") < nsys_at < python_at
    # the node's check comes after launcher.setup (which may load nsys), before srun
    check = next(i for i, line in enumerate(lines) if line.startswith("command -v nsys"))
    assert lines.index("module load nsight-systems") < check < lines.index(srun)
    assert f"mkdir -p {point}/profile" in lines
    assert subprocess.run(["bash", "-n"], check=False, input=text, text=True).returncode == 0


def test_the_node_without_nsys_ends_the_job_with_h08(tmp_path, monkeypatch):
    text = _job_script(tmp_path, monkeypatch, "hardware=h200_sxm", *NSYS_WINDOW)
    check = next(line for line in text.splitlines() if line.startswith("command -v nsys"))
    r = subprocess.run(["/bin/bash", "-c", check], check=False, env={"PATH": str(tmp_path / "empty")}, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "[H08] profile.tool=nsys needs Nsight Systems (nsys) on PATH" in r.stderr


@pytest.mark.parametrize("overrides", [(), ("profile=window",)])
def test_slurm_tasks_without_nsys_run_python_as_before(tmp_path, monkeypatch, overrides):
    text = _job_script(tmp_path, monkeypatch, "hardware=h200_sxm", *overrides)
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert "nsys profile" not in text and "command -v nsys" not in text
    assert srun.endswith(f"{sys.executable} -u -m submitit.core._submit {tmp_path}/sweep/.submitit/%j")
