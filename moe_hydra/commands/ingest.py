"""An existing Megatron-LM pretrain_gpt.py command (or Megatron-Bridge override list) as moe_hydra overrides.

    moe-hydra ingest {megatron-lm,bridge} [--hardware NAME] (--file PATH | -- WORDS...)

  -- WORDS...   the command as words, e.g. -- $(cat flags) or -- torchrun --nproc-per-node=8 pretrain_gpt.py ...

Prints moe_hydra overrides, one per line (mapfile -t ovr < FILE; python -m moe_hydra "${ovr[@]}"), and on stderr
what it inferred or ignored. A flag it cannot map is refused by name. The mapping: docs/handoff.md.

examples:
  moe-hydra export megatron-lm model=qwen3_30b_a3b hardware=h100_sxm expert_mesh=ep8 > train.sh
  moe-hydra ingest megatron-lm --file train.sh > overrides.txt     what moe-hydra export printed, or yours
  moe-hydra ingest bridge --hardware h100_sxm --file -             the override list on stdin
"""

from __future__ import annotations

import argparse
import sys

from moe_hydra.core import io
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
        source = sys.stdin.read() if args.file == "-" else io.read_named(args.file, "--file")
    if words is not None and not words:
        raise Refused("no command after --")
    if source is not None and not source.strip():
        raise Refused(f"--file {args.file}: empty, no command in it")
    try:
        out = ingest.ingest(args.format, words=words, source=source, hardware=args.hardware)
    except Refused as e:
        raise Refused(f"--file {args.file}: {e}" if source is not None else str(e)) from None
    for note in out.notes:
        print(f"moe_hydra.ingest: {note}", file=sys.stderr)
    sys.stdout.write("".join(f"{o}\n" for o in out.overrides))
    return EXIT_OK
