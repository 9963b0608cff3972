"""What the commands that read runs share (compare, accept, diff, regress, noise): the runs under their directories,
each counted once, with every warning said; a note per campaign still running; the argparse types of a noise floor
and a margin."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from moe_hydra.analysis import noise as noises
from moe_hydra.analysis.runs import Loaded, Warn, load
from moe_hydra.launch.follow import campaign_notes


def load_runs(name: str, dirs: list[Path], need_steady: bool = True) -> tuple[Loaded, list[str], Warn]:
    """The runs under ``dirs`` (:func:`moe_hydra.analysis.runs.load`; ``need_steady`` as there), the warnings said so
    far, and the function that says one more (on stderr, as ``moe_hydra.<name>: warning: ...``, and kept in the
    list), after a note for each directory that is a campaign still running."""
    for note in campaign_notes([str(d) for d in dirs]):
        print(f"moe_hydra.{name}: note: {note}", file=sys.stderr)
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        print(f"moe_hydra.{name}: warning: {message}", file=sys.stderr)

    return load(dirs, warn, need_steady), warnings, warn


def fraction(text: str) -> float:
    """--noise-floor: a relative noise, 0 <= x < 1 (argparse refuses anything else with exit code 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1), e.g. 0.02")
    return value


def margin(text: str) -> float:
    """--equivalence: a relative margin, "2%" or "0.02" (argparse refuses anything else with exit code 2)."""
    try:
        return noises.relative_margin(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if "margin" in str(e) else f"{text!r} is not a relative margin in "
                                         "(0, 1), e.g. 2% or 0.02") from None


def noise_floor_option(ap: argparse.ArgumentParser) -> None:
    """--noise-floor, as compare, diff and regress take it."""
    ap.add_argument("--noise-floor", type=fraction, help="a declared run-to-run noise for one-run arms, relative, in "
                    "[0, 1), a floor (default: hardware.run_to_run_noise of the runs)")


def out_dir(out: Path | None, dirs: list[Path]) -> Path:
    """--out, else the first directory when it is writable, else the current directory."""
    if out is not None:
        return out
    first = dirs[0]
    return first if first.is_dir() and os.access(first, os.W_OK) else Path.cwd()
