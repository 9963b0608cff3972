"""``python -m moe_hydra.job.rank SPEC_FILE``: one rank of the job as a program of its own.

The local launcher runs each rank this way when the rank must run under another program, e.g. ``nsys profile``
for ``profile.tool=nsys`` (:func:`moe_hydra.launch.local.launch_local`): torch's elastic launcher starts the
wrapper as a binary, with this module's command after it. ``SPEC_FILE`` holds the pickled spec that
:func:`moe_hydra.job.train.worker` takes (the launcher writes it to ``<job dir>/ranks/spec.pkl``); the
distributed environment comes from the launcher, as for the in-process ranks.

Exit codes: 0 done (rank 0 wrote ``results.json``); 128 + the signal's number when a signal stopped the job
after its ranks recorded what they measured (one line on stderr, no traceback); 1 when the rank failed, its
error recorded for the launcher (torch's ``@record``: the file ``TORCHELASTIC_ERROR_FILE`` names), with the
traceback on stderr; 2 for a wrong command line.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED

USAGE = "usage: python -m moe_hydra.job.rank SPEC_FILE"


@record
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return EXIT_REFUSED
    spec = pickle.loads(Path(args[0]).read_bytes())

    from moe_hydra.job.train import Stopped, worker

    try:
        worker(spec)
    except Stopped as e:
        print(f"moe_hydra: rank {os.environ.get('RANK', '0')} {e}", file=sys.stderr, flush=True)
        return e.code
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
