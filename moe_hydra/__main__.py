"""``python -m moe_hydra``: as ``moe-hydra`` (:func:`moe_hydra.commands.cli`): a command, or the run command's
overrides."""

from moe_hydra.commands import cli

if __name__ == "__main__":
    cli()
