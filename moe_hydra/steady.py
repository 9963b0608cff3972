"""``python -m moe_hydra.steady``: the command :mod:`moe_hydra.commands.steady` (``moe-hydra steady --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("steady")
