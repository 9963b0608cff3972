"""Did two programs do the same work? Then, and only then, a ratio of their times means something.

Two Megatron-Core training loops (the job and a bare loop written by hand, in ``benchmarks/harness_overhead.py``;
two jobs of a tune or a bisect) are the same work when they built the same thing and it computed the same thing:

1. the same Megatron-Core configs: ``megatron_configs.json`` (:data:`CONFIGS_FILE`, written by
   ``moe_hydra.job.built``: the ``TransformerConfig``, ``DistributedDataParallelConfig`` and ``OptimizerConfig``
   handed to Megatron-Core, every field after ``__post_init__``, values that are not JSON as their names), compared
   field by field (:func:`diff`);
2. the same run facts (:data:`RUN_SECTION`): what those configs do not hold — the ``GPTModel`` arguments, batch,
   steps and window, seeds and data, threads and backend, and what was read from the built model (parameters per
   rank, the classes of the dispatcher, experts, optimizer and DDP wrapper). A job's are read from its results.json
   (:func:`run_facts`); another program records the same keys itself. Compared in the same diff;
3. then the same loss at every step (:func:`loss_diff`, within :data:`LOSS_RTOL`): the same model, data and steps
   give the same losses, so a loss that differs means something the first two did not see differs.

No field is skipped silently: :data:`IGNORED_FIELDS` lists what is not compared (with why), :data:`NORMALIZED`
what is rewritten on both sides before comparing (with why). A section or field present on one side only is a
difference (missing is not None).

Runs alternate (a, b, a, b, ...; :func:`alternate`) and each pair is checked as soon as it has run: the first pair
that differs ends the runs, and :class:`Pairs` then gives its differences and no ratio (:meth:`Pairs.ratio` refuses).

Reads files only.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.core.errors import Refused
from moe_hydra.core.io import read_json

CONFIGS_FILE = "megatron_configs.json"  # moe_hydra.job.built.FILE (analysis imports the core only)
CONFIG_SECTIONS = ("transformer_config", "ddp_config", "optimizer_config")  # megatron_configs.json's sections
RUN_SECTION = "run"  # what the three configs do not hold (run_facts)
TIMES = ("step_time_ms", "window_loop_ms_per_step")  # results.json's times, the figures a ratio is taken of
LOOP_FILE = "work.json"  # what a loop outside moe_hydra records beside its megatron_configs.json (read_loop)

# Fields not compared, "section.field" -> why. Empty: every field of the three configs and of the run facts must
# match once NORMALIZED is applied.
IGNORED_FIELDS: dict[str, str] = {}

# Rewritten on both sides before comparing, (pattern, replacement, why). built.plain writes a value it cannot name
# (the init functions are functools.partial objects) with str(), which embeds the process's memory address:
# "functools.partial(<function normal_ at 0x7f3b...>, mean=0.0, std=0.02)". The address differs between any two
# processes; the function's name and its arguments (mean, std) are still compared.
NORMALIZED: tuple[tuple[str, str, str], ...] = (
    (r" at 0x[0-9a-fA-F]+", " at 0x...", "memory addresses in the str() of functions and partials"),
)

# The relative tolerance of the loss at every step, by device. The CPU runs are deterministic (same ops, threads,
# reduction order): bit for bit. GPU kernels may reduce in a different order from run to run (atomics), and top-k
# routing amplifies that over the steps: 1 % relative.
LOSS_RTOL = {"cpu": 0.0, "gpu": 1e-2}

# ------------------------------------------------------------------------------------------------ what one did


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """What one program did, as it wrote it down."""

    label: str
    """Names the program in every difference (``moe_hydra 2 != bare 1``)."""
    configs: dict[str, Any]
    """``megatron_configs.json``: ``{section: {field: value}}`` for :data:`CONFIG_SECTIONS`."""
    run: dict[str, Any]
    """The run facts (:func:`run_facts`'s keys)."""
    loss_per_step: list[float]
    """The global batch's loss at every step, 1..train_iters (results.json's ``loss.per_step``)."""
    times_ms: dict[str, float] = field(default_factory=dict)
    """The figures a ratio is taken of, in ms, by key (:data:`TIMES` for a job)."""

    def described(self) -> dict[str, Any]:
        """The configs and the run facts: what :func:`diff` compares."""
        return {**self.configs, RUN_SECTION: self.run}


def _read(path: Path, writer: str) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise Refused(f"{path}: missing, unreadable or not a JSON object ({writer} writes it)")
    return data


def read_configs(directory: Path) -> dict[str, Any]:
    """The Megatron-Core configs a program wrote to ``directory``/:data:`CONFIGS_FILE`.

    Raises:
        Refused: the file is missing, unreadable or not a JSON object.
    """
    return _read(Path(directory) / CONFIGS_FILE, "moe_hydra.job.built.write, when the job has built the model")


def read_job(run_dir: Path, label: str = "moe_hydra", times: tuple[str, ...] = TIMES) -> Work:
    """A job's work, from its run directory: megatron_configs.json, and results.json's run facts, losses, times.

    Raises:
        Refused: a file is missing or unreadable, or results.json lacks a field that is compared (named).
    """
    results = _read(Path(run_dir) / "results.json", "the job, when it completes")
    try:
        return Work(label=label, configs=read_configs(run_dir), run=run_facts(results),
                    loss_per_step=list(results["loss"]["per_step"]), times_ms={k: results[k] for k in times})
    except (KeyError, TypeError) as e:  # a field missing, or a section that is not an object
        raise Refused(f"{run_dir}/results.json: not the run facts, losses and times two runs are compared by "
                      f"({type(e).__name__}: {e})") from None


def read_loop(directory: Path, label: str, times: tuple[str, ...] = TIMES) -> Work:
    """The work of a loop outside moe_hydra (the bare Megatron-Core loop of ``benchmarks/harness_overhead.py``),
    from what it wrote to ``directory``: megatron_configs.json (``moe_hydra.job.built.describe`` of its three
    configs) and :data:`LOOP_FILE`, a JSON object with ``run`` (its run facts, :func:`run_facts`'s keys),
    ``loss_per_step`` and the ``times`` in ms.

    Raises:
        Refused: a file is missing or unreadable, or work.json lacks one of those fields (named).
    """
    record = _read(Path(directory) / LOOP_FILE, "the loop, when it completes")
    try:
        return Work(label=label, configs=read_configs(directory), run=dict(record[RUN_SECTION]),
                    loss_per_step=list(record["loss_per_step"]), times_ms={k: record[k] for k in times})
    except (KeyError, TypeError) as e:
        raise Refused(f"{directory}/{LOOP_FILE}: not the run facts, losses and times two runs are compared by "
                      f"({type(e).__name__}: {e})") from None


def run_facts(results: dict[str, Any]) -> dict[str, Any]:
    """A job's run facts, read from its results.json (the plan, the contract and the evidence of the built model).

    What the three configs do not hold: ``world_size``, ``data_parallel_size``, the ``GPTModel`` arguments
    (``vocab_size`` padded as Megatron pads it, to a multiple of make_vocab_size_divisible_by x TP;
    ``max_sequence_length``, ``share_embeddings_and_output_weights``, ``position_embedding_type``, ``rotary_base``),
    the batch (``seq_length``, ``micro_batch_size``, ``global_batch_size``, ``micro_batches_per_step``), the steps
    (``train_iters``, ``window``, ``profile_steps``), seeds and data (``seed``, ``data_kind``, ``data_seed``,
    ``layout_invariant_init``), ``params_per_rank``, and from the evidence ``layer_spec``, ``backend``,
    ``torch_threads``, ``dispatcher_class``, ``experts_class``, ``local_experts_per_rank``, ``param_dtype``,
    ``optimizer_class``, ``ddp_class``, ``model_chunks``.
    """
    c, b, e = results["contract"], results["batch"], results["evidence"]
    m = c["model"]
    divisor = m["make_vocab_size_divisible_by"] * results["parallel"]["tensor_model_parallel_size"]
    return {
        "world_size": results["world_size"],
        "data_parallel_size": results["parallel"]["data_parallel_size"],
        "vocab_size": -(-m["vocab_size"] // divisor) * divisor,
        "max_sequence_length": c["train"]["seq_length"],
        "share_embeddings_and_output_weights": not m["untie_embeddings_and_output_weights"],
        "position_embedding_type": m["position_embedding_type"],
        "rotary_base": m["rotary_base"],
        "seq_length": results["seq_length"],
        "micro_batch_size": b["micro_batch_size"],
        "global_batch_size": b["global_batch_size"],
        "micro_batches_per_step": b["micro_batches_per_step"],
        "train_iters": results["train_iters"],
        "window": results["window"],
        "profile_steps": results["profile_steps"],
        "seed": c["seed"],
        "data_kind": c["data"]["kind"],
        "data_seed": c["data"]["seed"],
        "layout_invariant_init": c["train"]["layout_invariant_init"],
        "params_per_rank": results["params_per_rank"],
        **{k: e[k] for k in ("layer_spec", "backend", "torch_threads", "dispatcher_class", "experts_class",
                             "local_experts_per_rank", "param_dtype", "optimizer_class", "ddp_class", "model_chunks")},
    }


# ------------------------------------------------------------------------------------------------ the diff


def _normalize(value: Any) -> Any:
    if isinstance(value, str):
        for pattern, replacement, _ in NORMALIZED:
            value = re.sub(pattern, replacement, value)
        return value
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


class _Missing:
    """A field one side does not have (not the same as a field whose value is None)."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value) if value is _MISSING else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def diff(a: dict[str, Any], b: dict[str, Any], ignored: dict[str, str] | None = None,
         labels: tuple[str, str] = ("a", "b")) -> list[str]:
    """Every difference between two descriptions of what was built, one line each (empty: the same work).

    Args:
        a, b: ``{section: {field: value}}`` (megatron_configs.json's sections, plus ``run``: :meth:`Work.described`),
            compared after :data:`NORMALIZED`.
        ignored: ``section.field`` keys not compared (default :data:`IGNORED_FIELDS`).
        labels: the two sides' names in each line (``section.field: a 2 != b 1``).

    Returns:
        One line per differing field, sections and fields in sorted order; a section or field present on one side
        only is a difference (shown as ``<missing>``).
    """
    ignored = IGNORED_FIELDS if ignored is None else ignored
    la, lb = labels
    out = []
    for section in sorted(set(a) | set(b)):
        sa, sb = a.get(section), b.get(section)
        if not isinstance(sa, dict) or not isinstance(sb, dict):
            if _normalize(sa) != _normalize(sb):
                out.append(f"{section}: {la} {_short(_MISSING if sa is None else sa)} != {lb} "
                           f"{_short(_MISSING if sb is None else sb)}")
            continue
        for name in sorted(set(sa) | set(sb)):
            key = f"{section}.{name}"
            if key in ignored:
                continue
            va, vb = _normalize(sa.get(name, _MISSING)), _normalize(sb.get(name, _MISSING))
            if va != vb:
                out.append(f"{key}: {la} {_short(va)} != {lb} {_short(vb)}")
    return out


def loss_diff(a: list[float], b: list[float], rtol: float, labels: tuple[str, str] = ("a", "b")) -> list[str]:
    """The steps whose losses differ by more than ``rtol`` (relative to the larger), one line each, at most 5 and a
    count of the rest; a different number of steps is one line. NaN differs from everything, itself included."""
    la, lb = labels
    if len(a) != len(b):
        return [f"loss: {la} {len(a)} steps != {lb} {len(b)} steps"]
    bad = [(step, x, y) for step, (x, y) in enumerate(zip(a, b), 1)
           if not (x == y or abs(x - y) <= rtol * max(abs(x), abs(y)))]
    lines = [f"loss at step {step}: {la} {x!r} != {lb} {y!r}" for step, x, y in bad[:5]]
    if len(bad) > 5:
        lines.append(f"... and {len(bad) - 5} more step(s)")
    return lines


def differences(a: Work, b: Work, rtol: float) -> list[str]:
    """What makes ``a`` and ``b`` different work (empty: the same): the configs' and run facts' :func:`diff`, and
    when those agree, the losses' :func:`loss_diff` (the same build and steps give the same losses)."""
    labels = (a.label, b.label)
    return diff(a.described(), b.described(), labels=labels) or loss_diff(
        a.loss_per_step, b.loss_per_step, rtol, labels=labels)


# ------------------------------------------------------------------------------------------------ the decision


@dataclass(frozen=True, kw_only=True, slots=True)
class Ratio:
    """One figure over alternating pairs, a against b."""

    key: str
    """The figure (``step_time_ms``, ...)."""
    a_ms: list[float]
    """a's figure in each pair, in the order run."""
    b_ms: list[float]

    @property
    def a_median(self) -> float:
        return statistics.median(self.a_ms)

    @property
    def b_median(self) -> float:
        return statistics.median(self.b_ms)

    @property
    def ratio(self) -> float:
        """a's median over its repeats / b's."""
        return self.a_median / self.b_median

    @property
    def pair_ratios(self) -> list[float]:
        """Each pair's ratio: the machine's load drifts between pairs more than within one."""
        return [x / y for x, y in zip(self.a_ms, self.b_ms)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Pairs:
    """The pairs that ran, and whether they did the same work."""

    pairs: list[tuple[Work, Work]]
    """(a, b) in the order run; when the work differed, the last pair is the one that differed."""
    differences: list[str]
    """What differed in the last pair (:func:`differences`); empty: every pair did the same work."""

    @property
    def same(self) -> bool:
        return not self.differences

    @property
    def refusal(self) -> str:
        """The message that ends a comparison of different work: a header, then each difference."""
        a, b = self.pairs[-1]
        head = f"{a.label} and {b.label} did not do the same work ({len(self.differences)} difference(s)); no ratio:"
        return "\n  ".join([head, *self.differences])

    def ratio(self, key: str) -> Ratio:
        """``key``'s ratio over the pairs.

        Raises:
            Refused: the pairs did not do the same work (:attr:`refusal`): their times are not comparable.
        """
        if not self.same:
            raise Refused(self.refusal)
        return Ratio(key=key, a_ms=[a.times_ms[key] for a, _ in self.pairs],
                     b_ms=[b.times_ms[key] for _, b in self.pairs])


def alternate(repeats: int, run_a: Callable[[int], Work], run_b: Callable[[int], Work], rtol: float) -> Pairs:
    """Run a, b, a, b, ... (``repeats`` pairs; ``run_a(i)`` runs a's repeat i and returns its work) and check each
    pair as soon as it has run: the first pair that differs ends the runs, before the other repeats are spent.

    Args:
        rtol: the losses' relative tolerance (:data:`LOSS_RTOL` of the device).

    Returns:
        The pairs run; :attr:`Pairs.same` says whether a ratio of their times may be taken.
    """
    pairs = []
    for i in range(repeats):
        a = run_a(i)
        b = run_b(i)
        pairs.append((a, b))
        found = differences(a, b, rtol)
        if found:
            return Pairs(pairs=pairs, differences=found)
    return Pairs(pairs=pairs, differences=[])
