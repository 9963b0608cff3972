"""Small Megatron indexed datasets written with the standard library (the format of
megatron/core/datasets/indexed_dataset.py: <prefix>.bin, the token ids; <prefix>.idx, the index), for tests that
must not import torch or megatron (the rules' cases) and for files Megatron-Core's own builder would not write
(a corrupt index)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

MAGIC = b"MMIDIDX\x00\x00"
_DTYPES = {"uint8": (1, "B", 1), "int32": (4, "i", 4), "uint16": (8, "H", 2)}


def write_dataset(prefix: str | Path, docs: list[list[int]], dtype: str = "uint16",
                  tokenizer: dict | None = None) -> str:
    """One sequence per document, as ``IndexedDatasetBuilder.add_document`` writes it; ``tokenizer``: the
    ``<prefix>.tokenizer.json`` to write next to it (none when None). Returns the prefix."""
    prefix = str(prefix)
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    code, fmt, size = _DTYPES[dtype]
    lengths = [len(d) for d in docs]
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += n * size
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack(f"<{len(d)}{fmt}", *d))
    s = len(docs)
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, code, s, s + 1))
        f.write(struct.pack(f"<{s}i", *lengths) + struct.pack(f"<{s}q", *pointers)
                + struct.pack(f"<{s + 1}q", *range(s + 1)))
    if tokenizer is not None:
        Path(prefix + ".tokenizer.json").write_text(json.dumps(tokenizer))
    return prefix


def text_docs(n: int = 4, length: int = 600) -> list[list[int]]:
    """``n`` documents of byte-level ids (each ending in the end-of-document id 256)."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_bytes()
    return [list(text[i * length:(i + 1) * length]) + [256] for i in range(n)]


BYTES = {"tokenizer": "bytes", "vocab_size": 258, "eod": 256, "pad": 257}


def rule_datasets(root: str | Path) -> dict[str, str]:
    """The prefixes the data rules' cases name: ``bytes`` (valid, byte-level tokenizer), ``wide`` (no tokenizer,
    ids up to 2000), ``one_doc`` (a single document), ``corrupt`` (an index without Megatron's magic),
    ``mismatch`` (an index whose sequences do not end where its .bin does)."""
    root = Path(root)
    out = {"bytes": write_dataset(root / "bytes", text_docs(), tokenizer=BYTES),
           "wide": write_dataset(root / "wide", [[1, 2, 2000, 3] * 50]),
           "one_doc": write_dataset(root / "one_doc", text_docs(1), tokenizer=BYTES)}
    out["corrupt"] = write_dataset(root / "corrupt", text_docs(2), tokenizer=BYTES)
    Path(out["corrupt"] + ".idx").write_bytes(b"not an index" + bytes(40))
    out["mismatch"] = write_dataset(root / "mismatch", text_docs(2), tokenizer=BYTES)
    with open(out["mismatch"] + ".bin", "ab") as f:
        f.write(b"\x00\x00")
    return out


def write_calibration(path: str | Path, r, machine: dict | None = None, implementation: dict | None = None,
                      coefficients: dict | None = None, variants: list | None = None,
                      measurements: list | None = None, expert_rows: dict | None = None) -> str:
    """A calibration.json as ``stage=calibrate`` writes it for the resolved plan ``r`` (a CPU, 1 process, its
    implementation, what its step holds for, one fit on ``r``'s layout with ``r``'s recompute and dispatcher),
    without measuring: the rules' and the plan's input. ``coefficients``: the fit's (10 ms a step and 5 ms a layer
    when None); ``variants``: its variants' records (group, option, config, deltas, held_out);
    ``measurements``: its measurement rows (none when None); ``expert_rows``: the step's (none when None)."""
    from dataclasses import asdict

    from moe_hydra.core import calibrated_step as cs

    impl = {**asdict(r.impl), "cuda_graph_scope": list(r.impl.cuda_graph_scope)}
    held = {"median": 0.05, "p90": 0.1, "worst": 0.2, "points": 12}
    layout = {"layout": cs.layout_of(r), "held_out": held, "variants": variants or [],
              "settings": {g: {"option": getattr(r.cfg, g).name, "config": cs.group_config(r.cfg, g)}
                           for g in cs.VARIANT_GROUPS},
              "coefficients": coefficients or {**dict.fromkeys(cs.TERMS, 0.0), "per_step": 0.01, "per_layer": 0.005}}
    record = {"calibration_version": cs.VERSION,
              "machine": machine or {"device": "x86_64", "device_type": "cpu", "processes": 1, "torch": None,
                                     "megatron_core": None},
              "implementation": implementation or impl, "model": r.cfg.model.name,
              "step": {"form": cs.FORM, "holds": cs.holds(r), "held_out": held, "layouts": [layout],
                       "expert_rows": expert_rows},
              "measurements": measurements or []}
    Path(path).write_text(json.dumps(record))
    return str(path)
