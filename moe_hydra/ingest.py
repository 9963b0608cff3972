"""``python -m moe_hydra.ingest {megatron-lm,bridge} [--hardware NAME] (--file PATH | -- WORDS...)``: an existing
Megatron-LM ``pretrain_gpt.py`` command (or Megatron-Bridge override list) as moe_hydra overrides, one per line,
ready for ``python -m moe_hydra`` (the mapping lives in :mod:`moe_hydra.handoff`; docs/handoff.md).

Exit codes: 0 printed; 2 refused (a flag it cannot map, named; an unreadable command), one message, nothing on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = """usage: python -m moe_hydra.ingest {megatron-lm,bridge} [--hardware NAME] (--file PATH | -- WORDS...)

  --file PATH      read the command from a file (- for stdin): what python -m moe_hydra.export printed, or yours
  -- WORDS...      the command as words, e.g. -- $(cat flags) or -- torchrun --nproc-per-node=8 pretrain_gpt.py ...
  --hardware NAME  the hardware preset (the flags do not name the GPU); default: the '# moe_hydra:' line's, else
                   moe_hydra's default

Prints moe_hydra overrides, one per line (mapfile -t ovr < FILE; python -m moe_hydra "${ovr[@]}"), and on stderr
what it inferred or ignored. A flag it cannot map is refused by name. Exit codes: 0 printed, 2 refused."""
EXIT_INVALID = 2


def main(argv: list[str] | None = None) -> int:
    from moe_hydra.handoff import ingest
    from moe_hydra.handoff.table import Refused

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else EXIT_INVALID
    fmt, rest = args[0], args[1:]
    words = None
    if "--" in rest:
        i = rest.index("--")
        rest, words = rest[:i], rest[i + 1:]
    hardware = path = None
    try:
        if fmt not in ("megatron-lm", "bridge"):
            raise Refused(f"unknown format {fmt!r}: megatron-lm or bridge (python -m moe_hydra.ingest --help)")
        while rest:
            opt = rest.pop(0)
            name, eq, val = opt.partition("=")
            if name in ("--hardware", "--file"):
                if not eq:
                    if not rest:
                        raise Refused(f"{name} needs a value")
                    val = rest.pop(0)
                hardware, path = (val, path) if name == "--hardware" else (hardware, val)
            else:
                raise Refused(f"unknown option {opt!r} (the command goes after --; python -m moe_hydra.ingest --help)")
        if (path is None) == (words is None):
            raise Refused("give the command either with --file PATH or after --")
        source = None
        if path is not None:
            try:
                source = sys.stdin.read() if path == "-" else Path(path).read_text()
            except OSError as e:
                raise Refused(f"--file {path}: {e.strerror}") from None
        if words is not None and not words:
            raise Refused("no command after --")
        out = ingest.ingest(fmt, words=words, source=source, hardware=hardware)
    except Refused as e:
        print(f"moe_hydra.ingest: {e}", file=sys.stderr)
        return EXIT_INVALID
    for note in out.notes:
        print(f"moe_hydra.ingest: {note}", file=sys.stderr)
    sys.stdout.write("".join(f"{o}\n" for o in out.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
