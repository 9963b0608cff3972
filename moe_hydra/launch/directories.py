"""Run and sweep directories: each one command's while it runs, a time-named one new for every command.

**Held.** A command holds its directory (``hydra.run.dir`` for a run, ``hydra.sweep.dir`` for a sweep) from
before it writes anything until it ends: an exclusive ``flock`` on a lock file in it (:func:`hold`). A second
command into a held directory is refused (exit 2) before Hydra writes its ``.hydra/``, so the first one's files
stay as they were. A file system without ``flock`` (a Lustre mount without ``-o flock``) gets a warning.

**Fresh.** A directory named by the time its command started (the default ``outputs/runs/<date>/<time>``, or any
``hydra.run.dir`` / ``hydra.sweep.dir`` whose value uses ``${now:...}``) is made new for each command: the first of
``<time>``, ``<time>_1``, ``<time>_2`` ... that ``mkdir`` creates (:func:`fresh`), so two commands started in the
same second never share one. The resolved path is then pinned into the config (:func:`pin`), so what Hydra, the
points and a Slurm job resolve later is that directory.

**Refused, naming the path and the override:** a path that is a file, or one that cannot be created or written
(read-only, no permission).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from moe_hydra.core.errors import Refused

log = logging.getLogger("moe_hydra")

RUN_LOCK = ".run.lock"  # in a run directory; flock'ed while its command runs
SWEEP_LOCK = ".sweep.lock"  # in a sweep directory; flock'ed while its sweep runs
TIME_NAMED = "${now:"  # a directory so named is the time its command started: one per command
MAX_SUFFIX = 1000


def _refused(path: Path, override: str, e: OSError) -> Refused:
    what = ("is a file, not a directory" if e.errno in (errno.EEXIST, errno.ENOTDIR) and not path.is_dir()
            else f"cannot be written ({os.strerror(e.errno) if e.errno else type(e).__name__})")
    return Refused(f"{path} {what}; nothing was written or launched. Choose another directory: {override}=<dir>")


def fresh(path: Path, override: str) -> Path:
    """The first of ``path``, ``path_1``, ``path_2`` ... that this call creates (``mkdir``: of two commands asking at
    once, one gets each).

    Raises:
        Refused: the parent cannot be created or written, or a thousand such directories exist.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _refused(path.parent, override, e) from None
    for n in range(MAX_SUFFIX):
        candidate = path if n == 0 else path.with_name(f"{path.name}_{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
        except OSError as e:
            raise _refused(candidate, override, e) from None
    raise Refused(f"{path}_1 .. _{MAX_SUFFIX - 1} all exist; choose a directory: {override}=<dir>")


def pin(config: DictConfig, key: str) -> Path:
    """The directory at ``key`` (``hydra.run.dir``, ``hydra.sweep.dir``: the override a refusal names) resolved once
    and written back into ``config`` as a plain path: :func:`fresh` when its value is named by the time.

    Raises:
        Refused: a time-named directory that cannot be made (:func:`fresh`).
    """
    node, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, node)
    raw = str(OmegaConf.to_container(parent, resolve=False)[leaf])
    path = Path(str(OmegaConf.select(config, key)))
    if TIME_NAMED in raw:
        path = fresh(path, key)
    with read_write(parent), open_dict(parent):
        parent[leaf] = str(path)
    return path


def hold(directory: Path, lock_name: str, override: str, what: str = "command") -> IO:
    """Hold ``directory`` for this command until the returned file is closed (or the process ends): created if
    needed, then an exclusive ``flock`` on ``lock_name`` in it.

    Raises:
        Refused: another command holds it, or it cannot be created or written; the message names ``override``.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / lock_name, "a")  # noqa: SIM115 - held open for the command, closed by the caller
    except OSError as e:
        raise _refused(directory, override, e) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise Refused(f"another {what} is running in {directory}; its files were left as they are. Start this one in "
                      f"a directory of its own: {override}=<dir>") from None
    except OSError as e:
        log.warning("cannot lock %s (%s): a command started there at the same time would not be refused", directory, e)
    return lock


def other_run(directory: Path, task: list[str], outcome_files: tuple[str, ...]) -> str | None:
    """How ``directory`` holds the outcome of another command (one run with other overrides, as Hydra recorded them
    in ``.hydra/overrides.yaml``), or None: empty, the same command's, or no outcome left."""
    left = [name for name in outcome_files if (directory / name).exists()]
    recorded = directory / ".hydra" / "overrides.yaml"
    if not left or not recorded.exists():
        return None
    try:
        theirs = OmegaConf.to_container(OmegaConf.load(recorded))
    except Exception as e:  # noqa: BLE001 - unreadable: not provably the same command
        return f"holds {', '.join(left)} of a command whose overrides cannot be read ({type(e).__name__})"
    if theirs == list(task):
        return None
    return f"holds {', '.join(left)} of another command ({' '.join(map(str, theirs)) or '(defaults)'})"
