"""``python -m moe_hydra.data prepare``: text files -> a Megatron indexed dataset the job trains on (docs/data.md).

    python -m moe_hydra.data prepare --out DIR/NAME [--tokenizer bytes] [--documents file|paragraph] FILE...

writes ``DIR/NAME.bin`` and ``DIR/NAME.idx`` with Megatron-Core's own ``IndexedDatasetBuilder`` (the format
Megatron-LM's ``tools/preprocess_data.py`` writes, in the smallest dtype that holds the vocabulary: uint16 for the
byte-level tokenizer) and ``DIR/NAME.tokenizer.json``, the tokenizer it was made with (``vocab_size``, ``eod``,
``pad``), which the job and the plan read. The tokenizer works offline: byte-level, ids 0..255 the UTF-8 bytes of
the text, 256 the end of a document (appended to each, as ``--append-eod`` does), 257 padding. One document per
file, or per paragraph (text between blank lines). It prints the prefix to pass as ``data.path`` and the counts.

Exit codes: 0 written; 2 bad input (a missing or unreadable input file, no text at all, an output that cannot be
written), with one message and nothing written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

EXIT_INVALID = 2


def _documents(text: str, per: str) -> list[str]:
    if per == "file":
        return [text] if text.strip() else []
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def prepare(files: list[str], out: str, tokenizer: str = "bytes", documents: str = "file") -> dict:
    """Tokenize ``files`` into the dataset ``out`` (a prefix); returns its counts.

    Raises:
        ValueError: an input is missing, unreadable or not UTF-8, there is no text, or the output cannot be written.
    """
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise ValueError(f"input file{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)}; nothing was "
                         "written")
    if tokenizer != "bytes":
        raise ValueError(f"--tokenizer {tokenizer}: the byte-level tokenizer (bytes) is the one this command has")
    texts = []
    for f in files:
        try:
            texts.append(Path(f).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{f} cannot be read as UTF-8 text ({e}); nothing was written") from None
    docs = [d for t in texts for d in _documents(t, documents)]
    if not docs:
        raise ValueError(f"no text in {', '.join(files)}; nothing was written")
    prefix = Path(out)
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create {prefix.parent}: {e.strerror or e}") from None

    import warnings

    import numpy

    with warnings.catch_warnings():  # Megatron-Core's notes on kernels it falls back from: nothing this command uses
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from moe_hydra.job.data import DatasetTokenizer

    tok = DatasetTokenizer.bytes()
    dtype = DType.optimal_dtype(tok.vocab_size)
    tokens = 0
    try:
        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
        for doc in docs:
            ids = numpy.asarray(tok.tokenize(doc) + [tok.eod], dtype=dtype)
            builder.add_document(ids, [ids.size])
            tokens += ids.size
        builder.finalize(f"{prefix}.idx")
        description = {**tok.description(), "made_by": "python -m moe_hydra.data prepare", "dtype": numpy.dtype(dtype).name,
                       "documents": len(docs), "tokens": tokens, "inputs": [Path(f).name for f in files]}
        Path(f"{prefix}.tokenizer.json").write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write the dataset: {e.strerror or e}") from None
    return {"prefix": str(prefix), "documents": len(docs), "tokens": tokens, "dtype": numpy.dtype(dtype).name,
            "vocab_size": tok.vocab_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_hydra.data",
                                     description="Prepare Megatron indexed datasets for data.kind=megatron.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="text files -> PREFIX.bin, PREFIX.idx, PREFIX.tokenizer.json")
    p.add_argument("--out", required=True, help="the dataset prefix to write, DIR/NAME")
    p.add_argument("--tokenizer", default="bytes", choices=["bytes"], help="byte-level (vocabulary 258; default)")
    p.add_argument("--documents", default="file", choices=["file", "paragraph"],
                   help="one document per file (default) or per paragraph")
    p.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files")
    args = parser.parse_args(argv)
    try:
        made = prepare(args.files, args.out, args.tokenizer, args.documents)
    except ValueError as e:
        print(f"moe_hydra.data: {e}", file=sys.stderr)
        return EXIT_INVALID
    docs = f"{made['documents']} document{'s' if made['documents'] != 1 else ''}"
    print(f"prefix {made['prefix']}: {made['tokens']} tokens in {docs} ({made['dtype']}, vocabulary {made['vocab_size']})")
    print(f'train on it: python -m moe_hydra data.kind=megatron "data.path=[{made["prefix"]}]"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
