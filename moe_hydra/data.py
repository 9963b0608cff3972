"""``python -m moe_hydra.data``: the command :mod:`moe_hydra.commands.data` (``moe-hydra data --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("data")
