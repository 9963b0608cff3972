"""The schema's numeric domains (moe_hydra.core.bounds, rule S02): every number has one, and a value outside it is
refused when the resolved plan is built, before any arithmetic, naming its key."""

from __future__ import annotations

import math
import time
import typing
from operator import attrgetter

import pytest

from moe_hydra.core import bounds, overrides
from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import leaves as schema_leaves
from moe_hydra.core.schema import unwrapped
from moe_hydra.core.violations import LayoutError
from moe_hydra.planning import plan
from moe_hydra.planning.rules.base import _divisors
from tests.conftest import compose_config


def _kind(t) -> type | None:
    """int / float for a number (optional or not), list for a list of ints, else None."""
    base = unwrapped(t)
    if base in (int, float):
        return base
    if typing.get_origin(base) in (list, typing.List) and typing.get_args(base) == (int,):
        return list
    return None


def test_every_number_of_the_schema_has_a_domain_and_every_domain_a_field():
    numbers = {p for p, t in schema_leaves() if _kind(t) in (int, float)}
    int_lists = {p for p, t in schema_leaves() if _kind(t) is list}
    assert numbers == set(bounds.DOMAINS)
    # the windows that may be auto are typed Any: their lists are checked by the same domains
    assert int_lists | set(bounds.AUTO_WINDOWS) == set(bounds.LIST_DOMAINS) and int_lists < set(bounds.CONTAINERS)


def _refused(*overrides: str) -> list:
    try:
        resolve(compose_config("stage=plan", *overrides))
    except LayoutError as e:
        return e.violations
    return []


@pytest.mark.parametrize("path", ["parallel.tensor_model_parallel_size", "parallel.context_parallel_size",
                                  "parallel.pipeline_model_parallel_size", "parallel.expert_model_parallel_size",
                                  "parallel.expert_tensor_parallel_size", "model.num_attention_heads",
                                  "model.make_vocab_size_divisible_by", "model.moe_router_num_groups",
                                  "model.hidden_size", "model.num_layers", "hardware.nodes"])
@pytest.mark.parametrize("value", [0, -1])
def test_a_size_below_one_is_refused_naming_its_key(path, value):
    (v,) = _refused(f"{path}={value}")
    assert v.rule == "S02" and v.fields == ((path, value),) and path in v.message
    # the fix is the value the config has without the override (its preset's, or the schema's), not the bound
    assert v.fix == overrides.override(path, attrgetter(path)(compose_config("stage=plan")))


@pytest.mark.parametrize("override,path", [
    ("hardware.nodes=1000000000000000000000000000000", "hardware.nodes"),
    ("model.num_attention_heads=1000000007", "model.num_attention_heads"),
    ("step_model.gemm_efficiency=0", "step_model.gemm_efficiency"),
    ("step_model.gemm_efficiency=nan", "step_model.gemm_efficiency"),
    ("memory.fragmentation=1.5", "memory.fragmentation"),
    ("hardware.memory_gib=inf", "hardware.memory_gib"),
    ("offload.optimizer_offload_fraction=-0.1", "offload.optimizer_offload_fraction"),
    ("contract.window=[0,3]", "contract.window"),
    ("model.window_size=[128,0,1]", "model.window_size"),
    ("parallel.hierarchical_context_parallel_sizes=[2,0]", "parallel.hierarchical_context_parallel_sizes"),
    # an interpolation hands a list field a number (OmegaConf checks scalars, not containers)
    ("kernels.cuda_graph_scope=${model.hidden_size}", "kernels.cuda_graph_scope"),
    ("recompute.recompute_modules=${model.name}", "recompute.recompute_modules"),
])
def test_a_number_outside_its_domain_is_refused_naming_its_key(override, path):
    found = _refused(override)
    assert [v.rule for v in found] == ["S02"] and dict(found[0].fields).keys() == {path}, found


def test_the_edges_of_a_domain_are_accepted():
    lo, hi = bounds.DOMAINS["memory.fragmentation"]
    for value in (lo, hi):
        assert _refused(f"memory.fragmentation={value}") == []


def test_the_world_is_bounded_as_a_product():
    (world,) = _refused("hardware.nodes=1048576", "hardware.devices_per_node=2")
    assert "world size 1048576 x 2" in world.message and world.rule == "S02"


def test_checking_some_config_nodes_reads_only_their_fields():
    """The layout search re-checks only what its candidates vary (parallel, train): a bad number elsewhere is the
    base config's, refused once when the search resolves it."""
    cfg = compose_config("stage=plan", "memory.fragmentation=7", "parallel.tensor_model_parallel_size=0",
                         "train.micro_batch_size=0", "hardware.nodes=1048576", "hardware.devices_per_node=2")
    every = {p for v in bounds.check(cfg) for p in dict(v.fields)}
    assert every >= {"memory.fragmentation", "parallel.tensor_model_parallel_size", "train.micro_batch_size"}
    assert {p for v in bounds.check(cfg, ("parallel", "train")) for p in dict(v.fields)} == {
        "parallel.tensor_model_parallel_size", "train.micro_batch_size"}
    assert bounds.check(cfg, ("model",)) == []
    (world,) = bounds.check(compose_config("stage=plan", "hardware.nodes=1048576", "hardware.devices_per_node=2"),
                            ("hardware",))
    assert "world size 1048576 x 2" in world.message


def test_a_refused_size_stops_before_the_rules_run():
    """nodes=0 gets S02 alone, not also a world-size rule over a world of 0."""
    cfg = compose_config("stage=plan", "hardware.nodes=0")
    with pytest.raises(LayoutError) as e:
        plan.make_plan(resolve(cfg))
    assert [v.rule for v in e.value.violations] == ["S02"]


def test_divisors_take_square_root_time():
    assert _divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and _divisors(1) == [1] and _divisors(49) == [1, 7, 49]
    start = time.process_time()
    assert _divisors(1_000_000_007) == [1, 1_000_000_007]  # prime: a loop to n would take minutes
    assert time.process_time() - start < 5  # generous: the sqrt loop takes ~2 ms


def test_valid_configs_pass_and_the_check_is_cheap():
    cfg = compose_config("stage=plan", "model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128",
                         "mesh=dsv3_h100_1024")
    assert bounds.check(cfg) == []
    assert all(math.isfinite(hi) for _, hi in bounds.DOMAINS.values())  # every domain has an upper bound
