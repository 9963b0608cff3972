"""``python -m moe_hydra.accept``: the command :mod:`moe_hydra.commands.accept` (``moe-hydra accept --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("accept")
