"""An existing Megatron-LM pretrain_gpt.py command (or Megatron-Bridge override list) as moe_hydra overrides.

    moe-hydra ingest {megatron-lm,bridge} [--hardware NAME] (--file PATH | -- WORDS...)

  -- WORDS...   the command as words, e.g. -- $(cat flags) or -- torchrun --nproc-per-node=8 pretrain_gpt.py ...

Prints moe_hydra overrides, one per line (mapfile -t ovr < FILE; python -m moe_hydra "${ovr[@]}"), and on stderr
what it inferred or ignored. A flag it cannot map is refused by name. The mapping: :mod:`moe_hydra.handoff`
(docs/handoff.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED, Refused

TRAILING_WORDS = "words"  # everything after the first --, unparsed: the command being ingested
EXITS = {EXIT_OK: "printed", EXIT_REFUSED: "refused: a flag it cannot map (named), an unreadable command; one "
         "message, nothing on stdout"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("format", choices=("megatron-lm", "bridge"), help="the command's kind")
    ap.add_argument("--hardware", metavar="NAME", help="the hardware preset (the flags do not name the GPU); default: "
                    "the '# moe_hydra:' line's, else moe_hydra's default")
    ap.add_argument("--file", metavar="PATH", help="read the command from a file (- for stdin): what moe-hydra export "
                    "printed, or yours")


def run(args: argparse.Namespace) -> int:
    from moe_hydra.handoff import ingest

    words = args.words  # None without --
    if (args.file is None) == (words is None):
        raise Refused("give the command either with --file PATH or after --")
    source = None
    if args.file is not None:
        try:
            source = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        except OSError as e:
            raise Refused(f"--file {args.file}: {e.strerror}") from None
    if words is not None and not words:
        raise Refused("no command after --")
    out = ingest.ingest(args.format, words=words, source=source, hardware=args.hardware)
    for note in out.notes:
        print(f"moe_hydra.ingest: {note}", file=sys.stderr)
    sys.stdout.write("".join(f"{o}\n" for o in out.overrides))
    return EXIT_OK
