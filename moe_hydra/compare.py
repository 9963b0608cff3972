"""``python -m moe_hydra.compare``: the command (exit 0 done, 1 an error, 2 refused or bad input); the comparison
lives in :mod:`moe_hydra.analysis.compare`."""

import sys

from moe_hydra.analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
