"""``python -m moe_hydra.sweep status DIR``: the command; a sweep's state lives in :mod:`moe_hydra.launch.state`."""

import sys

from moe_hydra.launch.state import main

if __name__ == "__main__":
    sys.exit(main())
