"""moe_hydra.analysis.same_work refuses to compare loops that did different work (benchmarks/harness_overhead.py's
job against its bare Megatron-Core loop).

A ratio of two loops' times is given only when their Megatron-Core configs and run facts are the same field by
field and their losses the same at every step; here the comparison is fed configs as ``megatron_configs.json``
holds them (moe_hydra.job.built), the job's results.json and the bare loop's work.json, as the programs write them.
The benchmark itself is only run as a program (``--help``): no test imports a benchmark.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.analysis import same_work
from moe_hydra.core.errors import Refused

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "harness_overhead.py"


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


def test_identical_configs_are_not_refused():
    assert same_work.diff(_built(), _built()) == []


def test_memory_addresses_are_not_a_difference_but_init_arguments_are():
    # the str() of an init partial carries the process's address: two processes never agree on it
    assert same_work.diff(_built("0x7f3b874ff6a0"), _built("0x7fa1c0de0000")) == []
    other_std = _built()
    other_std["transformer_config"]["init_method"] = other_std["transformer_config"]["init_method"].replace(
        "std=0.02", "std=0.01")
    [line] = same_work.diff(_built(), other_std)
    assert line.startswith("transformer_config.init_method:")


@pytest.mark.parametrize("section, field, value", [
    ("transformer_config", "moe_router_dtype", None),
    ("transformer_config", "moe_layer_freq", [1, 0]),
    ("transformer_config", "params_dtype", "torch.float32"),
    ("ddp_config", "grad_reduce_in_fp32", False),
    ("optimizer_config", "lr", 0.002),
    ("run", "torch_threads", 1),
])
def test_one_differing_field_is_named(section, field, value):
    bare = _built()
    bare[section][field] = value
    [line] = same_work.diff(_built(), bare, labels=("moe_hydra", "bare"))
    assert line.startswith(f"{section}.{field}: moe_hydra ")
    assert line.endswith(f" != bare {json.dumps(value)}")


def test_a_field_or_section_on_one_side_only_is_a_difference():
    bare = _built()
    del bare["ddp_config"]["bucket_size"]  # None on the other side: missing is not None
    bare["optimizer_config"]["decoupled_lr"] = None
    lines = same_work.diff(_built(), bare)
    assert lines == ["ddp_config.bucket_size: a null != b <missing>",
                     "optimizer_config.decoupled_lr: a <missing> != b null"]
    no_run = _built()
    del no_run["run"]
    [line] = same_work.diff(_built(), no_run)
    assert line.startswith("run:") and line.endswith("!= b <missing>")


def test_only_the_declared_fields_are_ignored():
    assert same_work.diff(_built(), _built(), ignored={}) == []
    bare = _built()
    bare["optimizer_config"]["lr"] = 0.002
    assert same_work.diff(_built(), bare, ignored={"optimizer_config.lr": "test"}) == []
    assert same_work.IGNORED_FIELDS == {}, "a field left out of the comparison is declared with its reason"


RESULTS = {
    "world_size": 2, "seq_length": 128, "params_per_rank": 1182336, "train_iters": 3, "window": [2, 3],
    "profile_steps": None,
    "parallel": {"tensor_model_parallel_size": 1, "data_parallel_size": 2},
    "batch": {"micro_batch_size": 4, "global_batch_size": 8, "micro_batches_per_step": 1},
    "contract": {"seed": 1234, "data": {"kind": "mock", "seed": 1234},
                 "train": {"seq_length": 128, "layout_invariant_init": False},
                 "model": {"vocab_size": 1000, "make_vocab_size_divisible_by": 128,
                           "untie_embeddings_and_output_weights": True, "position_embedding_type": "rope",
                           "rotary_base": 10000}},
    "evidence": {"layer_spec": "local", "backend": "gloo", "torch_threads": 1,
                 "dispatcher_class": "MoEAlltoAllTokenDispatcher", "experts_class": "SequentialMLP",
                 "local_experts_per_rank": 4, "param_dtype": "bfloat16", "optimizer_class": "ChainedOptimizer",
                 "ddp_class": "DistributedDataParallel", "model_chunks": 1},
}


def test_the_jobs_run_facts_are_read_from_its_results():
    facts = same_work.run_facts(RESULTS)
    assert facts["vocab_size"] == 1024  # padded as Megatron pads it: 1000 up to a multiple of 128 x TP 1
    assert facts["share_embeddings_and_output_weights"] is False
    assert facts["torch_threads"] == 1 and facts["data_parallel_size"] == 2


LOSSES = [6.959890365600586, 6.934208393096924, 6.934720993041992]


def test_losses_compare_bit_for_bit_on_the_cpu_and_within_the_tolerance_on_a_gpu():
    assert same_work.loss_diff(LOSSES, list(LOSSES), same_work.LOSS_RTOL["cpu"]) == []
    nudged = [x * (1 + 1e-7) for x in LOSSES]
    assert len(same_work.loss_diff(LOSSES, nudged, same_work.LOSS_RTOL["cpu"])) == 3
    assert same_work.loss_diff(LOSSES, nudged, same_work.LOSS_RTOL["gpu"]) == []
    assert same_work.loss_diff(LOSSES, [x * 1.05 for x in LOSSES], same_work.LOSS_RTOL["gpu"]) != []
    assert same_work.loss_diff([float("nan")], [float("nan")], 1.0) != []  # NaN is never the same loss
    [line] = same_work.loss_diff(LOSSES, LOSSES[:2], 0.0)
    assert "3 steps != b 2 steps" in line
    many = same_work.loss_diff([1.0] * 9, [2.0] * 9, 0.0)
    assert len(many) == 6 and many[-1] == "... and 4 more step(s)"


# ----------------------------------------------------------------------------- the decision: a ratio, or none


def _programs(tmp_path: Path, *, bare_topk=2, bare_threads=1, bare_losses=LOSSES, ours_ms=(10.2, 10.6, 9.9)):
    """Both programs replaced by writers of the files they leave (the job's run directory: results.json and
    megatron_configs.json; the bare loop's: megatron_configs.json and work.json), read back as the benchmark reads
    them. Returns the two programs and the list of runs they were asked for, in order."""
    calls = []

    def ours(i: int) -> same_work.Work:
        calls.append(f"moe_hydra {i}")
        out = tmp_path / f"ours{i}"
        out.mkdir()
        results = {**RESULTS, "step_time_ms": ours_ms[i], "window_loop_ms_per_step": 11.0,
                   "loss": {"per_step": LOSSES}}
        (out / "results.json").write_text(json.dumps(results))
        built = _built()
        (out / same_work.CONFIGS_FILE).write_text(json.dumps({k: built[k] for k in same_work.CONFIG_SECTIONS}))
        return same_work.read_job(out)

    def bare(i: int) -> same_work.Work:
        calls.append(f"bare {i}")
        out = tmp_path / f"bare{i}"
        out.mkdir()
        built = _built()
        built["transformer_config"]["moe_router_topk"] = bare_topk
        run = {**same_work.run_facts(RESULTS), "torch_threads": bare_threads}  # the keys the bare loop records
        (out / same_work.LOOP_FILE).write_text(json.dumps(
            {"step_time_ms": 10.0, "window_loop_ms_per_step": 11.0, "loss_per_step": bare_losses, "run": run}))
        (out / same_work.CONFIGS_FILE).write_text(json.dumps({k: built[k] for k in same_work.CONFIG_SECTIONS}))
        return same_work.read_loop(out, "bare")

    return ours, bare, calls


@pytest.mark.parametrize("difference, named", [
    ({"bare_topk": 1}, "transformer_config.moe_router_topk: moe_hydra 2 != bare 1"),
    ({"bare_threads": 2}, "run.torch_threads: moe_hydra 1 != bare 2"),
    ({"bare_losses": [*LOSSES[:2], 6.9347]}, "loss at step 3: moe_hydra 6.934720993041992 != bare 6.9347"),
])
def test_different_work_ends_the_runs_without_a_ratio(tmp_path, difference, named):
    ours, bare, calls = _programs(tmp_path, **difference)
    pairs = same_work.alternate(3, ours, bare, same_work.LOSS_RTOL["cpu"])
    assert not pairs.same and pairs.differences == [named]
    assert pairs.refusal == f"moe_hydra and bare did not do the same work (1 difference(s)); no ratio:\n  {named}"
    assert calls == ["moe_hydra 0", "bare 0"]  # refused after the first pair, before the other repeats
    with pytest.raises(Refused, match=r"did not do the same work \(1 difference\(s\)\); no ratio"):
        pairs.ratio("step_time_ms")


def test_the_same_work_gives_the_ratio_of_the_medians_and_of_each_pair(tmp_path):
    ours, bare, calls = _programs(tmp_path)
    pairs = same_work.alternate(3, ours, bare, same_work.LOSS_RTOL["cpu"])
    assert pairs.same and pairs.differences == []
    assert calls == ["moe_hydra 0", "bare 0", "moe_hydra 1", "bare 1", "moe_hydra 2", "bare 2"]  # alternating
    step = pairs.ratio("step_time_ms")
    assert (step.a_ms, step.b_ms) == ([10.2, 10.6, 9.9], [10.0, 10.0, 10.0])
    assert f"{step.ratio:.3f}" == "1.020"  # median 10.2 / median 10.0
    assert [f"{x:.3f}" for x in step.pair_ratios] == ["1.020", "1.060", "0.990"]
    assert pairs.ratio("window_loop_ms_per_step").ratio == 1.0


def test_a_run_that_left_no_readable_record_is_refused_with_the_file_named(tmp_path):
    with pytest.raises(Refused, match=r"results.json: missing, unreadable or not a JSON object"):
        same_work.read_job(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({**RESULTS, "step_time_ms": 1.0,
                                                       "window_loop_ms_per_step": 1.0, "loss": {"per_step": []}}))
    with pytest.raises(Refused, match=r"megatron_configs.json: missing, unreadable or not a JSON object"):
        same_work.read_job(tmp_path)
    (tmp_path / same_work.CONFIGS_FILE).write_text("{}")
    no_evidence = copy.deepcopy(RESULTS)
    del no_evidence["evidence"]
    (tmp_path / "results.json").write_text(json.dumps(no_evidence))
    with pytest.raises(Refused, match=r"results.json: not the run facts.*\(KeyError: 'evidence'\)"):
        same_work.read_job(tmp_path)
    (tmp_path / same_work.LOOP_FILE).write_text(json.dumps({"run": {}, "step_time_ms": 1.0}))
    with pytest.raises(Refused, match=r"work.json: not the run facts.*\(KeyError: 'loss_per_step'\)"):
        same_work.read_loop(tmp_path, "bare")


def test_help_runs_without_torch_work():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0 and "--procs" in r.stdout
