"""The Megatron-Core configs a job built, as plain data: ``megatron_configs.json`` in the run directory.

What the job handed Megatron-Core — its ``TransformerConfig`` (or ``MLATransformerConfig``),
``DistributedDataParallelConfig`` and ``OptimizerConfig`` — field by field, after their ``__post_init__``
filled the derived fields. A run can then be rebuilt or diffed against another program that builds the same
model (:mod:`moe_hydra.analysis.same_work` refuses to compare runs whose configs differ).

Values that are not JSON (dtypes, functions, process groups) are written as their names.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

from moe_hydra.core.io import write_json

FILE = "megatron_configs.json"


def plain(value: Any) -> Any:
    """``value`` as JSON data: containers element by element, anything else by its name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fields(value)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return f"<{name}>" if name else str(value)


def fields(config: Any) -> dict[str, Any]:
    """Every field of a config dataclass, as JSON data, with its class."""
    out = {"class": type(config).__name__}
    for f in dataclasses.fields(config):
        out[f.name] = plain(getattr(config, f.name))
    return out


def describe(transformer_config: Any, ddp_config: Any, optimizer_config: Any) -> dict[str, Any]:
    """The three configs: ``transformer_config``, ``ddp_config``, ``optimizer_config``."""
    return {"transformer_config": fields(transformer_config), "ddp_config": fields(ddp_config),
            "optimizer_config": fields(optimizer_config)}


def write(path: Path, transformer_config: Any, ddp_config: Any, optimizer_config: Any) -> None:
    write_json(describe(transformer_config, ddp_config, optimizer_config), path)
