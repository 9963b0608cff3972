"""The commands users type, end to end in a subprocess: plans, errors, sweeps, help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow


def test_help_lists_groups_and_options(cli):
    r = cli("--help")
    assert r.returncode == 0
    for group in ("model", "hardware", "precision", "attention_mesh", "expert_mesh", "mesh", "recompute", "offload",
                  "dispatcher", "routing", "launcher", "logger", "experiment"):
        assert f"{group}:" in r.stdout
    assert "qwen3_30b_a3b" in r.stdout and "dsv3_h100_1024" in r.stdout


def test_plan_writes_the_layout(cli, tmp_path):
    r = cli("stage=plan", "model=qwen3_30b_a3b", "hardware=h100_sxm", "hardware.nodes=2", "expert_mesh=ep16")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["world_size"] == 16
    p = plan["parallel"]
    assert (p["expert_model_parallel_size"], p["expert_data_parallel_size"], p["data_parallel_size"]) == (16, 1, 16)
    assert plan["experts_per_rank"] == 8 and round(plan["flops_per_token"] / 1e9, 1) == 23.0
    for key in ("params_total", "params_active", "params_per_rank", "label", "min_gpus"):
        assert key in plan
    assert plan["label"] == "benchmark-only" and "mock data" in plan["label_reasons"][0]
    assert "expert mesh" in r.stdout and "ETP 1 x EP 16 x EDP 1" in r.stdout


@pytest.mark.parametrize("spelling", ["+mesh=dsv3_h100_1024", "mesh=dsv3_h100_1024"])
def test_reference_layout_plans_with_or_without_plus(cli, tmp_path, spelling):
    r = cli("stage=plan", "model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128", spelling)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["world_size"] == 1024 and plan["parallel"]["expert_data_parallel_size"] == 2


def test_invalid_layout_is_one_clear_message(cli, tmp_path):
    r = cli("stage=plan", "model=mixtral_8x7b", "hardware=h100_sxm", "hardware.nodes=2", "expert_mesh=ep16")
    assert r.returncode == 2
    assert "Traceback" not in r.stdout + r.stderr
    assert "8 experts do not split over expert-parallel size 16" in r.stderr
    assert "fix: parallel.expert_model_parallel_size=<one of 1, 2, 4, 8>" in r.stderr
    assert not (tmp_path / "run" / "plan.json").exists()
    assert json.loads((tmp_path / "run" / "violations.json").read_text())["violations"][0]["rule"] == "L11"


def test_multirun_skips_invalid_points_and_runs_the_rest(cli, tmp_path):
    r = cli("stage=plan", "hardware=h100_sxm", "+mesh=ep8", "dispatcher=deepep,alltoall", "model=qwen3_30b_a3b",
            "parallel.expert_model_parallel_size=8,3", "-m")
    assert r.returncode == 2  # some points were invalid
    plans = sorted((tmp_path / "multi").glob("*/plan.json"))
    invalid = sorted((tmp_path / "multi").glob("*/violations.json"))
    assert len(plans) == 2 and len(invalid) == 2
    assert "2 of 4 points did not complete" in r.stderr and "Traceback" not in r.stderr
    assert {json.loads(p.read_text())["parallel"]["expert_model_parallel_size"] for p in plans} == {8}


def test_valid_multirun_exits_zero(cli, tmp_path):
    r = cli("stage=plan", "dispatcher=alltoall,allgather", "-m")
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "multi").glob("*/plan.json"))) == 2


@pytest.mark.parametrize("args,expected", [
    (["model.num_layerz=3"], "Did you mean 'model.num_layers'"),
    (["model=qwen3_30b"], "Did you mean model=qwen3_30b_a3b"),
    (["expert_mesh=ep12"], "Options: ep1, ep16"),
    (["parallel.tp=2"], "unknown key 'parallel.tp'"),
])
def test_typos_get_a_suggestion(cli, args, expected):
    r = cli("stage=plan", *args)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr


def test_wrong_type_fails_without_traceback(cli):
    r = cli("stage=plan", "hardware.nodes=two")
    assert r.returncode == 2 and "hardware.nodes" in r.stderr and "Traceback" not in r.stderr


def test_planning_imports_no_torch_or_megatron(tmp_path):
    code = (
        "import sys, atexit\n"
        "atexit.register(lambda: print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'megatron', 'wandb', 'submitit'))))\n"
        f"sys.argv = ['moe_hydra', 'hydra.run.dir={tmp_path}/run', 'stage=plan', 'model=deepseek_v3', "
        "'hardware=h100_sxm', 'hardware.nodes=128', 'mesh=dsv3_h100_1024']\n"
        "from moe_hydra.commands import cli\ncli()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


def test_site_directory_joins_the_search_path(cli, tmp_path):
    site = ROOT / "launchers" / "local-slurm" / "site"
    r = cli("expert_mesh=ep2", "--cfg", "job", env={"MOE_HYDRA_SITE": str(site)})
    assert r.returncode == 0, r.stderr
    assert "name: slurm" in r.stdout and "partition: debug" in r.stdout and "devices_per_node: 2" in r.stdout


def test_multirun_flag_may_stand_between_overrides(cli, tmp_path):
    r = run_cli("stage=plan", "dispatcher=alltoall,allgather", "-m", f"hydra.sweep.dir={tmp_path}/m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "m").glob("*/plan.json"))) == 2


def test_console_script_and_hydras_shell_completion(tmp_path):
    script = Path(sys.executable).parent / "moe-hydra"
    assert script.is_file(), "pip install -e . installs the moe-hydra console script beside the interpreter"
    r = subprocess.run([str(script), "-sc", "install=bash"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "hydra_bash_completion" in r.stdout and "complete" in r.stdout


def test_context_parallel_is_planned_but_refused_by_a_rule_before_a_run_starts(cli, tmp_path):
    r = cli("stage=plan", "hardware.devices_per_node=2", "attention_mesh=cp2")
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run2"  # a run directory holds one command's outcome
    r = cli(f"hydra.run.dir={run_dir}", "hardware.devices_per_node=2", "attention_mesh=cp2")
    assert r.returncode == 2 and "[J01]" in r.stderr and "Traceback" not in r.stderr
    refused = json.loads((run_dir / "violations.json").read_text())["violations"]
    assert [v["rule"] for v in refused] == ["J01"]
    assert not (run_dir / "results.json").exists() and not (run_dir / "ranks").exists()
