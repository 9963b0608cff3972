"""benchmarks/harness_overhead.py refuses to compare loops that built different things.

The benchmark prints a ratio only when moe_hydra's and the bare loop's Megatron-Core configs (and run facts) are
the same field by field; here its diff is fed configs as ``megatron_configs.json`` holds them (moe_hydra.job.built).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "harness_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("harness_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built(init_address: str = "0x7f3b874ff6a0") -> dict:
    """Three configs as built.describe writes them (a few fields each), plus the run facts."""
    return {
        "transformer_config": {
            "class": "TransformerConfig", "num_layers": 2, "hidden_size": 128, "moe_router_topk": 2,
            "moe_router_dtype": "fp32", "params_dtype": "torch.bfloat16", "activation_func": "<silu>",
            "moe_layer_freq": [1, 1], "finalize_model_grads_func": "<finalize_model_grads>",
            "init_method": f"functools.partial(<function normal_ at {init_address}>, mean=0.0, std=0.02)",
        },
        "ddp_config": {"class": "DistributedDataParallelConfig", "grad_reduce_in_fp32": True,
                       "use_distributed_optimizer": True, "bucket_size": None},
        "optimizer_config": {"class": "OptimizerConfig", "optimizer": "adam", "lr": 0.001, "clip_grad": 1.0},
        "run": {"micro_batch_size": 4, "seed": 1234, "torch_threads": 2, "experts_class": "SequentialMLP"},
    }


def test_identical_configs_are_not_refused(bench):
    assert bench.diff(_built(), _built()) == []


def test_memory_addresses_are_not_a_difference_but_init_arguments_are(bench):
    # the str() of an init partial carries the process's address: two processes never agree on it
    assert bench.diff(_built("0x7f3b874ff6a0"), _built("0x7fa1c0de0000")) == []
    other_std = _built()
    other_std["transformer_config"]["init_method"] = other_std["transformer_config"]["init_method"].replace(
        "std=0.02", "std=0.01")
    [line] = bench.diff(_built(), other_std)
    assert line.startswith("transformer_config.init_method:")


@pytest.mark.parametrize("section, field, value", [
    ("transformer_config", "moe_router_dtype", None),
    ("transformer_config", "moe_layer_freq", [1, 0]),
    ("transformer_config", "params_dtype", "torch.float32"),
    ("ddp_config", "grad_reduce_in_fp32", False),
    ("optimizer_config", "lr", 0.002),
    ("run", "torch_threads", 1),
])
def test_one_differing_field_is_named(bench, section, field, value):
    bare = _built()
    bare[section][field] = value
    [line] = bench.diff(_built(), bare)
    assert line.startswith(f"{section}.{field}:")
    assert json.dumps(value) in line


def test_a_field_or_section_on_one_side_only_is_a_difference(bench):
    bare = _built()
    del bare["ddp_config"]["bucket_size"]  # None on the other side: missing is not None
    bare["optimizer_config"]["decoupled_lr"] = None
    lines = bench.diff(_built(), bare)
    assert [line.split(":")[0] for line in lines] == ["ddp_config.bucket_size", "optimizer_config.decoupled_lr"]
    no_run = _built()
    del no_run["run"]
    [line] = bench.diff(_built(), no_run)
    assert line.startswith("run:")


def test_only_the_declared_fields_are_ignored(bench):
    assert bench.diff(_built(), _built(), ignored={}) == []
    bare = _built()
    bare["optimizer_config"]["lr"] = 0.002
    assert bench.diff(_built(), bare, ignored={"optimizer_config.lr": "test"}) == []
    assert bench.IGNORED_FIELDS == {}, "a field left out of the comparison is declared with its reason"


def test_the_jobs_run_facts_are_read_from_its_results(bench):
    results = {
        "world_size": 2, "seq_length": 128, "params_per_rank": 1182336, "train_iters": 40, "window": [6, 40],
        "profile_steps": None,
        "parallel": {"tensor_model_parallel_size": 1, "data_parallel_size": 2},
        "batch": {"micro_batch_size": 4, "global_batch_size": 8, "micro_batches_per_step": 1},
        "contract": {"seed": 1234, "data": {"kind": "mock", "seed": 1234}, "train": {"seq_length": 128, "layout_invariant_init": False},
                     "model": {"vocab_size": 1000, "make_vocab_size_divisible_by": 128,
                               "untie_embeddings_and_output_weights": True, "position_embedding_type": "rope",
                               "rotary_base": 10000}},
        "evidence": {"layer_spec": "local", "backend": "gloo", "torch_threads": 1,
                     "dispatcher_class": "MoEAlltoAllTokenDispatcher", "experts_class": "SequentialMLP",
                     "local_experts_per_rank": 4, "param_dtype": "bfloat16", "optimizer_class": "ChainedOptimizer",
                     "ddp_class": "DistributedDataParallel", "model_chunks": 1},
    }
    facts = bench.harness_run_facts(results)
    assert facts["vocab_size"] == 1024  # padded as Megatron pads it
    assert facts["share_embeddings_and_output_weights"] is False


LOSSES = [6.959890365600586, 6.934208393096924, 6.934720993041992]


def _stub_programs(bench, monkeypatch, *, bare_topk=2, bare_losses=LOSSES, ours_ms=10.2):
    """Both programs replaced by writers of what they write: the job's run directory, the bare loop's files."""
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        built = _built()
        if "-m" in cmd:  # python -m moe_hydra hydra.run.dir=DIR ...
            out = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
            out.mkdir(parents=True)
            (out / "results.json").write_text(json.dumps(
                {"step_time_ms": ours_ms, "window_loop_ms_per_step": 11.0, "loss": {"per_step": LOSSES}}))
        else:  # harness_overhead.py --bare-launch DIR ...
            out = Path(cmd[cmd.index("--bare-launch") + 1])
            built["transformer_config"]["moe_router_topk"] = bare_topk
            (out / "timing.json").write_text(json.dumps(
                {"step_time_ms": 10.0, "window_loop_ms_per_step": 11.0, "loss_per_step": bare_losses,
                 "run": built["run"]}))
        (out / "megatron_configs.json").write_text(json.dumps({k: built[k] for k in bench.CONFIG_SECTIONS}))

    monkeypatch.setattr(bench, "_run", fake_run)
    monkeypatch.setattr(bench, "_cuda_available", lambda: False)
    monkeypatch.setattr(bench, "harness_run_facts", lambda results: _built()["run"])
    return calls


@pytest.mark.parametrize("difference, named", [
    ({"bare_topk": 1}, "transformer_config.moe_router_topk: moe_hydra 2 != bare 1"),
    ({"bare_losses": [*LOSSES[:2], 6.9347]}, "loss at step 3: moe_hydra 6.934720993041992 != bare 6.9347"),
])
def test_the_benchmark_exits_without_a_ratio_when_the_work_differs(bench, monkeypatch, capsys, difference, named):
    calls = _stub_programs(bench, monkeypatch, **difference)
    monkeypatch.setattr(sys, "argv", ["harness_overhead.py", "--repeats", "3"])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert exit_.value.code == 1
    out, err = capsys.readouterr()
    assert "moe_hydra and the bare loop did not do the same work (1 difference(s)); no ratio:" in err
    assert named in err
    assert out == "" and "ratio 1" not in err and "timed step" not in err
    assert len(calls) == 2  # refused after the first pair, before the other repeats


def test_the_benchmark_prints_the_ratio_when_the_work_agrees(bench, monkeypatch, capsys):
    calls = _stub_programs(bench, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["harness_overhead.py", "--repeats", "2"])
    bench.main()
    out = capsys.readouterr().out
    assert "ratio 1.020" in out and "ratio 1.000" in out
    assert [("-m" in c) for c in calls] == [True, False, True, False]  # alternating: moe_hydra, bare, ...


def test_losses_compare_bit_for_bit_on_the_cpu_and_within_the_tolerance_on_a_gpu(bench):
    assert bench.loss_diff(LOSSES, list(LOSSES), bench.LOSS_RTOL["cpu"]) == []
    nudged = [x * (1 + 1e-7) for x in LOSSES]
    assert len(bench.loss_diff(LOSSES, nudged, bench.LOSS_RTOL["cpu"])) == 3
    assert bench.loss_diff(LOSSES, nudged, bench.LOSS_RTOL["gpu"]) == []
    assert bench.loss_diff(LOSSES, [x * 1.05 for x in LOSSES], bench.LOSS_RTOL["gpu"]) != []
    assert bench.loss_diff([float("nan")], [float("nan")], 1.0) != []  # NaN is never the same loss
    [line] = bench.loss_diff(LOSSES, LOSSES[:2], 0.0)
    assert "3 steps != bare 2 steps" in line
    many = bench.loss_diff([1.0] * 9, [2.0] * 9, 0.0)
    assert len(many) == 6 and many[-1] == "... and 4 more step(s)"


def test_help_runs_without_torch_work():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0 and "--procs" in r.stdout
