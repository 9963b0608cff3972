"""``python -m moe_hydra.noise``: the command :mod:`moe_hydra.commands.noise` (``moe-hydra noise --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("noise")
