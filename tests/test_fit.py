"""stage=fit: ranks of real layouts built by Megatron-Core on the fake process group; the parameter
estimator must agree with every build exactly."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from moe_hydra.core.resolved import resolve
from moe_hydra.job import fit
from moe_hydra.planning import plan
from tests.conftest import compose_config

pytestmark = pytest.mark.slow

H100 = "hardware=h100_sxm"
TINY_EP2_PP2 = ("hardware.devices_per_node=4", "attention_mesh=pp2", "expert_mesh=ep2")

LAYOUTS = {
    "tiny_ep2_pp2": TINY_EP2_PP2,
    "tiny_tp2_sp_etp1_pp2": ("hardware.devices_per_node=8", "attention_mesh=pp2", "parallel.tensor_model_parallel_size=2",
                             "parallel.sequence_parallel=true", "expert_mesh=ep4"),
    "tiny_vpp_mtp_tied": ("hardware.devices_per_node=4", "attention_mesh=pp4_vpp2", "model.num_layers=8",
                          "model.mtp_num_layers=1", "model.untie_embeddings_and_output_weights=false",
                          "train.global_batch_size=16"),
    "qwen3_30b_a3b_ep8": ("model=qwen3_30b_a3b", H100, "expert_mesh=ep8"),
    "qwen3_30b_a3b_ep16": ("model=qwen3_30b_a3b", H100, "hardware.nodes=2", "expert_mesh=ep16"),
    "mixtral_8x7b_tp2": ("model=mixtral_8x7b", H100, "attention_mesh=tp2", "parallel.sequence_parallel=true",
                         "expert_mesh=ep4"),
}


def _fit(tmp_path, *overrides: str) -> dict:
    cfg = compose_config("stage=fit", *overrides)
    r = resolve(cfg)
    p = plan.make_plan(r, [], {"versions": {}, "env": {}})
    config = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    return fit.run(r, config, p, tmp_path)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_estimator_equals_the_megatron_build(tmp_path, name):
    report = _fit(tmp_path, *LAYOUTS[name])
    assert not report["refused"], report["refused"]
    for r in report["ranks"]:
        assert r["built"] == r["estimate"], (name, r)
        assert r["built"]["total"] > 0
    assert report["agree"]
    pp = report["ranks"][-1]["pp_rank"] + 1
    built_stages = {r["pp_rank"] for r in report["ranks"]}
    assert {0, pp - 1} <= built_stages  # the first and last pipeline stage at least


def test_ranks_to_build_follow_megatrons_rank_order():
    cfg = compose_config(*TINY_EP2_PP2)
    assert fit.ranks_to_build(resolve(cfg), most_loaded=0) == {0: 0, 1: 2}  # tp-cp-ep-dp-pp: PP outermost


def test_dsv3_1024_rank_builds_on_this_machine(cli, tmp_path):
    r = cli("stage=fit", "model=deepseek_v3", H100, "hardware.nodes=128", "+mesh=dsv3_h100_1024", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "agree exactly on 3 ranks" in r.stdout
    report = json.loads((tmp_path / "run" / "fit.json").read_text())
    assert report["world_size"] == 1024 and report["agree"]
    assert [r["pp_rank"] for r in report["ranks"]] == [0, 2, 7]  # first, most loaded, last
    last = report["ranks"][-1]
    # the last stage holds the MTP block, its own embedding copy and the output layer
    assert last["built"]["dense"] > report["ranks"][1]["built"]["dense"]
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["fits"] is False


def _fit_with_build_config(tmp_path, **model_changes) -> dict:
    """Plan one config, but hand the rank processes a model changed behind the planner's back."""
    cfg = compose_config("stage=fit", *TINY_EP2_PP2)
    r = resolve(cfg)
    p = plan.make_plan(r, [], {"versions": {}, "env": {}})
    config = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    config["model"].update(model_changes)
    return fit.run(r, config, p, tmp_path)


def test_a_build_that_differs_from_the_estimate_is_a_mismatch(tmp_path):
    report = _fit_with_build_config(tmp_path, moe_ffn_hidden_size=128)
    assert not report["agree"] and not report["refused"]
    assert all(r["built"]["expert"] < r["estimate"]["expert"] for r in report["ranks"])


def test_what_megatron_refuses_is_reported_with_its_message(tmp_path):
    report = _fit_with_build_config(tmp_path, moe_router_num_groups=3, moe_router_group_topk=1)  # 8 experts
    assert report["refused"] and not report["agree"]
    assert all("should be divisible by moe_router_num_groups (3)" in r for r in report["refused"]), report["refused"]
