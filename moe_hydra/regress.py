"""``python -m moe_hydra.regress``: the command :mod:`moe_hydra.commands.regress` (``moe-hydra regress --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("regress")
