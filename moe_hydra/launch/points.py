"""``hydra/sweeper=points`` (moe_hydra's default): every point of a sweep launched, every JobReturn returned.

Hydra's ``BasicSweeper`` raises the first failed point's exception once its batch has run, which ends the
command before Hydra's ``on_multirun_end`` callbacks and before any later batch; and it composes every point
of a batch before launching any, so one point Hydra cannot compose (``train.micro_batch_size=abc,1``) ends the
whole sweep. moe_hydra refuses points (``Refused``) and reports failed ones (``Failed``) as JobReturns, so this
sweeper expands the sweep as the basic sweeper does (its ``split_arguments``: the cartesian product, in batches
of ``max_batch_size``), composes every point (as the basic sweeper does, to fail before anything is queued),
refuses those that do not compose, launches the rest with their own job numbers and returns every JobReturn; the
app's :class:`~moe_hydra.app.Outcomes` callback turns them into the report and the exit code.

One sweep per directory: :func:`claim` holds ``hydra.sweep.dir`` while a sweep runs (the layout sweeper takes it
too), before ``multirun.yaml`` is written.
"""

from __future__ import annotations

import copy
import fcntl
import itertools
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from moe_hydra.launch import state

log = logging.getLogger("moe_hydra")

LOCK_FILE = ".sweep.lock"  # in the sweep directory; flock'ed while a sweep runs


@dataclass
class PointsSweeperConf:
    _target_: str = "hydra_plugins.moe_hydra_sweeper.PointsSweeper"
    # Points launched at once; null: all of them.
    max_batch_size: Optional[int] = None
    # Sweeps written in the config (like the command line's `key=a,b`).
    params: Optional[dict] = field(default_factory=dict)


def register() -> None:
    ConfigStore.instance().store(group="hydra/sweeper", name="points", node=PointsSweeperConf, provider="moe_hydra")


def claim(config: DictConfig) -> IO:
    """Hold ``hydra.sweep.dir`` for this sweep until the returned file is closed (or the process ends).

    Two sweeps in one directory mix their files: each point's ``plan.json`` would record the other sweep's swept
    keys (``multirun.yaml``, which the contract hash reads, is overwritten), a point directory would hold one
    sweep's plan and the other's refusal. So a directory takes one sweep at a time (an exclusive ``flock`` on
    ``.sweep.lock``) and one sweep in its life: a sweep whose ``multirun.yaml`` differs in what it sweeps (the
    task overrides, the sweeper and its ``params``) is refused. Running the same command again resumes that sweep.
    A file system without ``flock`` gets a warning and the second check only.

    Raises:
        Refused: another sweep runs in the directory, or it holds another sweep's points; the message names
            ``hydra.sweep.dir``. Nothing in the directory is changed.
    """
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = open(sweep_dir / LOCK_FILE, "a")  # noqa: SIM115 - held open for the sweep, closed by the caller
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise state.Refused(f"another sweep is running in {sweep_dir}; start this one in a directory of its own: "
                            f"hydra.sweep.dir=<dir>") from None
    except OSError as e:  # e.g. a Lustre mount without -o flock
        log.warning("cannot lock %s (%s): a sweep started there at the same time would not be refused", sweep_dir, e)
    other = _other_sweep(sweep_dir / "multirun.yaml", config)
    if other:
        lock.close()
        raise state.Refused(f"{sweep_dir} {other}; its points would mix with this one's. Start this one in a "
                            f"directory of its own: hydra.sweep.dir=<dir> (that sweep's own command resumes it)")
    return lock


def _other_sweep(multirun: Path, config: DictConfig) -> str | None:
    """How the sweep recorded in ``multirun`` (``multirun.yaml``) is not ``config``'s: "holds another sweep (its task
    overrides)"; None when there is none or it is the same sweep."""
    if not multirun.exists():
        return None
    try:
        theirs = OmegaConf.load(multirun)
        same = _identity(theirs) == _identity(config)
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as e:
        return f"holds a multirun.yaml that cannot be read ({type(e).__name__}: {e})"
    return None if same else f"holds another sweep ({' '.join(_identity(theirs)['task']) or '(defaults)'})"


def _identity(config: DictConfig) -> dict:
    """What makes two sweeps one: the task overrides, the sweeper and the sweeps it holds in its config."""
    sweeper = OmegaConf.to_container(config.hydra.sweeper)
    return {"task": OmegaConf.to_container(config.hydra.overrides.task), "sweeper": sweeper.get("_target_"),
            "params": sweeper.get("params") or {}}


def _refuse(hydra_context, config: DictConfig, overrides: list[str], message: str) -> Any:
    """Refuse a point (or, named by ``overrides``, the whole sweep) before anything of it starts: the message,
    then its JobReturn (state INVALID) handed to Hydra's callbacks, as a launched point's would be."""
    print(f"moe_hydra: {message}", file=sys.stderr, flush=True)
    ret = state.job_return(overrides, "INVALID", message)
    hydra_context.callbacks.on_job_end(config=config, job_return=ret)
    return ret


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
        try:
            lock = claim(self.config)
        except state.Refused as e:
            return [[_refuse(self.hydra_context, self.config, [f"hydra.sweep.dir={self.config.hydra.sweep.dir}"],
                            str(e))]]
        with lock:
            OmegaConf.save(self.config, Path(str(self.config.hydra.sweep.dir)) / "multirun.yaml")
            returns, first = [], 0
            for batch in BasicSweeper.split_arguments(overrides, self.max_batch_size):
                returns.append(self._launch(batch, first))
                first += len(batch)
        return returns

    def _launch(self, batch: list[list[str]], first: int) -> list:
        """Compose every point of ``batch`` (``first``: its first job number); launch each run of consecutive points
        that compose at once, under their own job numbers, and refuse the others. Every JobReturn, in point order."""
        points = list(enumerate(batch, first))
        problems = {num: self._composition_problem(point) for num, point in points}
        returns = []
        for composes, run in itertools.groupby(points, key=lambda p: problems[p[0]] is None):
            run = list(run)
            if composes:
                returns += self.launcher.launch([point for _, point in run], initial_job_idx=run[0][0])
            else:
                returns += [self._refuse_point(num, point, problems[num]) for num, point in run]
        return returns

    def _composition_problem(self, point: list[str]) -> str | None:
        """Why Hydra cannot compose this point (a value of the wrong type for its key), or None."""
        try:
            self.hydra_context.config_loader.load_sweep_config(self.config, list(point))
        except ConfigCompositionException as e:
            return "\n".join(str(x).strip() for x in (e, e.__cause__) if x is not None)
        return None

    def _refuse_point(self, num: int, point: list[str], problem: str) -> Any:
        """Refuse point ``num``, which Hydra cannot compose, under its own number (for the report)."""
        config = copy.deepcopy(self.config)
        with open_dict(config):
            config.hydra.job.num = num
        reason = problem.replace("\n", "\n  ")
        message = f"#{num} {' '.join(point)}: Hydra cannot compose this point; it was not launched.\n  {reason}"
        return _refuse(self.hydra_context, config, list(point), message)
