"""The Megatron-Core job end to end on this machine's CPU (gloo): real processes, real training."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from moe_hydra.job import compat, train

pytestmark = pytest.mark.slow

FP32 = "precision=fp32"  # CPU runs are compared in fp32, where the layouts agree to ~1e-6


def results(path):
    return json.loads((path / "run" / "results.json").read_text())


@pytest.fixture(scope="module")
def one_process_gbs8(tmp_path_factory):
    """The 1-process reference: same seed, same global batch (8 sequences as 2 micro-batches)."""
    from tests.conftest import run_cli

    tmp = tmp_path_factory.mktemp("ref")
    r = run_cli(f"hydra.run.dir={tmp}/run", FP32, "train.global_batch_size=8", cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return results(tmp)


def test_default_job_writes_complete_results(cli, tmp_path):
    r = cli(timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = results(tmp_path)
    assert res["status"] == "ok" and res["stage"] == "run"
    # contract.window=auto, the default: it stepped until steady (at least 3 warmup + 2 x 10 judged steps) and
    # measured the steady segment it stopped on, its last steps
    steps, (first, last) = res["steps"], res["window"]
    assert res["window_declared"] == "auto" and res["warmup_steps"] == 3 and 23 <= steps < 200
    assert res["window_measured"] == [first, last] and 4 <= first and last == steps and last - first + 1 >= 10
    assert res["steady"]["window_steady"] is True and res["steady"]["segment"] == [first, last]
    times = res["step_times_ms"]
    assert len(times) == steps and all(t > 0 for t in times)
    assert res["step_time_ms"] == pytest.approx(statistics.fmean(times[first - 1:last]))  # the window, warmup out
    tokens = 4 * 128  # MBS 4 x DP 1, seq 128
    assert res["tokens_per_step"] == tokens
    assert res["tokens_per_s_per_gpu"] == pytest.approx(tokens / (res["step_time_ms"] / 1e3))
    assert res["tflops_per_gpu"] == pytest.approx(res["flops_per_token"] * res["tokens_per_s_per_gpu"] / 1e12)
    assert res["mfu"] is None and res["peak_tflops"] is None  # no peak for a CPU
    assert res["peak_memory_gib"]["rss"] > 0.1 and "ru_maxrss" in res["memory_counter"]
    assert res["memory_phases_gib"] is None  # the allocator's phases exist on GPUs only
    loss = res["loss"]
    assert loss["all_finite"] and loss["nan_or_skipped"] == 0 and len(loss["per_step"]) == steps
    assert loss["last"] < loss["first"] - 0.1, loss["per_step"]
    assert res["parallel"]["data_parallel_size"] == 1 and res["label"] == "benchmark-only"
    ev = res["evidence"]
    assert ev["dispatcher_class"] == "MoEAlltoAllTokenDispatcher" and ev["local_experts_per_rank"] == 8
    assert ev["grouped_gemm"] is False and ev["experts_class"] == "SequentialMLP"
    assert ev["optimizer_class"] == "DistributedOptimizer" and ev["param_dtype"] == "bfloat16"
    assert ev["backend"] == "gloo" and ev["layer_spec"] == "local"
    # bf16 GEMMs on fp32 copies only where the CPU has no bf16 instructions (tests/test_compat.py)
    assert ("cpu_bf16_gemms_in_fp32" in ev["compat_shims"]) is not compat.cpu_has_bf16()
    assert ev["torch_threads"] == train.cpu_threads(1)  # one rank: every core this process may use, less one
    assert re.search(rf"step\s+{steps}\s+loss\s+\d", r.stdout + r.stderr)  # the metric line of the last step


@pytest.mark.parametrize("dispatcher,klass", [("alltoall", "MoEAlltoAllTokenDispatcher"),
                                              ("allgather", "MoEAllGatherTokenDispatcher")])
def test_ep2_over_two_processes_matches_one_process(cli, tmp_path, one_process_gbs8, dispatcher, klass):
    r = cli(FP32, "hardware.devices_per_node=2", "expert_mesh=ep2", f"dispatcher={dispatcher}", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = results(tmp_path)
    p = res["parallel"]
    assert (p["expert_model_parallel_size"], p["data_parallel_size"], p["expert_data_parallel_size"]) == (2, 2, 1)
    assert res["evidence"]["dispatcher_class"] == klass and res["evidence"]["local_experts_per_rank"] == 4
    # Same seed, same 8 sequences per step, layout-invariant weights: the math says the losses agree.
    assert res["loss"]["first"] == pytest.approx(one_process_gbs8["loss"]["first"], abs=1e-5)
    assert res["loss"]["per_step"][:4] == pytest.approx(one_process_gbs8["loss"]["per_step"][:4], abs=1e-4)
    assert not list((tmp_path / "run").glob("results*.json"))[1:]  # rank 1 wrote no results of its own


def test_parallel_folding_tp2_sp_ep2_etp1(cli, tmp_path, one_process_gbs8):
    # GBS null would be micro batch x world size (4 on one process, 8 on two): the same 8 sequences for both
    r = cli(FP32, "hardware.devices_per_node=2", "attention_mesh=tp2", "expert_mesh=ep2", "train.global_batch_size=8",
            timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = results(tmp_path)
    p = res["parallel"]
    # TP2 DP1 on the attention mesh, EP2 ETP1 EDP1 on the expert mesh: EP larger than DP
    assert (p["tensor_model_parallel_size"], p["data_parallel_size"], p["sequence_parallel"]) == (2, 1, True)
    assert (p["expert_model_parallel_size"], p["expert_tensor_parallel_size"], p["expert_data_parallel_size"]) == (2, 1, 1)
    assert res["loss"]["first"] == pytest.approx(one_process_gbs8["loss"]["first"], abs=1e-5)
    assert res["loss"]["per_step"][:3] == pytest.approx(one_process_gbs8["loss"]["per_step"][:3], abs=1e-4)


def test_pipeline_parallel_matches_one_process(cli, tmp_path, one_process_gbs8):
    r = cli(FP32, "hardware.devices_per_node=2", "attention_mesh=pp2", "train.global_batch_size=8", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = results(tmp_path)
    assert res["evidence"]["batch_p2p_comm"] is False  # never batched on gloo
    assert res["loss"]["per_step"][:4] == pytest.approx(one_process_gbs8["loss"]["per_step"][:4], abs=1e-4)


def test_gpt_oss_clamped_quick_geglu_is_what_megatron_core_builds_and_trains(cli, tmp_path):
    """The tiny MoE with GPT-OSS's activation: Megatron-Core's quick_gelu, clamp and offset in the built config,
    and a loss that differs from SwiGLU's from the first step."""
    args = ("train.train_iters=4", "contract.warmup_steps=1", "contract.window=[2,4]", "logger=none")
    r = cli(*args, "model.activation_func=quick_gelu", "model.activation_func_clamp_value=7.0",
            "model.glu_linear_offset=1.0", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads((tmp_path / "run" / "megatron_configs.json").read_text())["transformer_config"]
    assert (built["activation_func"], built["activation_func_clamp_value"], built["glu_linear_offset"]) == (
        "<quick_gelu>", 7.0, 1.0)
    quick = results(tmp_path)["loss"]["per_step"]
    plain = cli(*args, "hydra.run.dir=" + str(tmp_path / "silu" / "run"), timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert results(tmp_path / "silu")["loss"]["per_step"][0] != pytest.approx(quick[0], abs=1e-4)


@pytest.mark.parametrize("args,expected", [
    (["hardware.devices_per_node=2", "expert_mesh=ep2", "dispatcher=deepep"], "needs DeepEP"),
    (["hardware.devices_per_node=2", "expert_mesh=ep2", "dispatcher=hybridep"], "needs HybridEP"),
    (["hardware=h100_sxm"], "this machine has 0"),
    (["hardware.devices_per_node=64", "expert_mesh=ep8"], "processes need as many cores"),
])
def test_what_this_machine_cannot_run_is_refused_before_any_process(cli, tmp_path, args, expected):
    r = cli(*args)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "ranks").exists() and not (tmp_path / "run" / "results.json").exists()


def test_a_failing_job_reports_failed(cli, tmp_path):
    r = cli("hardware.devices_per_node=2", "expert_mesh=ep2", "train.fail_at_step=2", timeout=300)
    assert r.returncode == 1
    assert "failing on purpose" in r.stderr and "per-rank logs" in r.stderr
    res = results(tmp_path)
    assert res["status"] == "failed" and "fail_at_step=2" in res["error"]


def _stop_mid_window(tmp_path, sig, *args):
    """Start a run with a long window, send ``sig`` to the command once step 5 is logged; (exit code, output,
    results)."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={tmp_path}/run", "logger=none",
                                 "contract.warmup_steps=1", "contract.window=[2,400]", *args],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 240
        # step 5's metric line (a step time field such as "step    512.3 ms" must not match)
        while (not re.search(r"^step\s+5\s+loss", log.read_text(), re.M) and time.monotonic() < deadline
               and proc.poll() is None):
            time.sleep(0.5)
        proc.send_signal(sig)
        proc.wait(timeout=120)
    return proc.returncode, log.read_text(), results(tmp_path)


@pytest.mark.parametrize("signame,status", [("SIGTERM", "terminated"), ("SIGINT", "interrupted"),
                                            ("SIGUSR2", "terminated")])
def test_a_signal_mid_window_records_the_steps_so_far(tmp_path, signame, status):
    import signal as signals

    sig = signals.Signals[signame]
    code, stderr, res = _stop_mid_window(tmp_path, sig, "hardware.devices_per_node=2", "expert_mesh=ep2")
    assert code == 128 + sig.value, stderr[-2000:]
    assert "Traceback" not in stderr and f"stopped by {signame}" in stderr
    assert res["status"] == status and res["signal"] == signame and res["results_version"] == 1 and res["run_id"]
    steps = res["steps"]
    assert 5 <= steps < 400 and len(res["step_times_ms"]) == steps == res["stopped_at_step"]
    assert res["window"] == [2, 400] and res["window_measured"] == [2, steps]
    assert res["step_time_ms"] == pytest.approx(statistics.fmean(res["step_times_ms"][1:steps]))
    assert len(res["loss"]["per_step"]) == steps
