"""The contract, the environment snapshot and W&B (offline, read back from the files wandb wrote)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.commands import run_command
from moe_hydra.core import contract, env


def plan_of(path: Path) -> dict:
    return json.loads(path.read_text())


def test_contract_hash_excludes_the_swept_variable_only():
    c = {"dispatcher": {"name": "alltoall"}, "parallel": {"expert_model_parallel_size": 2}, "train": {"seq_length": 128}}
    other = json.loads(json.dumps(c))
    other["dispatcher"]["name"] = "allgather"
    assert contract.hashes(c, ["dispatcher"])["contract_hash"] == contract.hashes(other, ["dispatcher"])["contract_hash"]
    assert contract.hashes(c, ["dispatcher"])["contract_full_hash"] != contract.hashes(other, ["dispatcher"])["contract_full_hash"]
    longer = json.loads(json.dumps(other))
    longer["train"]["seq_length"] = 256
    assert contract.hashes(longer, ["dispatcher"])["contract_hash"] != contract.hashes(c, ["dispatcher"])["contract_hash"]
    # a mesh group stands for the whole layout
    assert "parallel" not in contract.excluding(c, ["expert_mesh"])
    assert contract.excluding(c, ["parallel.expert_model_parallel_size"])["parallel"] == {}
    # a swept environment preset: neither the preset nor what the ranks ran with keeps the arms apart
    c = {"hardware": {"env": {"NCCL_NVLS_ENABLE": "0"}}, "launcher": {"env": {"NCCL_NVLS_ENABLE": "0", "A": "1"}}}
    assert contract.excluding(c, ["hardware.env.NCCL_NVLS_ENABLE"]) == {"hardware": {"env": {}},
                                                                       "launcher": {"env": {"A": "1"}}}


def test_secrets_never_enter_the_snapshot():
    fake = {"NCCL_IB_HCA": "mlx5", "NCCL_AUTH_TOKEN": "sek-1", "WANDB_API_KEY": "k", "MY_TOKEN": "abc",
            "HOME": "/root", "OMP_NUM_THREADS": "2", "NVTE_PASSWORD": "p"}
    got = env.perf_env(fake)
    assert got == {"NCCL_AUTH_TOKEN": env.REDACTED, "NCCL_IB_HCA": "mlx5", "NVTE_PASSWORD": env.REDACTED,
                   "OMP_NUM_THREADS": "2"}


@pytest.mark.slow
def test_sweep_arms_share_contract_hash_and_labels_are_computed(cli, tmp_path):
    r = cli("stage=plan", "dispatcher=alltoall,allgather", "-m")
    assert r.returncode == 0, r.stderr
    a, b = (plan_of(tmp_path / "multi" / str(i) / "plan.json") for i in (0, 1))
    assert a["swept"] == ["dispatcher"] == b["swept"]
    assert a["contract_hash"] == b["contract_hash"] and a["contract_full_hash"] != b["contract_full_hash"]
    assert (tmp_path / "multi" / "0" / "env.json").exists()

    r = cli("stage=plan", "train.seq_length=64")
    assert r.returncode == 0, r.stderr
    seq64 = plan_of(tmp_path / "run" / "plan.json")
    r = cli(f"hydra.run.dir={tmp_path}/fb", "stage=plan", "routing=force_balance")  # a directory per command
    assert r.returncode == 0, r.stderr
    fb = plan_of(tmp_path / "fb" / "plan.json")
    assert seq64["contract_hash"] != fb["contract_hash"] != a["contract_hash"] != seq64["contract_hash"]
    assert fb["label"] == "benchmark-only"
    assert any("force-balanced routing" in reason for reason in fb["label_reasons"])


def _inspect(run_dir: Path, *flags: str) -> dict | list:
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", *flags, "--json", str(run_dir)],
                         capture_output=True, text=True, timeout=120)
    if out.returncode:
        out = subprocess.run(["wandb", "leet", "inspect", *flags, "--json", str(run_dir)], capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    try:
        return json.loads(out.stdout)
    except ValueError:  # one JSON record per line
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _live_history(history: list[dict], results: dict) -> None:
    """The run's W&B history, as the job logged it while it ran: one row per step (a short run logs every step)
    under Megatron-LM's keys, the step times results.json has, each MoE layer's router imbalance; and written
    step by step, not at the end: the rows' timestamps span a good part of the steps' time (rows written at the end
    would share one instant). The rows logged before W&B's run is up (``wandb.init`` runs beside the model's build)
    wait and leave together: the run is long enough (25 steps) for most of its steps to come after that (under CI's
    load wandb.init took 2.1 s, the ten steps of the default window 2.6 s)."""
    steps = results["step_times_ms"]
    assert [h["train/step"] for h in history] == list(range(1, len(steps) + 1)) == [h["_step"] for h in history]
    assert [h["iteration-time"] for h in history] == pytest.approx([t / 1e3 for t in steps])
    assert all(h["lm loss"] > 0 and h["grad-norm"] > 0 and h["learning-rate"] > 0 and h["throughput"] > 0
               for h in history)
    assert all(h["moe/imbalance_layer_0"] >= 1 and h["moe/imbalance_layer_1"] >= 1 for h in history)
    span = history[-1]["_timestamp"] - history[0]["_timestamp"]
    assert span >= 0.25 * sum(steps[1:]) / 1e3, (span, steps)


@pytest.mark.slow
def test_offline_wandb_runs_carry_group_job_type_config_summary_and_no_secret(cli, tmp_path, monkeypatch):
    secrets = {"WANDB_API_KEY": "not-a-real-key-123", "MY_TOKEN": "abc-secret-987", "NCCL_SOCKET_TOKEN": "tok-4242",
               "WANDB_MODE": "offline"}
    r = cli("dispatcher=alltoall,allgather", "contract.window=auto", "-m", env=secrets, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wandb sync" in r.stdout
    # the sweep's line after each point: done by state, to go, the slowest point so far
    assert "moe_hydra.sweep: 1 of 2 points done (1 COMPLETED), 1 to go; slowest so far #0 dispatcher=" in r.stderr
    assert re.search(r"moe_hydra.sweep: 2 of 2 points done \(2 COMPLETED\); slowest so far #[01] dispatcher=\w+ "
                     r"contract\.window=auto: [0-9.]+ ms/step", r.stderr), r.stderr[-2000:]
    hashes = set()
    for i, arm in ((0, "dispatcher=alltoall"), (1, "dispatcher=allgather")):
        job = tmp_path / "multi" / str(i)
        results = json.loads((job / "results.json").read_text())
        (run_dir,) = list((job / "wandb").glob("offline-run-*"))
        summary = _inspect(run_dir, "--summary")
        text = json.dumps(summary)
        assert results["contract_hash"] in text and arm.split("=")[1] in text
        assert "tiny_moe" in text and "steady/step_ms" in text  # config and the window summary
        assert "steady/window_steady" in text and "steady/class" in text  # the judgment of the run's step times
        assert "router/imbalance_layer_1" in text  # results.json's router, per layer
        history = [rec["history"]["item"] for rec in _inspect(run_dir) if rec.get("type") == "history"]
        _live_history(history, results)
        records = json.dumps(_inspect(run_dir))
        assert arm in records  # job_type: the arm
        assert f"-{results['contract_hash'][:8]}" in records  # group: the sweep and its contract
        hashes.add(results["contract_hash"])
        env_json = json.loads((job / "env.json").read_text())
        assert env_json["env"]["NCCL_SOCKET_TOKEN"] == env.REDACTED and "runtime" in env_json
    assert len(hashes) == 1
    # compare's picture joins the runs in W&B: a run of job_type compare in the sweep's group
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert run_command("compare", [str(tmp_path / "multi")]) == 0
    (report,) = list((tmp_path / "multi" / "wandb").glob("offline-run-*"))
    records = json.dumps(_inspect(report))
    assert f"-{results['contract_hash'][:8]}" in records and '"compare"' in records and "image-file" in records
    leaked = subprocess.run(["grep", "-rlaE", "not-a-real-key-123|abc-secret-987|tok-4242", str(tmp_path / "multi")],
                            capture_output=True, text=True)
    assert leaked.stdout == "", f"secrets leaked into {leaked.stdout}"
