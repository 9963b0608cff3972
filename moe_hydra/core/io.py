"""Files and the console, as every layer writes and reads them: JSON written atomically, read forgivingly,
and one rich console. Standard library (rich is imported when a console is asked for)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Iterator


def finite(x: Any) -> Any:
    """``x`` with every NaN and infinity (nested in dicts, lists, tuples) as None: JSON has neither."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write, renamed over ``path`` when the block ends: a reader
    (another command, another shell) sees the old file or the new one, never half of one, and a block that raises
    leaves the old file or none (the temporary one removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str, errors: str = "strict") -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic`).

    The file's mode follows the umask, as Hydra's ``.hydra/`` files do (0644 under umask 022), so a team that
    shares output directories can read it: the temporary file is created with mode 0666 less the umask (not
    ``tempfile.mkstemp``'s 0600), then renamed over ``path``.
    """
    with atomic(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8", errors=errors) as f:
            f.write(text)


def write_json(data: dict[str, Any], path: Path, indent: int | None = 2) -> None:
    """Write ``data`` as JSON atomically (:func:`write_text`); ``indent=None`` for large files."""
    write_text(path, json.dumps(data, indent=indent, default=str, separators=None if indent else (",", ":")) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file, or None when it is missing, truncated or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_named(path: str | Path, what: str) -> str:
    """The text of a file a user named (``what`` says how: "--file", "compare.noise_file"), as UTF-8.

    Raises:
        Refused: it is missing, a directory, unreadable, or not UTF-8 text (a binary or Latin-1 file); the message
            names ``what`` and the path.
    """
    from moe_hydra.core.errors import Refused

    p = Path(path)
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise Refused(f"{what} {p}: a directory, not a file") from None
    except OSError as e:
        raise Refused(f"{what} {p}: {e.strerror or type(e).__name__}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Refused(f"{what} {p}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}: a binary file, "
                      "or another encoding; iconv -t utf-8 converts one)") from None
    if "\0" in text:
        raise Refused(f"{what} {p}: a binary file (it holds NUL bytes), not text")
    return text


def console():
    """A rich console; wide when the output is not a terminal (logs, CI), so tables stay readable."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=160)


def utc_now() -> str:
    """Now, in UTC, as an ISO 8601 timestamp to the second (what the ledgers record)."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
