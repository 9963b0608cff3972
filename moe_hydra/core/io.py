"""Files and the console, as every layer writes and reads them: JSON written atomically, read forgivingly,
and one rich console. Standard library (rich is imported when a console is asked for)."""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any


def finite(x: Any) -> Any:
    """``x`` with every NaN and infinity (nested in dicts, lists, tuples) as None: JSON has neither."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def write_json(data: dict[str, Any], path: Path, indent: int | None = 2) -> None:
    """Write ``data`` atomically (a reader never sees half a file); ``indent=None`` for large files.

    The file's mode follows the umask, as Hydra's ``.hydra/`` files do (0644 under umask 022), so a team that
    shares output directories can read it: the temporary file is created with mode 0666 less the umask (not
    ``tempfile.mkstemp``'s 0600), then renamed over ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=indent, default=str, separators=None if indent else (",", ":"))
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file, or None when it is missing, truncated or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def console():
    """A rich console; wide when the output is not a terminal (logs, CI), so tables stay readable."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=160)


def utc_now() -> str:
    """Now, in UTC, as an ISO 8601 timestamp to the second (what the ledgers record)."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
