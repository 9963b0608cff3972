"""Prepare a Megatron indexed dataset from text files, for data.kind=megatron (docs/data.md).

    moe-hydra data prepare --out DIR/NAME [--tokenizer bytes] [--documents file|paragraph] FILE...

writes ``DIR/NAME.bin`` and ``DIR/NAME.idx`` with Megatron-Core's own ``IndexedDatasetBuilder`` (the format
Megatron-LM's ``tools/preprocess_data.py`` writes, in the smallest dtype that holds the vocabulary: uint16 for the
byte-level tokenizer) and ``DIR/NAME.tokenizer.json``, the tokenizer it was made with (``vocab_size``, ``eod``,
``pad``), which the job and the plan read. The tokenizer works offline: byte-level, ids 0..255 the UTF-8 bytes of
the text, 256 the end of a document (appended to each, as ``--append-eod`` does), 257 padding. One document per
file, or per paragraph (text between blank lines). It prints the prefix to pass as ``data.path`` and the counts.

examples:
  moe-hydra data prepare --out data/docs docs/*.md README.md
  python -m moe_hydra data.kind=megatron "data.path=[data/docs]"     train on it
"""

from __future__ import annotations

import argparse

from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED

EXITS = {EXIT_OK: "written", EXIT_REFUSED: "bad input (a missing or unreadable input file, no text at all, an "
         "output that cannot be written), with one message and nothing written"}


def arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="text files -> PREFIX.bin, PREFIX.idx, PREFIX.tokenizer.json")
    p.add_argument("--out", required=True, help="the dataset prefix to write, DIR/NAME (not a directory)")
    p.add_argument("--tokenizer", default="bytes", choices=["bytes"], help="byte-level (vocabulary 258; default)")
    p.add_argument("--documents", default="file", choices=["file", "paragraph"],
                   help="one document per file (default) or per paragraph")
    p.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files")


def run(args: argparse.Namespace) -> int:
    from moe_hydra.launch.local import importable

    importable("data prepare (Megatron-Core's IndexedDatasetBuilder)", instead="")
    from moe_hydra.job.data import prepare

    made = prepare(args.files, args.out, args.tokenizer, args.documents)
    docs = f"{made['documents']} document{'s' if made['documents'] != 1 else ''}"
    print(f"prefix {made['prefix']}: {made['tokens']} tokens in {docs} ({made['dtype']}, vocabulary {made['vocab_size']})")
    print(f'train on it: python -m moe_hydra data.kind=megatron "data.path=[{made["prefix"]}]"')
    return EXIT_OK
