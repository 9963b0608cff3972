"""Pipeline splits: layout strings, even/uneven stages, embedding/loss accounting."""

from __future__ import annotations

import pytest

from moe_hydra.core.pipeline import assign, expand_layout, virtual_stage_sizes


def test_expand_dsv3_layout():
    stages = expand_layout("Et|(tt|)*30mL")
    assert len(stages) == 32 and stages[0] == "Et" and stages[-1] == "mL" and stages[1:31] == ["tt"] * 30
    assert expand_layout("Et*3|(t*4|)*2L") == ["Ettt", "tttt", "tttt", "L"]


def test_layout_assigns_virtual_stages_round_robin():
    ranks = assign(61, 1, pp=8, vpp=4, layout="Et|(tt|)*30mL")
    # rank 0 holds stages 0, 8, 16, 24 -> 1 + 2 + 2 + 2 layers; rank 7 holds 7, 15, 23, 31 -> 2 + 2 + 2 + 0
    assert [len(r.layers) for r in ranks] == [7, 8, 8, 8, 8, 8, 8, 6]
    assert ranks[0].embedding and not ranks[0].loss and ranks[7].loss and ranks[7].mtp == 1
    assert ranks[0].layers[:2] == (0, 15)  # stage 0 has layer 0; stage 8 starts at layer 1 + 7*2 = 15


def test_accounting_for_embedding_and_loss():
    # Qwen3-235B: 94 layers + embedding + loss = 96 slots over PP8 x VPP4 = 32 stages of 3
    sizes = virtual_stage_sizes(94, 8, 4, account_embedding=True, account_loss=True)
    assert sizes[0] == 2 and sizes[-1] == 2 and set(sizes[1:-1]) == {3} and sum(sizes) == 94


def test_uneven_first_and_last_stage():
    ranks = assign(10, 0, pp=4, first=2, last=2)
    assert [len(r.layers) for r in ranks] == [2, 3, 3, 2]
    with pytest.raises(ValueError, match="not divisible"):
        assign(10, 0, pp=4, first=1, last=2)


def test_layout_must_place_every_layer():
    with pytest.raises(ValueError, match="places 4 layers, the model has 5"):
        assign(5, 0, pp=2, layout="Ett|ttL")
