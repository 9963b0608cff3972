"""Hydra discovers sweeper plugins only in the ``hydra_plugins`` namespace; this is moe_hydra's.

The logic lives in :mod:`moe_hydra.launch.layout_sweeper` (and the search in :mod:`moe_hydra.planning.search`); this
module only gives it the name Hydra accepts.
"""

from moe_hydra.launch.layout_sweeper import LayoutSweeperImpl
from moe_hydra.launch.points import PointsSweeperImpl


class LayoutSweeper(LayoutSweeperImpl):
    """``hydra/sweeper=layout``: search the layouts of the composed model and hardware, then screen the best."""


class PointsSweeper(PointsSweeperImpl):
    """``hydra/sweeper=points`` (the default): every point launched, every JobReturn returned."""
