"""The one override codec: what it writes, Hydra's parser reads back as the same value; what it applies is what
the command line would compose."""

from __future__ import annotations

import pytest

from moe_hydra.core import overrides
from moe_hydra.core.resolved import resolve
from tests.conftest import compose_config

VALUES = [None, True, False, 0, 3, -2, 2.5, 1e-4, "abc", "a.b-c/d", "Et|(tt|)*30mL", "[0]*3+[1]*58", "1", "2.5",
          "null", "true", "a b", "it's", "", [1, 2], ["core_attn", "layernorm"], [], ["x y", 3, None]]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v) for v in VALUES])
def test_what_the_codec_writes_hydra_reads_back(value):
    (o,) = overrides.parse([overrides.override("a.b", value)])
    assert o.key_or_group == "a.b"
    assert o.value() == value and type(o.value()) is type(value)


def test_applying_overrides_equals_composing_them():
    extra = ["recompute=selective", "recompute.recompute_modules=[core_attn,layernorm,moe_act,mla_up_proj]",
             "parallel.pipeline_model_parallel_layout='Et|(tt|)*30mL'", "train.micro_batch_size=2"]
    base = ("stage=plan", "model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128", "mesh=dsv3_h100_1024")
    applied = overrides.apply(compose_config(*base), extra)
    assert applied == compose_config(*base, *extra)
    assert resolve(applied).layout == resolve(compose_config(*base, *extra)).layout


def test_tree_nests_key_overrides_and_leaves_groups_out():
    assert overrides.tree(["recompute=full", "parallel.pipeline_model_parallel_layout='Et|tL'",
                           "train.micro_batch_size=4", "overlap.overlap_moe_expert_parallel_comm=true"]) == {
        "parallel": {"pipeline_model_parallel_layout": "Et|tL"}, "train": {"micro_batch_size": 4},
        "overlap": {"overlap_moe_expert_parallel_comm": True}}
