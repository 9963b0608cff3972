"""``hydra/sweeper=points`` (moe_hydra's default): every point of a sweep launched, every JobReturn returned.

Hydra's ``BasicSweeper`` raises the first failed point's exception once its batch has run, which ends the
command before Hydra's ``on_multirun_end`` callbacks and before any later batch. moe_hydra refuses points
(``Refused``) and reports failed ones (``Failed``) as JobReturns, so this sweeper expands the sweep as the
basic sweeper does (its ``split_arguments``: the cartesian product, in batches of ``max_batch_size``),
launches every batch and returns every JobReturn; the app's :class:`~moe_hydra.app.Outcomes` callback
turns them into the report and the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf


@dataclass
class PointsSweeperConf:
    _target_: str = "hydra_plugins.moe_hydra_sweeper.PointsSweeper"
    # Points launched at once; null: all of them.
    max_batch_size: Optional[int] = None
    # Sweeps written in the config (like the command line's `key=a,b`).
    params: Optional[dict] = field(default_factory=dict)


def register() -> None:
    ConfigStore.instance().store(group="hydra/sweeper", name="points", node=PointsSweeperConf, provider="moe_hydra")


class PointsSweeperImpl(Sweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict | None = None):
        super().__init__()
        self.max_batch_size, self.params = max_batch_size, dict(params or {})
        self.config = self.launcher = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        # imported here: Hydra's plugin scan re-executes its core plugin modules, so a class taken at import
        # time would not be the one Hydra uses
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*(f"{k}={v}" for k, v in self.params.items()), *arguments])
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, first = [], 0
        for batch in BasicSweeper.split_arguments(overrides, self.max_batch_size):
            self.validate_batch_is_legal(batch)
            returns.append(self.launcher.launch(batch, initial_job_idx=first))
            first += len(batch)
        return returns
