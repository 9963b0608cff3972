"""Training data for the job (docs/data.md): :func:`make_data` builds what ``data.kind`` names.

Both kinds answer ``batch(step, dp_rank, microbatch) -> (tokens, labels)``, each ``[micro_batch_size,
seq_length]``, and both draw global sample ``step * GBS + (dp_rank * microbatches + microbatch) * MBS + i``: sample
k of step s is the same tokens whatever TP/EP/DP is, so loss curves compare across layouts.

- ``data.kind=mock`` (:class:`MockData`, benchmark-only): arithmetic token sequences, ``(start + stride * i) %
  vocab``, with start and stride drawn per sample from a generator seeded by (seed, global sample index). Cheap,
  learnable, so the loss falls over the first steps.
- ``data.kind=megatron`` (:class:`MegatronData`): Megatron's indexed ``.bin``/``.idx`` datasets through
  Megatron-Core's own ``BlendedMegatronDatasetBuilder`` and ``GPTDataset``, as production runs read them:
  ``data.path`` in ``--data-path`` form (prefixes, optionally with blend weights), the train part of
  ``data.split``, shuffled by ``data.seed``, ``train_iters x GBS`` samples. The job uses the samples' tokens and
  labels; its loss is the mean over every token, which is GPTDataset's loss mask under Megatron's defaults
  (no ``--eod-mask-loss``, no ``--reset-position-ids``/``--reset-attention-mask``: the job's causal mask and
  positions ``0..seq-1`` are exactly what GPTDataset builds then).

The tokenizer GPTDataset reads (``eod``, ``pad``, ``vocab_size``) is :class:`DatasetTokenizer`, described by
``<prefix>.tokenizer.json`` next to the dataset (written by ``python -m moe_hydra.data prepare``); a dataset
made by another tool has none, and then no id is special (Megatron's defaults need none).

:func:`prepare` is ``moe-hydra data prepare``'s work: text files tokenized into such a dataset with Megatron-Core's
own ``IndexedDatasetBuilder``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moe_hydra.core.errors import Refused

# The byte-level tokenizer of ``python -m moe_hydra.data prepare``: ids 0..255 are the bytes of the UTF-8 text,
# then the end-of-document and padding ids.
BYTES = {"tokenizer": "bytes", "vocab_size": 258, "eod": 256, "pad": 257}
# Megatron-Core's stand-in pad id when a tokenizer has none (megatron.core.datasets.megatron_dataset._PAD_TOKEN_ID)
NO_PAD = -1


@dataclass
class MockData:
    vocab_size: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    microbatches: int  # per data-parallel rank and step (the resolved batch's micro_batches_per_step)
    seed: int

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start = torch.randint(0, self.vocab_size, (1,), generator=g)
        stride = torch.randint(1, 8, (1,), generator=g)
        return (start + stride * torch.arange(self.seq_length + 1)) % self.vocab_size

    def batch(self, step: int, dp_rank: int, microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, labels) of shape [micro_batch_size, seq_length] for one micro-batch."""
        first = step * self.global_batch_size + (dp_rank * self.microbatches + microbatch) * self.micro_batch_size
        seqs = torch.stack([self.sample(first + i) for i in range(self.micro_batch_size)])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


class DatasetTokenizer:
    """The tokenizer a dataset was made with, as Megatron-Core's datasets use it: the interface of
    ``megatron.core.tokenizers.MegatronTokenizerBase`` (``tokenize``, ``detokenize``, ``vocab``, ``vocab_size``,
    ``apply_chat_template``) with the ``eod`` and ``pad`` ids GPTDataset reads, and ``unique_identifiers`` for its
    cache key. Encodes text only as the byte-level tokenizer (:data:`BYTES`); a description of another tokenizer
    gives its ids, for reading."""

    def __init__(self, description: dict[str, Any] | None):
        d = dict(description or {})
        self.name = d.get("tokenizer") or "unknown"
        self._vocab_size = d.get("vocab_size")
        self._eod = d.get("eod")
        self._pad = NO_PAD if d.get("pad") is None else d["pad"]
        self.path = ""
        self.unique_identifiers = {"class": type(self).__name__, "tokenizer": self.name,
                                   "vocab_size": self._vocab_size, "eod": self._eod, "pad": self._pad}

    @classmethod
    def bytes(cls) -> DatasetTokenizer:
        return cls(BYTES)

    def description(self) -> dict[str, Any]:
        """What ``<prefix>.tokenizer.json`` holds (moe_hydra.core.contract.read_tokenizer reads it)."""
        return {"tokenizer": self.name, "vocab_size": self._vocab_size, "eod": self._eod,
                "pad": None if self._pad == NO_PAD else self._pad}

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def eod(self) -> int | None:
        return self._eod

    @property
    def pad(self) -> int:
        return self._pad

    @property
    def vocab(self) -> dict[str, int]:
        if self.name != "bytes":
            raise NotImplementedError(f"the vocabulary of tokenizer {self.name!r} is not known here")
        return {**{chr(b) if 32 <= b < 127 else f"<0x{b:02X}>": b for b in range(256)}, "<eod>": self._eod,
                "<pad>": self._pad}

    def tokenize(self, text: str) -> list[int]:
        if self.name != "bytes":
            raise NotImplementedError(f"moe_hydra encodes with the byte-level tokenizer only, not {self.name!r}")
        return list(text.encode("utf-8"))

    def detokenize(self, ids) -> str:
        if self.name != "bytes":
            raise NotImplementedError(f"moe_hydra decodes with the byte-level tokenizer only, not {self.name!r}")
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, *args, **kwargs):
        raise NotImplementedError("pretraining data has no chat template")


def tokenizer_for(prefixes: list[str]) -> DatasetTokenizer:
    """The tokenizer of a blend: the one its prefixes' descriptions agree on (rule D06 refuses blends that
    disagree before the job starts), else one that makes no id special."""
    from moe_hydra.core import contract

    found = {tuple(sorted(d.items())) for p in prefixes if (d := contract.read_tokenizer(p)) is not None}
    return DatasetTokenizer(dict(next(iter(found))) if len(found) == 1 else None)


class MegatronData:
    """``data.kind=megatron``: Megatron-Core's GPTDataset (a BlendedDataset over several prefixes) over the train
    part of ``data.split``, ``samples`` long; built on every rank by BlendedMegatronDatasetBuilder, which builds
    and caches the sample indices on rank 0 first, then (after a barrier) loads them on the others.

    Every rank of the job must construct it (the build holds barriers on the default process group)."""

    def __init__(self, data: Any, *, vocab_size: int, seq_length: int, micro_batch_size: int,
                 global_batch_size: int, microbatches: int, samples: int, cache_dir: str):
        import logging

        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.utils import get_blend_from_list

        self.vocab_size, self.seq_length = vocab_size, seq_length
        self.micro_batch_size, self.global_batch_size, self.microbatches = micro_batch_size, global_batch_size, microbatches
        prefixes, weights = get_blend_from_list([str(x) for x in data.path])
        self.prefixes = prefixes
        self.tokenizer = tokenizer_for(prefixes)
        logging.getLogger("megatron.core.datasets").setLevel(logging.WARNING)  # per-file index logs: not metrics
        config = GPTDatasetConfig(
            random_seed=data.seed,
            sequence_length=seq_length,
            blend=(prefixes, weights),
            split=data.split,
            path_to_cache=cache_dir,
            mmap_bin_files=data.mmap_bin_files,
            tokenizer=self.tokenizer,
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,  # the job builds its own causal mask (or TE's kernels need none)
        )
        # The job trains on the train part only: Megatron's split keeps its documents, and the valid and test
        # parts (which Megatron-LM builds for evaluation) are not built.
        config.split_matrix = [config.split_matrix[0], None, None]
        os.makedirs(cache_dir, exist_ok=True)
        train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True, config).build()
        if train is None or len(train) < samples:
            raise RuntimeError(f"data.path {list(data.path)}: Megatron-Core built {0 if train is None else len(train)} "
                               f"train samples, the run needs {samples}")
        self.dataset = train

    def batch(self, step: int, dp_rank: int, microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, labels) of shape [micro_batch_size, seq_length] for one micro-batch."""
        first = step * self.global_batch_size + (dp_rank * self.microbatches + microbatch) * self.micro_batch_size
        samples = [self.dataset[first + i] for i in range(self.micro_batch_size)]
        tokens = torch.stack([s["tokens"] for s in samples])
        labels = torch.stack([s["labels"] for s in samples])
        top = int(torch.maximum(tokens.max(), labels.max()))
        if top >= self.vocab_size:  # the plan checks what it can read; a large .bin without a tokenizer, here
            raise ValueError(f"data.path {self.prefixes} holds token id {top}, not below model.vocab_size="
                             f"{self.vocab_size} (sample {first}..{first + self.micro_batch_size - 1} of step "
                             f"{step + 1}): train with the tokenizer's vocabulary size")
        return tokens, labels


def make_data(r: Any, out_dir: Path | str) -> MockData | MegatronData:
    """The data of the resolved plan ``r`` (:class:`~moe_hydra.core.resolved.Resolved`) for ``r.train_iters`` steps;
    a megatron dataset caches its sample indices in ``data.path_to_cache`` or ``<out_dir>/data_cache``."""
    cfg, batch = r.cfg, r.batch
    if cfg.data.kind == "megatron":
        return MegatronData(cfg.data, vocab_size=cfg.model.vocab_size, seq_length=batch.seq_length,
                            micro_batch_size=batch.micro_batch_size, global_batch_size=batch.global_batch_size,
                            microbatches=batch.micro_batches_per_step,
                            samples=r.train_iters * batch.global_batch_size,
                            cache_dir=cfg.data.path_to_cache or str(Path(out_dir) / "data_cache"))
    return MockData(cfg.model.vocab_size, batch.seq_length, batch.micro_batch_size, batch.global_batch_size,
                    batch.micro_batches_per_step, cfg.data.seed)


# ----------------------------------------------------------------------------- moe-hydra data prepare

def _documents(text: str, per: str) -> list[str]:
    if per == "file":
        return [text] if text.strip() else []
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


DATASET_FILES = (".bin", ".idx", ".tokenizer.json")  # what prepare writes beside a prefix, in the order it renames


def _prefix(out: str) -> Path:
    """``--out`` as a dataset prefix ``DIR/NAME``.

    Raises:
        Refused: empty, a directory (an existing one, or a path ending in ``/``), or a name of dots only.
    """
    if not out.strip():
        raise Refused("--out '': the dataset needs a prefix, DIR/NAME (it writes NAME.bin, NAME.idx and "
                      "NAME.tokenizer.json in DIR); nothing was written")
    prefix = Path(out)
    if out.endswith(("/", os.sep)) or prefix.is_dir() or prefix.name in ("", ".", ".."):
        raise Refused(f"--out {out}: a directory, not a dataset prefix; name the dataset in it: --out "
                      f"{out.rstrip('/' + os.sep) or '.'}/NAME; nothing was written")
    return prefix


def prepare(files: list[str], out: str, tokenizer: str = "bytes", documents: str = "file") -> dict:
    """Tokenize ``files`` into the dataset ``out`` (a prefix); returns its counts.

    Raises:
        Refused: ``out`` is not a prefix (:func:`_prefix`), an input is missing, unreadable or not UTF-8, there is
            no text, or the output cannot be written (nothing is left of it then).
    """
    prefix = _prefix(out)
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise Refused(f"input file{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)}; nothing was "
                         "written")
    if tokenizer != "bytes":
        raise Refused(f"--tokenizer {tokenizer}: the byte-level tokenizer (bytes) is the one this command has")
    texts = []
    for f in files:
        try:
            texts.append(Path(f).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise Refused(f"{f} cannot be read as UTF-8 text ({e}); nothing was written") from None
    docs = [d for t in texts for d in _documents(t, documents)]
    if not docs:
        raise Refused(f"no text in {', '.join(files)}; nothing was written")
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Refused(f"--out {out}: cannot create {prefix.parent}: {e.strerror or e}") from None

    import warnings

    import numpy

    with warnings.catch_warnings():  # Megatron-Core's notes on kernels it falls back from: nothing this command uses
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    tok = DatasetTokenizer.bytes()
    dtype = DType.optimal_dtype(tok.vocab_size)
    tokens = 0
    final = {ext: Path(f"{prefix}{ext}") for ext in DATASET_FILES}
    tmp = {ext: path.with_name(f".{path.name}.{os.getpid()}.tmp") for ext, path in final.items()}
    try:
        builder = IndexedDatasetBuilder(str(tmp[".bin"]), dtype=dtype)
        for doc in docs:
            ids = numpy.asarray(tok.tokenize(doc) + [tok.eod], dtype=dtype)
            builder.add_document(ids, [ids.size])
            tokens += ids.size
        builder.finalize(str(tmp[".idx"]))
        description = {**tok.description(), "made_by": "python -m moe_hydra.data prepare", "dtype": numpy.dtype(dtype).name,
                       "documents": len(docs), "tokens": tokens, "inputs": [Path(f).name for f in files]}
        tmp[".tokenizer.json"].write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
        # the old dataset's index and tokenizer go first: an interruption between the renames leaves no .idx (an
        # incomplete dataset, refused as one), never a new .bin beside an old .idx
        for ext in (".idx", ".tokenizer.json"):
            final[ext].unlink(missing_ok=True)
        for ext in DATASET_FILES:
            os.replace(tmp[ext], final[ext])
    except OSError as e:
        raise Refused(f"--out {out}: cannot write the dataset: {e.strerror or e}") from None
    finally:  # interrupted or refused: no partial file is left behind
        for path in tmp.values():
            path.unlink(missing_ok=True)
    return {"prefix": str(prefix), "documents": len(docs), "tokens": tokens, "dtype": numpy.dtype(dtype).name,
            "vocab_size": tok.vocab_size}
