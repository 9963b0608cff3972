"""``python -m moe_hydra.sweep status|wait|cancel DIR``: the command; a sweep's state lives in
:mod:`moe_hydra.launch.state`. After ``wait``, a layout search whose screening was queued detached
(``launcher.detach=true``) ranks its measured layouts (:func:`moe_hydra.launch.layout_sweeper.finish_screening`)."""

import sys
from pathlib import Path

from moe_hydra.launch.state import main


def _after_wait(sweep_dir: Path) -> None:
    if (sweep_dir / "layouts.json").exists():
        from moe_hydra.launch import layout_sweeper

        layout_sweeper.finish_screening(sweep_dir)


if __name__ == "__main__":
    sys.exit(main(after_wait=_after_wait))
