"""``python -m moe_hydra.export``: the command :mod:`moe_hydra.commands.export` (``moe-hydra export --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("export")
