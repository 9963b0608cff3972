"""How every moe_hydra command ends, defined once: the exit codes and the two exceptions behind them.

Every layer raises :class:`Refused` for input it will not act on (a broken rule, an unreadable file, a flag that
cannot be mapped, a directory that holds another sweep) and :class:`Failed` for work that started and did not
complete. One place turns them into a message and an exit code: :func:`moe_hydra.commands.run_command` for the
commands, :class:`moe_hydra.commands.run.Outcomes` for the points of a run or sweep (whose JobReturns carry them).
A signal ends a command with the shell's convention, 128 + its number (:func:`signal_exit`).

Pure: standard library only.
"""

from __future__ import annotations

import signal

EXIT_OK = 0  # done
EXIT_FAILED = 1  # started and did not complete (a job, a point, a file that could not be written)
EXIT_REFUSED = 2  # bad input: refused before anything of it started; one message names what to change
EXIT_REGRESSED = 3  # compare's regression check (moe-hydra regress) found a run that regressed
EXIT_NOT_STEADY = 4  # moe-hydra steady found a run whose window is not steady
EXIT_SIGNAL_BASE = 128  # + the signal's number: SIGINT 130, SIGTERM 143, SIGUSR2 140

MEANINGS = {  # what each means for the run command; the others say what it means for them (their EXITS)
    EXIT_OK: "done: every point completed or was planned",
    EXIT_FAILED: "a job started and failed (whatever else was refused)",
    EXIT_REFUSED: "bad input, refused before anything of it started: an unknown key or option, an override Hydra "
                  "cannot read or compose, a broken rule, a sweep directory that holds another sweep (one message "
                  "names the override to change; in a sweep the other points still run)",
    EXIT_REGRESSED: "a run regressed against the baseline",
    EXIT_NOT_STEADY: "a run's window is not steady",
}


class Refused(ValueError):
    """Bad input: nothing of it started. The message says what is wrong and names what to change.

    ``state``: the word a sweep's points use for it (sweep.json, ``moe-hydra sweep status``)."""

    state = "INVALID"


class Failed(Exception):
    """Work that started and did not complete; ``state`` is Slurm's word for it where Slurm decided (TIMEOUT,
    NODE_FAIL, ...), else FAILED."""

    def __init__(self, message: str, state: str = "FAILED"):
        super().__init__(message)
        self.state = state


class Terminated(BaseException):
    """SIGTERM to a command, raised where the command was (as Ctrl-C raises KeyboardInterrupt, and like it not an
    Exception: an ``except Exception`` does not swallow it), so that it ends the same way: its ``finally`` blocks
    run, one line, 143. A job's own handlers (the local launcher's, a rank's) take over while it trains."""


_signalled: list[KeyboardInterrupt | Terminated] = []  # what the handlers below raised in this process, in order


def raise_terminated(signum: int, frame) -> None:
    """The SIGTERM handler a command runs under: :class:`Terminated` where it was, recorded (:func:`signalled`)."""
    _signalled.append(Terminated())
    raise _signalled[-1]


def raise_interrupted(signum: int, frame) -> None:
    """The SIGINT handler a command runs under: Python's own (KeyboardInterrupt where it was), recorded."""
    _signalled.append(KeyboardInterrupt())
    raise _signalled[-1]


def signalled() -> KeyboardInterrupt | Terminated | None:
    """The last SIGINT / SIGTERM this process's command handlers raised, if any. A signal can land where its
    exception is lost or replaced — inside an import, whose half-initialized module then fails on its own (CI saw a
    SIGTERM in torch's import of ``numpy.linalg`` end in a RecursionError whose context no longer held it) — so the
    record, not the exception in hand, says that the command was stopped."""
    return _signalled[-1] if _signalled else None


def signal_exit(signame: str) -> int:
    """The exit code of a command a signal stopped: 128 + the signal's number (SIGTERM -> 143)."""
    return EXIT_SIGNAL_BASE + signal.Signals[signame].value


def exit_code_lines(meanings: dict[int, str], signals: bool = False, indent: str = "  ") -> str:
    """The exit codes a command ends with, one per line, as its ``--help`` lists them; ``meanings`` says what each
    means for it (keys are this module's codes), ``signals`` adds the 128 + n of a stopped job."""
    unknown = set(meanings) - set(MEANINGS)
    if unknown:
        raise KeyError(f"exit codes {sorted(unknown)} are not defined in moe_hydra.core.errors")
    lines = [f"{indent}{code}  {meanings[code]}" for code in sorted(meanings)]
    if signals:
        lines.append(f"{indent}{EXIT_SIGNAL_BASE}+n  a signal stopped the job (SIGINT 130, SIGTERM 143, SIGUSR2 140); "
                     "results.json holds the steps measured so far")
    return "\n".join(lines)


def exit_code_help(meanings: dict[int, str], signals: bool = False) -> str:
    """:func:`exit_code_lines` under the heading an argparse epilog gives them."""
    return "exit codes:\n" + exit_code_lines(meanings, signals)
