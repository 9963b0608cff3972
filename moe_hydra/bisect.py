"""``python -m moe_hydra.bisect``: the command :mod:`moe_hydra.commands.bisect` (``moe-hydra bisect --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("bisect")
