"""Hydra discovers sweeper plugins only in the ``hydra_plugins`` namespace; this is moe_hydra's.

The logic lives in :mod:`moe_hydra.layout_sweeper` (and the search in :mod:`moe_hydra.search`); this
module only gives it the name Hydra accepts.
"""

from moe_hydra.launch.layout_sweeper import LayoutSweeperImpl


class LayoutSweeper(LayoutSweeperImpl):
    """``hydra/sweeper=layout``: search the layouts of the composed model and hardware, then screen the best."""
