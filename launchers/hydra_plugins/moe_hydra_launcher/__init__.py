"""Hydra discovers launcher plugins only in the ``hydra_plugins`` namespace; this is moe_hydra's.

The logic lives in :mod:`moe_hydra.launch.slurm`; this module only gives it the name Hydra accepts.
"""

from moe_hydra.launch.slurm import SlurmLauncherImpl


class SlurmLauncher(SlurmLauncherImpl):
    """``hydra/launcher=moe_hydra_slurm`` (selected by ``launcher=slurm``)."""
