"""``layouts.json``, the layout search's file: the leading layouts in full, every other candidate in a Parquet table.

A search of a large cluster evaluates tens of thousands of candidates; one nested JSON object each made the file
of a Qwen3-235B search on 256 H100 19 MB. Version 2 keeps what people open it for as JSON and puts the rest in
``layouts.parquet`` beside it (pyarrow; pandas, polars or DuckDB open it too):

    layouts.json     the search's header as before (model, counts, step_time_model, tie_width, screening, ...),
                     ``layouts_version`` 2, ``candidates``: the leading ranked layouts, best first, every field
                     (:meth:`~moe_hydra.planning.search.Search.report`'s rows: rank, layout, parallel, terms_s,
                     overrides, ...) — the tie set and the rows with their overrides, at least the first FULL; and
                     ``table``: where the rest are (``file``), how many (``rows``) and the columns
    layouts.parquet  every other candidate, in the same order (ranked best first, then the rest), one row each:
                     a column per field, null where the row has no such field (a field a row lacks is left out
                     again when read back, except those of ALWAYS, which every row has); a nested field is a
                     dotted column (``parallel.tensor_model_parallel_size``, ``terms_s.step``), present when any of
                     its columns is not null; ``violations`` a list of rule ids

:func:`read` is the one way back: the file as every reader sees it, ``candidates`` every candidate as a full row,
best first, the rows :meth:`Search.report` made (a version-1 file, all rows in the JSON, reads as it is).
``moe-hydra sweep layout DIR RANK`` prints any rank's row in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_hydra.core import io

VERSION = 2
TABLE_FILE = "layouts.parquet"
FULL = 100  # ranked rows kept in the JSON at least (the tie set and the rows with their overrides when more)
# the fields every row has (null or not); any other field is absent from a row whose value is null
ALWAYS = ("rank", "layout", "micro_batch_size", "legal", "fits", "memory_gib", "recompute")
NESTED = ("parallel", "terms_s")


def split(report: dict[str, Any], full: int = FULL) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``report`` (Search.report's dict) as (the JSON: its header and leading ranked rows, the other rows flat)."""
    rows = report["candidates"]
    keep = max(full, sum(1 for r in rows if r.get("tied") or "overrides" in r))
    head = [r for r in rows[:keep] if r.get("rank")]
    flat = []
    for r in rows[len(head):]:
        out: dict[str, Any] = {}
        for k, v in r.items():
            if k in NESTED and isinstance(v, dict):
                out.update({f"{k}.{sub}": x for sub, x in v.items()})
            else:
                out[k] = v
        flat.append(out)
    return {**{k: v for k, v in report.items() if k != "candidates"}, "layouts_version": VERSION,
            "candidates": head}, flat


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """A table row as the report's row: absent fields left out, dotted columns nested again."""
    row: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for name, v in flat.items():
        group, dot, sub = name.partition(".")
        if dot and group in NESTED:
            nested.setdefault(group, {})[sub] = v
        elif v is not None or name in ALWAYS:
            row[name] = v
    row.update({g: sub for g, sub in nested.items() if any(x is not None for x in sub.values())})
    return row


def write(report: dict[str, Any], path: Path) -> None:
    """``report`` as ``layouts.json`` (version 2) and ``layouts.parquet`` beside it, each atomically (the table
    first: the JSON names it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    head, flat = split(report)
    names = list(dict.fromkeys([*ALWAYS, *(k for r in flat for k in r)]))
    with io.atomic(path.with_name(TABLE_FILE)) as tmp:
        pq.write_table(pa.Table.from_pylist(flat, schema=_schema(flat, names)), tmp, compression="zstd")
    head["table"] = {"file": TABLE_FILE, "rows": len(flat), "columns": names,
                     "format": "Parquet, one row per candidate after the JSON's, in rank order (moe_hydra/planning/"
                               "layouts_file.py)"}
    io.write_json(head, path, indent=None)


def _schema(flat: list[dict[str, Any]], names: list[str]) -> Any:
    """The columns' types from their values (a column null throughout: string), in ``names``' order."""
    import pyarrow as pa

    def kind(values: list[Any]) -> Any:
        if all(isinstance(v, bool) for v in values):
            return pa.bool_()
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return pa.int64()
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return pa.float64()
        if all(isinstance(v, list) for v in values):
            return pa.list_(pa.string())
        return pa.string()

    return pa.schema([(n, kind([r[n] for r in flat if r.get(n) is not None])) for n in names])


def read(path: Path) -> dict[str, Any] | None:
    """``layouts.json`` with every candidate as a full row, best first (version 2's table read back); None when
    it is missing or not JSON, or its table is missing."""
    data = io.read_json(path)
    if not isinstance(data, dict):
        return None
    table = data.get("table")
    if not isinstance(table, dict):
        return data  # version 1: every row in the JSON
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path.with_name(table["file"])).to_pylist()
    except (OSError, ValueError, KeyError):
        return None
    return {**{k: v for k, v in data.items() if k not in ("table", "layouts_version")},
            "candidates": [*data["candidates"], *map(nest, rows)]}
