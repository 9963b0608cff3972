"""moe_hydra: plan, run and compare Mixture-of-Experts training on Megatron-Core, with Hydra.

The layers, imported one way (tests/test_architecture.py): the pure core (``moe_hydra.core``: the schema, arch,
layout, pipeline, FLOPs, parameters, contract, statistics; no torch or megatron) <- planning (``moe_hydra.planning``:
the rules, the memory estimate, the step model, the layout search, the plan) <- the job (``moe_hydra.job``, the one
place that builds a Megatron-Core model) and the launchers (``moe_hydra.launch``) <- the commands
(``moe_hydra.commands``, each reachable as ``python -m moe_hydra.<name>`` and ``moe-hydra <name>``); the analysis
(``moe_hydra.analysis``) reads files. docs/architecture.md draws it.
"""

__version__ = "0.1.0"


def _starting_command() -> str | None:
    """The command this process is starting (``python -m moe_hydra[.<command>]``, ``moe-hydra [<command>]``), or None
    when moe_hydra is imported otherwise (a library, a test, a job's process)."""
    import sys

    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] == ["-m"] and "-m" in argv:  # runpy is still finding the module: this package's import
        module = argv[argv.index("-m") + 1] if argv.index("-m") + 1 < len(argv) else ""
        parts = module.split(".")
        return None if parts[0] != "moe_hydra" or len(parts) > 2 else (parts[1] if len(parts) == 2 else "run")
    if sys.argv[:1] and sys.argv[0].rsplit("/", 1)[-1] == "moe-hydra":
        return sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].isidentifier() else "run"
    return None


def _stopped_while_starting(signum: int, frame: object) -> None:
    """A command's SIGINT or SIGTERM before its own handling is in place (:func:`moe_hydra.commands.finish`): while
    Python imports its modules nothing has started, so it ends here with its one line and 130 / 143, as a command
    stopped later does, rather than a traceback from whatever import the signal landed in (CI saw one in
    ``import signal``) or a death by signal."""
    import os

    said = "interrupted" if signum == _signal.SIGINT else "terminated (SIGTERM)"
    os.write(2, f"moe_hydra.{_COMMAND}: {said}\n".encode())
    os._exit(128 + signum)


_COMMAND = _starting_command()
if _COMMAND is not None:
    import _signal  # the C module, imported in no time: signal.py's enums take long enough for a signal to land in

    # where Python's own handling is in place (a signal ignored by the parent, say nohup's, stays ignored)
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _stopped_while_starting)
    if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGTERM, _stopped_while_starting)
