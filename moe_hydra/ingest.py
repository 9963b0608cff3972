"""``python -m moe_hydra.ingest``: the command :mod:`moe_hydra.commands.ingest` (``moe-hydra ingest --help``)."""

from moe_hydra.commands import entry

if __name__ == "__main__":
    entry("ingest")
