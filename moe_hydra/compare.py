"""``python -m moe_hydra.compare``: the command :mod:`moe_hydra.commands.compare` (``moe-hydra compare --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("compare")
