"""``python -m moe_hydra.compare``: the command (exit 0 done, 1 an error, 2 refused or bad input); the comparison
lives in :mod:`moe_hydra.analysis.compare`. A campaign that is still running (a detached Slurm sweep) is compared
as far as it has got, with a note saying how many points are still out."""

import sys

from moe_hydra.analysis.compare import main

if __name__ == "__main__":
    from moe_hydra.launch.state import campaign_notes

    for note in campaign_notes(sys.argv[1:]):
        print(f"moe_hydra.compare: note: {note}", file=sys.stderr)
    sys.exit(main())
