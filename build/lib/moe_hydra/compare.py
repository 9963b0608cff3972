"""``python -m moe_hydra.compare``: the command; the comparison lives in :mod:`moe_hydra.analysis.compare`."""

import sys

from moe_hydra.analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
