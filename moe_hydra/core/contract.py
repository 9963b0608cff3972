"""The measurement contract: everything that must stay fixed between two arms of an A/B (docs/workflow.md).

A contract is a plain nested dict — software versions, hardware and topology, model, data, batch
shape, optimizer, both meshes, routing, precision, recompute, offload, dispatcher, kernels (graph
scope), overlap, warmup and window, and the launcher environment (performance env vars). Two hashes:

    contract_full_hash   of the whole contract
    contract_hash        with the variable(s) swept by the current multirun left out, so all arms of one
                         A/B share it (and runs that differ in anything else do not)

The label is computed, never typed: ``training-equivalent`` only when the run keeps the production
routing, data and loss semantics (natural routing, no token drop, real data: ``data.kind=megatron``); anything
else makes it ``benchmark-only``, with the reasons.

The data section of a ``data.kind=megatron`` run names its data by content too: per prefix the bytes of its
``.bin`` and ``.idx`` and the sha256 of its ``.idx`` (:func:`fingerprint`), and the tokenizer the dataset was
made with, so two arms on different data never share a contract. This module also reads Megatron's index
files (:func:`read_index`, :func:`read_tokenizer`, :func:`max_token`) for the data rules (D, docs/rules.md),
with the standard library alone: plans are made without numpy, torch or megatron.

Pure: standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import struct
from typing import Any

from moe_hydra.core.errors import Refused
from moe_hydra.core.steady import AUTO

TRAINING_EQUIVALENT = "training-equivalent"
BENCHMARK_ONLY = "benchmark-only"

# Config sections that are part of the contract as they are.
SECTIONS = ("model", "hardware", "precision", "recompute", "offload", "dispatcher", "routing", "kernels",
            "overlap", "optimizer", "data")
# Config groups and the contract section each writes.
GROUP_SECTIONS = {"attention_mesh": "parallel", "expert_mesh": "parallel", "mesh": "parallel"}
SOFTWARE = ("python", "torch", "megatron-core", "transformer-engine", "transformer_engine", "deep_ep", "deep-ep",
            "nvidia-nccl-cu12", "nvidia-nccl-cu13")


def label(cfg: Any) -> tuple[str, list[str]]:
    """(label, reasons) for a composed config; no reasons means training-equivalent."""
    reasons = []
    if cfg.routing.moe_router_force_load_balancing:
        reasons.append("force-balanced routing (routing.moe_router_force_load_balancing=true)")
    if cfg.routing.moe_expert_capacity_factor is not None:
        reasons.append(
            f"token drop at capacity {cfg.routing.moe_expert_capacity_factor} "
            "(routing.moe_expert_capacity_factor set; production MoE training is dropless)"
        )
    if cfg.data.kind == "mock":
        reasons.append("mock data (data.kind=mock: synthetic tokens)")
    elif cfg.data.kind != "megatron":
        reasons.append(f"data.kind={cfg.data.kind} is not a real dataset")
    return (BENCHMARK_ONLY if reasons else TRAINING_EQUIVALENT), reasons


def build(cfg: Any, r: Any, env: dict[str, Any]) -> dict[str, Any]:
    """The contract of a composed config; the layout, the batch and the implementation as resolved (``r``, a
    :class:`~moe_hydra.core.resolved.Resolved`)."""
    contract = {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}
    contract["data"] = data_section(cfg.data)
    contract["hardware"].pop("calibration", None)  # what the planner predicts from, not what the arms run
    contract["parallel"] = {**dataclasses.asdict(cfg.parallel), **r.layout.to_megatron()}
    # micro-batches per step follow from the layout (GBS / (MBS x DP)): part of the layout, not the batch
    contract["train"] = {"seq_length": cfg.train.seq_length, "train_iters": cfg.train.train_iters,
                         "layout_invariant_init": cfg.train.layout_invariant_init,
                         **{k: v for k, v in r.batch.as_dict().items() if k != "micro_batches_per_step"}}
    # what runs (TE or local layers, flash or unfused attention, ...): arms built differently are not matched
    contract["implementation"] = {k: v for k, v in dataclasses.asdict(r.impl).items() if k != "source"}
    if cfg.contract.window == AUTO:  # the window is found as the run steps: auto and its rule are the contract
        contract["timing"] = {"warmup_steps": cfg.contract.warmup_steps, "window": AUTO,
                              "steady_steps": cfg.contract.steady_steps}
        del contract["train"]["train_iters"]  # auto's cap, not what it measures: a longer cap is the same contract
    else:
        contract["timing"] = {"warmup_steps": cfg.contract.warmup_steps, "window": list(cfg.contract.window)}
        first, last = cfg.contract.window[0], cfg.contract.window[-1]
        profiled = r.profile_steps
        if profiled and profiled[0] <= last and first <= profiled[1]:  # a profile inside the window perturbs it
            contract["timing"]["profiled_steps"] = list(profiled)
    if cfg.contract.reference_every:  # work between the window's steps: the loop is not the same
        contract["timing"]["reference_every"] = cfg.contract.reference_every
    contract["seed"] = cfg.seed
    contract["software"] = {k: v for k, v in env["versions"].items() if k in SOFTWARE}
    contract["launcher"] = {"name": cfg.launcher.name, "partition": cfg.launcher.partition,
                            "constraint": cfg.launcher.constraint, "env": env["env"]}
    return contract


def _drop(tree: dict[str, Any], path: list[str]) -> None:
    node = tree
    for part in path[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


def excluding(contract: dict[str, Any], swept: list[str]) -> dict[str, Any]:
    """The contract without the swept variables (override keys such as ``dispatcher`` or
    ``parallel.expert_model_parallel_size``; a mesh group stands for the whole layout). A swept environment preset
    (``hardware.env.NCCL_NVLS_ENABLE``) is also dropped from what the ranks ran with (``launcher.env``)."""
    out = json.loads(json.dumps(contract))
    for key in swept:
        _drop(out, GROUP_SECTIONS.get(key, key).split("."))
        if key.startswith("hardware.env."):
            _drop(out, ["launcher", "env", key[len("hardware.env."):]])
    return out


def digest(tree: dict[str, Any]) -> str:
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hashes(contract: dict[str, Any], swept: list[str]) -> dict[str, str]:
    return {"contract_hash": digest(excluding(contract, swept)), "contract_full_hash": digest(contract)}


# --------------------------------------------------------------------------- like with like

STEP_TIME = "step_time_ms"  # the figure arms that do the same work a step are compared on
THROUGHPUT = "tokens_per_s_per_gpu"  # ... and arms whose design varies the work a step on purpose
# Overrides that set the work of a step: sweeping one of them varies it on purpose (a batch or a scaling study)
WORK_KEYS = ("train.global_batch_size", "train.seq_length", "hardware.nodes", "hardware.devices_per_node")


@dataclasses.dataclass(frozen=True)
class Work:
    """What one step of an arm trains: its tokens on its GPUs; ``batch_unit`` (micro batch x data-parallel size) is
    what its global batch must be a multiple of."""

    tokens_per_step: int
    gpus: int
    batch_unit: int

    @property
    def tokens_per_gpu(self) -> float:
        return self.tokens_per_step / self.gpus

    @classmethod
    def of_resolved(cls, r: Any) -> Work:
        """The work of a resolved plan (:class:`~moe_hydra.core.resolved.Resolved`), before anything runs."""
        return cls(r.batch.tokens_per_step, r.layout.world_size, r.batch.micro_batch_size * r.layout.dp)

    @classmethod
    def of(cls, contract: dict[str, Any]) -> Work | None:
        """The work of a contract (its ``train`` and ``parallel`` sections, its ``hardware``); None when it does
        not say (a contract written by hand, without the batch or the hardware)."""
        try:
            train, hw, par = contract["train"], contract["hardware"], contract.get("parallel") or {}
            return cls(int(train["global_batch_size"]) * int(train["seq_length"]),
                       int(hw["nodes"]) * int(hw["devices_per_node"]),
                       int(train["micro_batch_size"]) * int(par.get("data_parallel_size") or 1))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def measure(works: list[Work | None], variables: list[str], labels: list[str] | None = None) -> str:
    """The figure arms doing ``works`` (the baseline's first) may be compared on, with ``variables`` the override
    keys their design varies: :data:`STEP_TIME` when every arm trains the same tokens a step on as many GPUs;
    :data:`THROUGHPUT` when they do not and a variable is one that sets the work (:data:`WORK_KEYS`: the design
    varies it on purpose) -- judged as time per token, its reciprocal, so that faster stays lower. The one place
    this is decided: compare, diff, repeat=auto and the layout screening ask it before they judge anything.

    Raises:
        Refused: the arms do different work a step and no variable says it is the point (a micro batch swept with
            the global batch following it): step times would compare unlike things; the fix fixes the batch.
    """
    labels = labels or [f"arm {i}" for i in range(len(works))]
    known = [(w, name) for w, name in zip(works, labels) if w is not None]  # None: the contract does not say
    works, labels = [w for w, _ in known], [name for _, name in known]
    if len({(w.tokens_per_step, w.gpus) for w in works}) <= 1:
        return STEP_TIME
    if any(v.lstrip("+~") in WORK_KEYS for v in variables):
        return THROUGHPUT
    shown = "; ".join(f"{name}: {w.tokens_per_step} tokens on {w.gpus} GPU{'s' * (w.gpus > 1)}"
                      for name, w in zip(labels, works))
    gbs = math.lcm(*(w.batch_unit for w in works))
    raise Refused(f"the arms train different work a step ({shown}): their step times measure different things, and "
                  f"tokens/s/GPU would credit the batch, not {', '.join(variables) or 'the variable'}. Fix the work a "
                  f"step: train.global_batch_size={gbs} (a multiple of every arm's micro batch x data-parallel size), "
                  f"or sweep train.global_batch_size itself to judge tokens/s/GPU")


# --------------------------------------------------------------------------- data (data.kind=megatron)

# Megatron-Core's indexed dataset (megatron/core/datasets/indexed_dataset.py): <prefix>.idx starts with this magic,
# version 1 (<Q), the dtype code (<B), the sequence and document counts (<Q each), then the sequence lengths
# (int32), the sequence byte offsets into <prefix>.bin (int64), the document boundaries (int64) and, in
# multimodal datasets, one mode byte per sequence.
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER = len(INDEX_MAGIC) + 8 + 1 + 8 + 8
# DType codes -> (name, bytes, memoryview format); floats cannot hold token ids
INDEX_DTYPES = {1: ("uint8", 1, "B"), 2: ("int8", 1, "b"), 3: ("int16", 2, "h"), 4: ("int32", 4, "i"),
                5: ("int64", 8, "q"), 6: ("float64", 8, "d"), 7: ("float32", 4, "f"), 8: ("uint16", 2, "H")}
# The highest id each integer dtype can hold.
DTYPE_MAX = {"uint8": 2**8 - 1, "int8": 2**7 - 1, "int16": 2**15 - 1, "uint16": 2**16 - 1, "int32": 2**31 - 1,
             "int64": 2**63 - 1}
# The tokenizer a dataset was made with (written by ``python -m moe_hydra.data prepare``): <prefix> + this.
TOKENIZER_SUFFIX = ".tokenizer.json"
# Without a tokenizer description, the largest .bin whose token ids the plan reads to find the highest.
MAX_TOKEN_SCAN_BYTES = 64 * 1024 * 1024


class DataFileError(Refused):
    """A dataset file that is absent (``kind`` ``missing``) or not what Megatron-Core reads (``corrupt``,
    ``tokenizer``); the message names the file."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


def _is_number(text: Any) -> bool:
    if isinstance(text, bool):
        return False
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def blend(path: list[str] | None) -> tuple[list[str], list[float] | None]:
    """``data.path`` (Megatron's ``--data-path`` list) as Megatron-Core's blend ``(prefixes, weights)``: the reading
    of ``megatron.core.datasets.utils.get_blend_from_list`` (weights None when the list holds prefixes only).

    Stricter than Megatron-Core where it would silently misread: a list that holds any number must alternate
    weight, prefix (Megatron would take an odd-length list's weights for prefixes); weights must be finite, not
    negative, and not all zero; a prefix may not be empty.

    Raises:
        ValueError: the list is not a blend, saying why.
    """
    items = [str(x).strip() for x in (path or [])]
    if not items:
        raise ValueError("data.path is empty; data.kind=megatron needs at least one dataset prefix")
    if any(not x for x in items):
        raise ValueError(f"data.path holds an empty prefix: {items}")
    numbers = [_is_number(x) for x in items]
    if not any(numbers):
        return items, None
    pairs = len(items) % 2 == 0 and all(numbers[0::2]) and not any(numbers[1::2])
    if not pairs:
        raise ValueError(f"data.path {items} mixes weights and prefixes; Megatron's form is prefixes only "
                         "([A, B]) or weight, prefix in turn ([0.3, A, 0.7, B]) (a prefix that reads as a number: "
                         "write it as ./NAME)")
    weights = [float(w) for w in items[0::2]]
    if not all(math.isfinite(w) and w >= 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(f"data.path weights {items[0::2]} must be finite, not negative, and not all zero")
    return items[1::2], weights


def parse_split(split: str) -> list[float]:
    """``data.split`` (Megatron's ``--split``, e.g. ``969,30,1``) as the normalized train, valid, test shares.

    Raises:
        ValueError: not one to three comma-separated non-negative numbers with a positive train share.
    """
    parts = [p.strip() for p in str(split).split(",")]
    if not 1 <= len(parts) <= 3 or not all(_is_number(p) for p in parts):
        raise ValueError(f"data.split must be one to three comma-separated numbers (train,valid,test), got {split!r}")
    shares = [float(p) for p in parts] + [0.0] * (3 - len(parts))
    if not all(math.isfinite(x) and x >= 0 for x in shares) or not shares[0] > 0:
        raise ValueError(f"data.split {split!r} must give the train split a positive share (the job trains on it) "
                         "and no share may be negative")
    total = sum(shares)
    return [x / total for x in shares]


def train_documents(documents: int, split: list[float]) -> int:
    """How many of a prefix's documents Megatron-Core's split puts in the train part (its rounding,
    ``BlendedMegatronDatasetBuilder._build_megatron_dataset_splits``)."""
    return int(round(split[0] * float(documents)))


@dataclasses.dataclass(frozen=True, slots=True)
class IndexFacts:
    """What a prefix's ``.idx`` says, checked against its ``.bin``."""

    prefix: str
    dtype: str
    itemsize: int
    sequences: int
    documents: int
    tokens: int
    bin_bytes: int
    idx_bytes: int


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def read_index(prefix: str) -> IndexFacts:
    """The header of ``<prefix>.idx`` and its agreement with ``<prefix>.bin`` (both sizes, the last sequence's
    offset and length, the document boundaries), read with the standard library; cached per file version.

    Raises:
        DataFileError: a file is missing (``missing``) or is not a Megatron indexed dataset (``corrupt``).
    """
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    missing = [p for p in (bin_, idx) if not os.path.isfile(p)]
    if missing:
        raise DataFileError("missing", f"{' and '.join(missing)} not found (a Megatron dataset prefix names "
                                       f"PREFIX.bin and PREFIX.idx)")
    return _read_index(prefix, _stat(idx), _stat(bin_))


@functools.lru_cache(maxsize=64)
def _read_index(prefix: str, idx_stat: tuple | None, bin_stat: tuple | None) -> IndexFacts:
    idx, bin_ = prefix + ".idx", prefix + ".bin"

    def corrupt(why: str) -> DataFileError:
        return DataFileError("corrupt", f"{idx} is not a Megatron-Core indexed dataset index: {why}")

    try:
        with open(idx, "rb") as f:
            head = f.read(_HEADER)
            if len(head) < _HEADER or head[:len(INDEX_MAGIC)] != INDEX_MAGIC:
                raise corrupt(f"it does not start with the magic {INDEX_MAGIC!r}")
            version, code, sequences, documents = struct.unpack("<QBQQ", head[len(INDEX_MAGIC):])
            if version != INDEX_VERSION:
                raise corrupt(f"version {version}, Megatron-Core reads version {INDEX_VERSION}")
            if code not in INDEX_DTYPES or INDEX_DTYPES[code][0] not in DTYPE_MAX:
                raise corrupt(f"dtype code {code} is not an integer token dtype")
            name, itemsize, _ = INDEX_DTYPES[code]
            idx_bytes = idx_stat[0] if idx_stat else 0
            expected = _HEADER + 12 * sequences + 8 * documents
            if idx_bytes not in (expected, expected + sequences):
                raise corrupt(f"{idx_bytes} bytes, but its header's {sequences} sequences and {documents} document "
                              f"boundaries take {expected}")
            if sequences < 1 or documents < 2:
                raise corrupt(f"it holds no documents ({sequences} sequences)")
            f.seek(_HEADER + 4 * (sequences - 1))
            (last_length,) = struct.unpack("<i", f.read(4))
            f.seek(_HEADER + 4 * sequences + 8 * (sequences - 1))
            (last_pointer,) = struct.unpack("<q", f.read(8))
            f.seek(_HEADER + 12 * sequences)
            (first_doc,) = struct.unpack("<q", f.read(8))
            f.seek(_HEADER + 12 * sequences + 8 * (documents - 1))
            (last_doc,) = struct.unpack("<q", f.read(8))
    except OSError as e:
        raise DataFileError("corrupt", f"{idx} cannot be read: {e.strerror or e}") from None
    if (first_doc, last_doc) != (0, sequences):
        raise corrupt(f"its document boundaries run {first_doc}..{last_doc}, not 0..{sequences}")
    bin_bytes = bin_stat[0] if bin_stat else 0
    end = last_pointer + last_length * itemsize
    if last_length < 0 or last_pointer < 0 or end != bin_bytes:
        raise DataFileError("corrupt", f"{bin_} holds {bin_bytes} bytes, but {idx} says its sequences end at byte "
                                       f"{end}: the two files are not one dataset")
    return IndexFacts(prefix, name, itemsize, sequences, documents - 1, bin_bytes // itemsize, bin_bytes, idx_bytes)


def read_tokenizer(prefix: str) -> dict[str, Any] | None:
    """``<prefix>.tokenizer.json``, the tokenizer the dataset was made with (``tokenizer``, ``vocab_size``, ``eod``,
    ``pad``), or None when the dataset has none (made by another tool).

    Raises:
        DataFileError: the file exists but is not such a description (``tokenizer``).
    """
    path = prefix + TOKENIZER_SUFFIX
    stat = _stat(path)
    return None if stat is None else dict(_read_tokenizer(path, stat))


@functools.lru_cache(maxsize=64)
def _read_tokenizer(path: str, stat: tuple) -> tuple:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise DataFileError("tokenizer", f"{path} cannot be read as JSON ({type(e).__name__})") from None

    def integer(key: str, low: int) -> bool:
        return isinstance(doc.get(key), int) and not isinstance(doc.get(key), bool) and doc[key] >= low

    if not isinstance(doc, dict) or not integer("vocab_size", 1) or not integer("eod", 0) \
            or doc["eod"] >= doc["vocab_size"] or not (doc.get("pad") is None or integer("pad", 0)):
        raise DataFileError("tokenizer", f"{path} must hold a JSON object with vocab_size, eod < vocab_size and "
                                         "optionally pad (integers)")
    keys = ("tokenizer", "vocab_size", "eod", "pad")
    return tuple((k, doc.get(k)) for k in keys)


def max_token(facts: IndexFacts, limit: int = MAX_TOKEN_SCAN_BYTES) -> int | None:
    """The highest token id in ``<prefix>.bin``: the dtype's own bound when that is all the plan can know (a
    ``.bin`` larger than ``limit``), else read (cached per file version)."""
    if facts.bin_bytes > limit:
        return None
    return _max_token(facts.prefix + ".bin", _stat(facts.prefix + ".bin"), facts.dtype)


@functools.lru_cache(maxsize=64)
def _max_token(path: str, stat: tuple | None, dtype: str) -> int | None:
    itemsize, fmt = next((size, f) for name, size, f in INDEX_DTYPES.values() if name == dtype)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    values = memoryview(data)[:len(data) - len(data) % itemsize].cast(fmt)
    return max(values) if len(values) else None


@functools.lru_cache(maxsize=64)
def _sha256(path: str, stat: tuple) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(prefix: str) -> dict[str, Any]:
    """A prefix's content as the contract records it: ``bin_bytes``, ``idx_bytes`` and ``idx_sha256`` (the index
    holds every sequence's length and offset, so any change of the tokens' layout changes it; a same-sized edit of
    the tokens alone is what it does not see); nulls for a file that is not there (a plan made where the data is
    not)."""
    bin_stat, idx_stat = _stat(prefix + ".bin"), _stat(prefix + ".idx")
    try:
        digest_ = _sha256(prefix + ".idx", idx_stat) if idx_stat else None
    except OSError:
        digest_ = None
    return {"prefix": prefix, "bin_bytes": bin_stat[0] if bin_stat else None,
            "idx_bytes": idx_stat[0] if idx_stat else None, "idx_sha256": digest_}


def data_section(data: Any) -> dict[str, Any]:
    """The contract's ``data``: mock data as its config (kind, path, seed: the contract of runs before real data);
    real data as its blend (prefixes, weights), split, seed and bin reading, the content of every prefix
    (:func:`fingerprint`) and the tokenizer the data was made with. ``path_to_cache`` is left out: where the
    sample indices are cached changes nothing that is measured."""
    if data.kind != "megatron":
        return {"kind": data.kind, "path": None if data.path is None else list(data.path), "seed": data.seed}
    try:
        prefixes, weights = blend(data.path)
    except ValueError:  # refused by rule D02; the plan is never made
        prefixes, weights = [str(x) for x in data.path or []], None
    tokenizers = []
    for prefix in prefixes:
        try:
            tokenizers.append(read_tokenizer(prefix))
        except DataFileError:  # refused by rule D06 at stage=run
            tokenizers.append(None)
    return {"kind": data.kind, "path": list(data.path or []), "prefixes": prefixes, "weights": weights,
            "split": data.split, "seed": data.seed, "mmap_bin_files": data.mmap_bin_files,
            "files": [fingerprint(p) for p in prefixes],
            "tokenizer": tokenizers[0] if len({json.dumps(t, sort_keys=True) for t in tokenizers}) == 1 else tokenizers}


def _flat(tree: Any) -> dict[str, Any]:
    """Dotted key -> leaf; iterative, so no nesting in a file can exhaust the stack."""
    out: dict[str, Any] = {}
    stack = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, dict):
            stack += [(f"{prefix}.{k}" if prefix else k, v) for k, v in node.items()]
        else:
            out[prefix] = node
    return out


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every leaf where two contracts differ, sorted by key."""
    fa, fb = _flat(a), _flat(b)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
