"""``python -m moe_hydra.sweep``: the command :mod:`moe_hydra.commands.sweep` (``moe-hydra sweep --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("sweep")
