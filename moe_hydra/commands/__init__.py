"""Every moe_hydra command, one module each, in one pattern.

    moe-hydra [run] [OVERRIDES...] [-m]      python -m moe_hydra [OVERRIDES...] [-m]
    moe-hydra <command> [ARGS...]            python -m moe_hydra.<command> [ARGS...]

A command is a module of this package, named in :data:`COMMANDS` (the one list ``moe-hydra --help`` and the README
name; tests/test_help.py fails on a module missing from it); a module whose name starts with ``_`` is a helper:

- its docstring is its ``--help``, the first line its summary in ``moe-hydra --help``: written for users (what it
  does, then ``examples:``; no reST roles, no internals; ``x`` shows as x), which tests/test_help.py checks;
- ``EXITS`` says what each exit code it can end with means for it (the codes: :mod:`moe_hydra.core.errors`);
- ``arguments(parser)`` adds its arguments to an ``argparse`` parser, and ``run(args)`` does the work, returning an
  exit code (None: 0) or raising :class:`~moe_hydra.core.errors.Refused` (bad input, exit 2) or
  :class:`~moe_hydra.core.errors.Failed` (exit 1), which :func:`run_command` turns into one message and the exit
  code; argparse itself refuses a malformed command line with exit 2; ``TRAILING_WORDS``, when set, names the
  attribute of ``args`` that receives every word after the first ``--``, unparsed (None without one);
- or, for the run command (``python -m moe_hydra``, Hydra's application), ``main(argv)``: Hydra parses its
  overrides and the points' JobReturns add up to its exit code.

``python -m moe_hydra.<command>`` is a two-line module beside this package (:func:`entry`); ``moe-hydra`` and
``python -m moe_hydra`` are :func:`cli`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import signal
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn

import moe_hydra
from moe_hydra.core.errors import (EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Failed, Refused, Terminated, exit_code_help,
                                   raise_interrupted, raise_terminated, signal_exit, signalled)

# In the order moe-hydra --help lists them: the loop's order, then the hand-off and the data
COMMANDS = ("run", "tune", "bisect", "compare", "accept", "steady", "diff", "regress", "noise", "sweep", "export", "ingest",
            "data")


def command(name: str) -> ModuleType:
    """The module of command ``name``."""
    return importlib.import_module(f"moe_hydra.commands.{name}")


def user_text(doc: str | None) -> str:
    """A command's docstring as its users read it: plain text (the reST literal marks ``x`` become x)."""
    return (doc or "").replace("``", "")


def summary(module: ModuleType) -> str:
    """A command's one-line summary: the first line of its docstring."""
    return user_text(module.__doc__).strip().splitlines()[0].rstrip(".")


def parser(name: str, prog: str) -> argparse.ArgumentParser:
    """The argparse parser of command ``name``: its docstring as the description (:func:`user_text`), its exit codes
    as the epilog."""
    module = command(name)
    ap = argparse.ArgumentParser(prog=prog, description=user_text(module.__doc__),
                                 epilog=exit_code_help(module.EXITS, getattr(module, "SIGNALS", False)),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    module.arguments(ap)
    return ap


def run_command(name: str, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run command ``name`` on ``argv``; its exit code. The one place a refusal or a failure becomes a message
    (``moe_hydra.<name>: refused: ...`` on stderr) and an exit code.

    Raises:
        SystemExit: argparse's own exit for ``--help`` (0) or a malformed command line (2), as argparse does.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or f"moe-hydra {name}"
    previous = (signal.signal(signal.SIGTERM, raise_terminated) if threading.current_thread() is threading.main_thread()
                else None)
    try:
        module = command(name)  # inside: Ctrl-C during its imports is an interruption too
        if hasattr(module, "main"):  # the run command: Hydra parses its command line
            return module.main(argv, prog)
        redirect = getattr(module, "redirect", None)
        if redirect and (target := redirect(argv)):  # a spelling kept for another command (compare --accept)
            prog = prog[: -len(name)] + target[0] if prog.endswith(name) else prog
            name, argv = target
            module = command(name)
        trailing = getattr(module, "TRAILING_WORDS", None)
        words = None
        if trailing and "--" in argv:
            argv, words = argv[:argv.index("--")], argv[argv.index("--") + 1:]
        args = parser(name, prog).parse_args(argv)
        if trailing:
            setattr(args, trailing, words)
        code = module.run(args)
    except Refused as e:
        print(f"moe_hydra.{name}: refused: {e}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except Failed as e:
        print(f"moe_hydra.{name}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except (KeyboardInterrupt, Terminated) as e:
        return _stopped(name, e)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_OK if code is None else code


def _stopped(name: str, signal_: KeyboardInterrupt | Terminated) -> int:
    """Command ``name`` stopped by Ctrl-C or SIGTERM: its one line, and its exit code (130, 143)."""
    if isinstance(signal_, Terminated):
        print(f"moe_hydra.{name}: terminated (SIGTERM)", file=sys.stderr, flush=True)
        return signal_exit("SIGTERM")
    print(f"moe_hydra.{name}: interrupted", file=sys.stderr, flush=True)
    return signal_exit("SIGINT")


def _exit(code: int) -> None:
    """End the process with ``code``: the command has ended, so a SIGINT or SIGTERM that comes now is held back
    (blocked) rather than killing the interpreter on its way out, which would replace the code with a death by
    signal."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(code)


def finish(name: str, run: Callable[[], int | None]) -> NoReturn:
    """End the process with the exit code of ``run`` (a command): argparse's own exit (``--help``, a malformed command
    line) included, and with the command's SIGTERM handling kept until the process is on its way out, so that a
    signal coming just as the command ends (its own handler restored) is still its ending — one line, 130 or 143 —
    never a death by signal while the interpreter shuts down."""
    if threading.current_thread() is threading.main_thread():  # in place of those of its start (moe_hydra/__init__)
        if signal.getsignal(signal.SIGINT) in (moe_hydra._stopped_while_starting, signal.default_int_handler):
            signal.signal(signal.SIGINT, raise_interrupted)
        signal.signal(signal.SIGTERM, raise_terminated)
    try:
        code = run()
    except SystemExit as e:  # argparse: 0 for --help, 2 for a malformed command line
        if not (isinstance(e.code, int) or e.code is None):  # sys.exit("message"), as Python ends it
            print(e.code, file=sys.stderr, flush=True)
        code = e.code if isinstance(e.code, int) or e.code is None else EXIT_FAILED
    except (KeyboardInterrupt, Terminated) as e:
        code = _stopped(name, e)
    except Exception as e:
        stop = _signal_behind(e) or signalled()
        if stop is None:
            raise
        code = _stopped(name, stop)
    _exit(EXIT_OK if code is None else code)


def _signal_behind(e: BaseException) -> KeyboardInterrupt | Terminated | None:
    """The signal's exception that ``e`` was raised while handling, if any. A signal can land inside an import and
    leave a half-initialized module behind, whose next use fails with an error of its own (CI saw a SIGTERM during
    torch's import of ``numpy.linalg`` end in a RecursionError): that error is the signal's ending, one line and
    130 / 143, not a traceback. Where the chain no longer holds it (CI saw that too), :func:`signalled` does."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, (KeyboardInterrupt, Terminated)):
            return e
        seen.add(id(e))
        e = e.__context__
    return None


def entry(name: str) -> None:
    """``python -m moe_hydra.<name>``: the command, then its exit code."""
    finish(name, lambda: run_command(name, sys.argv[1:], prog=f"python -m moe_hydra.{name}"))


def overview() -> str:
    """``moe-hydra --help``: every command with its summary, then the exit codes."""
    width = max(map(len, COMMANDS))
    lines = ["usage: moe-hydra [run] [OVERRIDES...] [-m]     (python -m moe_hydra ...)",
             "       moe-hydra COMMAND [ARGS...]             (python -m moe_hydra.COMMAND ...)", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary(command(name))}" for name in COMMANDS]
    lines += ["", "moe-hydra COMMAND --help says more of each; moe-hydra run --help the config groups and keys.",
              "", exit_code_help({EXIT_OK: "done", EXIT_FAILED: "a job, point or write started and failed",
                                  EXIT_REFUSED: "bad input, refused before anything started"}, signals=True)]
    return "\n".join(lines)


def cli() -> None:
    """``moe-hydra`` and ``python -m moe_hydra``: ``COMMAND ARGS...`` runs a command; anything else (overrides,
    Hydra's flags, nothing) is the run command's."""
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):  # the commands, then the run command's config groups and keys
        print(overview() + "\n\n== The run command (python -m moe_hydra, moe-hydra run) ==\n", flush=True)
        finish("run", lambda: run_command("run", ["--help"]))
    if args and args[0] in COMMANDS:
        finish(args[0], lambda: run_command(args[0], args[1:], prog=f"moe-hydra {args[0]}"))
    if args and not args[0].startswith(("-", "+", "~")) and "=" not in args[0]:
        close = difflib.get_close_matches(args[0], COMMANDS, n=1)
        hint = f"; did you mean 'moe-hydra {close[0]}'?" if close else ""
        print(f"moe_hydra: unknown command {args[0]!r}{hint} (moe-hydra --help lists them; an override reads "
              "key=value)", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    finish("run", lambda: run_command("run", args, prog="python -m moe_hydra"))
