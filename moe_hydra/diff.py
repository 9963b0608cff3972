"""``python -m moe_hydra.diff``: the command :mod:`moe_hydra.commands.diff` (``moe-hydra diff --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("diff")
