"""What the tests and the benchmarks share, so that neither imports the other: hypothesis strategies for override
sets (:mod:`~moe_hydra.testing.overrides`) and for results files (:mod:`~moe_hydra.testing.results`), each with
its check. Needs the ``test`` extra (hypothesis). Composing a config outside ``hydra.main`` is
:func:`moe_hydra.launch.compose.compose_typed`.
"""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def commit_seed() -> int:
    """The seed a generated test draws with on this commit: ``MOE_HYDRA_TEST_SEED`` when set (to replay a failure),
    else a digest of the checkout's HEAD commit (each commit draws its own sample, the same one each time it is
    tested), else 0 outside a git checkout."""
    given = os.environ.get("MOE_HYDRA_TEST_SEED", "").strip()
    if given:
        return int(given)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        head = ""
    return zlib.crc32(head.encode()) if head else 0
