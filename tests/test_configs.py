"""Every preset of every group composes against the typed schema; reference layouts are legal."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from moe_hydra.commands import _overrides as cli
from moe_hydra.core.layout import Layout
from moe_hydra.core.resolved import resolve
from moe_hydra.planning import rules
from moe_hydra.planning.plan import make_plan
from tests.conftest import compose_config

GROUPS = cli.groups()
ALL_PRESETS = [(g, o) for g, options in GROUPS.items() for o in options]

# Each whole-layout preset, with the model and hardware it was published for.
MESH_TARGETS = {
    "ep8": ("qwen3_30b_a3b", "h100_sxm", 1),
    "ep16": ("qwen3_30b_a3b", "h100_sxm", 2),
    "dsv3_h100_1024": ("deepseek_v3", "h100_sxm", 128),
    "qwen3_235b_a22b_h100_256": ("qwen3_235b_a22b", "h100_sxm", 32),
    "qwen3_30b_a3b_h100_16": ("qwen3_30b_a3b", "h100_sxm", 2),
}


def test_the_groups_the_product_promises_exist():
    expected = {"model", "hardware", "precision", "attention_mesh", "expert_mesh", "mesh", "recompute", "offload",
                "dispatcher", "routing", "launcher", "logger", "experiment"}
    assert expected <= set(GROUPS)
    assert {"tiny_moe", "olmoe_1b_7b", "qwen3_30b_a3b", "qwen3_235b_a22b", "deepseek_v2_lite", "moonlight_16b_a3b",
            "deepseek_v3", "kimi_k2", "mixtral_8x7b", "mixtral_8x22b", "gpt_oss_20b", "gpt_oss_120b"} <= set(GROUPS["model"])
    assert {"local_cpu", "h100_sxm", "h200_sxm", "b200", "b300", "gb200_nvl72", "gb300_nvl72"} <= set(GROUPS["hardware"])
    assert {"bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "mxfp8", "nvfp4"} <= set(GROUPS["precision"])
    assert {f"ep{n}" for n in (1, 2, 4, 8, 16, 32, 64)} <= set(GROUPS["expert_mesh"])
    assert {"tp1", "tp2", "tp4", "tp8"} <= set(GROUPS["attention_mesh"])
    assert {"allgather", "alltoall", "deepep", "hybridep"} <= set(GROUPS["dispatcher"])


@pytest.mark.parametrize("group,option", ALL_PRESETS, ids=[f"{g}={o}" for g, o in ALL_PRESETS])
def test_every_preset_composes(group, option):
    cfg = compose_config(f"{group}={option}")
    if group in ("model", "hardware", "precision", "recompute", "offload", "dispatcher", "routing", "launcher", "logger"):
        assert getattr(cfg, group).name == option


def test_defaults_are_the_embedded_tiny_run():
    cfg = compose_config()
    assert (cfg.model.name, cfg.hardware.name, cfg.dispatcher.name, cfg.routing.name) == \
        ("tiny_moe", "local_cpu", "alltoall", "natural")
    assert cfg.model.num_moe_experts >= 8 and cfg.model.moe_router_topk == 2 and cfg.model.num_layers >= 2
    assert cfg.train.seq_length == cfg.model.seq_length  # interpolated from the model preset
    assert cfg.contract.window == "auto" and cfg.train.train_iters == 200  # steps until steady, at most 200
    assert compose_config("contract.window=[4,12]").train.train_iters == 12  # a declared window's last step
    assert rules.check(resolve(cfg)) == []


def test_optional_groups_take_plus_or_not():
    a, b = compose_config("mesh=ep8"), compose_config("hardware=h100_sxm", "mesh=ep16")
    assert a.parallel.expert_model_parallel_size == 8 and b.parallel.expert_model_parallel_size == 16


def test_mesh_preset_overrides_the_two_mesh_groups():
    cfg = compose_config("attention_mesh=tp4", "expert_mesh=ep2", "mesh=ep8")
    assert Layout.from_config(cfg).describe().startswith("TP1 CP1 PP1")
    assert cfg.parallel.expert_model_parallel_size == 8


@pytest.mark.parametrize("bad", ["model.num_layerz=3", "hardware.nodes=two", "stage=plna", "parallel.tp=2"])
def test_typos_and_wrong_types_fail_at_compose_time(bad):
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config(bad)


def test_every_mesh_preset_has_a_target():
    assert set(GROUPS["mesh"]) == set(MESH_TARGETS)


@pytest.mark.parametrize("mesh", sorted(MESH_TARGETS))
def test_reference_layouts_are_legal_for_their_model_and_hardware(mesh):
    model, hardware, nodes = MESH_TARGETS[mesh]
    cfg = compose_config(f"model={model}", f"hardware={hardware}", f"hardware.nodes={nodes}", f"mesh={mesh}")
    assert rules.check(resolve(cfg)) == []
    plan = make_plan(resolve(cfg))
    assert plan["world_size"] == nodes * 8


def test_dsv3_reference_layout_derives_both_meshes():
    plan = make_plan(resolve(compose_config("model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128",
                                        "mesh=dsv3_h100_1024")))
    p = plan["parallel"]
    assert (p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"], p["virtual_pipeline_model_parallel_size"],
            p["expert_model_parallel_size"], p["expert_tensor_parallel_size"], p["sequence_parallel"]) == (2, 8, 4, 64, 1, True)
    # DP = 1024 / (2*1*8) = 64; EDP = 1024 / (1*64*8) = 2; min = 8 * lcm(2, 64) = 512
    assert (p["data_parallel_size"], p["expert_data_parallel_size"], plan["min_gpus"]) == (64, 2, 512)
    assert plan["experts_per_rank"] == 4


def test_experiment_is_a_frozen_dispatcher_ab():
    cfg = compose_config("experiment=dispatcher_ab")
    assert cfg.hardware.devices_per_node == 2 and cfg.parallel.expert_model_parallel_size == 2
    assert rules.check(resolve(cfg)) == []


def test_a_layout_string_implies_vpp():
    cfg = compose_config("model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128", "mesh=dsv3_h100_1024",
                         "parallel.virtual_pipeline_model_parallel_size=null")
    assert Layout.from_config(cfg).vpp == 4 and rules.check(resolve(cfg)) == []


def test_compose_gives_what_hydras_compose_api_gives(tmp_path):
    """The one composer outside ``hydra.main`` (moe_hydra.launch.compose) against Hydra's own compose API: the same
    config, key for key, for group choices, values, additions, deletions, an experiment and a search path."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from moe_hydra.core.schema import CONF_PACKAGE
    from moe_hydra.launch.compose import compose, register

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\ntrain:\n  micro_batch_size: 3\n")
    cases = [[], ["model=qwen3_30b_a3b", "hardware=h100_sxm", "mesh=ep8"], ["train.seq_length=512", "repeat=3"],
             ["dispatcher=deepep", "hardware=b200", "~hardware.env.NVTE_FWD_LAYERNORM_SM_MARGIN"],
             ["+launcher.additional_parameters.exclusive=true", "launcher=slurm"],
             [f"hydra.searchpath=[file://{tmp_path}]", "experiment=mine"]]
    register()
    for overrides in cases:
        GlobalHydra.instance().clear()
        with initialize_config_module(CONF_PACKAGE, version_base="1.3"):
            theirs = hydra_compose("config", overrides=overrides)
        GlobalHydra.instance().clear()
        assert OmegaConf.to_container(compose(overrides)) == OmegaConf.to_container(theirs), overrides
    with pytest.raises(ConfigCompositionException):
        compose(["dispatcher=nope"])
