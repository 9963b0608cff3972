"""``python -m moe_hydra.tune``: the command :mod:`moe_hydra.commands.tune` (``moe-hydra tune --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("tune")
