"""``hydra/sweeper=points`` (moe_hydra's default): every point of a sweep launched, every JobReturn returned.

Hydra's ``BasicSweeper`` raises the first failed point's exception once its batch has run, which ends the
command before Hydra's ``on_multirun_end`` callbacks and before any later batch; and it composes every point
of a batch before launching any, so one point Hydra cannot compose (``train.micro_batch_size=abc,1``) ends the
whole sweep. moe_hydra refuses points (``Refused``) and reports failed ones (``Failed``) as JobReturns, so this
sweeper expands the sweep as the basic sweeper does (its ``split_arguments``: the cartesian product, in batches
of ``max_batch_size``), composes every point (as the basic sweeper does, to fail before anything is queued),
refuses those that do not compose, launches the rest with their own job numbers and returns every JobReturn; the
run command's :class:`~moe_hydra.commands.run.Outcomes` callback turns them into the report and the exit code.

One sweep per directory: :func:`claim` holds ``hydra.sweep.dir`` while a sweep runs (the layout sweeper takes it
too), before ``multirun.yaml`` is written.
"""

from __future__ import annotations

import copy
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from moe_hydra.core.errors import Refused
from moe_hydra.launch import directories, outcome, sequential

log = logging.getLogger("moe_hydra")

LOCK_FILE = directories.SWEEP_LOCK  # in the sweep directory; flock'ed while a sweep runs
# Points this sweeper composed (to refuse those Hydra cannot compose), handed to the launcher that launches them so
# it does not compose them again: (id of the sweep's config, the point's overrides) -> the composed config
_COMPOSED: dict[tuple[int, tuple[str, ...]], DictConfig] = {}


def composed(config: DictConfig, overrides: list[str]) -> DictConfig | None:
    """The config of a point this sweeper composed from ``config`` (taken: a launcher asks once), else None."""
    return _COMPOSED.pop((id(config), tuple(overrides)), None)


class Composer:
    """Hydra's ``load_sweep_config(master, point)`` for the many points of one sweep, at a fraction of its cost.

    Hydra composes every point from scratch: the defaults list, every config file, the merge (~0.1 s a point,
    most of a 100-point sweep's launch). Points that select the same config groups differ only in the value
    overrides Hydra applies after composing them, so the composition is done once per distinct set of group
    overrides (Hydra's own ``load_sweep_config``) and each point gets a copy with its value overrides applied as
    Hydra applies them (``ConfigLoaderImpl._apply_overrides_to_config``), its ``hydra.overrides.task`` and
    ``hydra.job.override_dirname`` set as Hydra sets them. Which overrides select a group is Hydra's call too
    (its repository of this point's search path, ``group_exists``, as ``create_defaults_list`` decides). A point
    with a Hydra override, or anything this path does not handle, is composed by Hydra itself, which also raises
    the error of a point that does not compose. ``tests/test_campaign_units.py`` holds the two equal."""

    def __init__(self, loader: Any, master: DictConfig):
        self.loader, self.master = loader, master
        self._kinds: dict[tuple, list[bool]] = {}
        self._templates: dict[tuple[str, ...], DictConfig] = {}

    def __call__(self, point: list[str]) -> DictConfig:
        try:
            return self._fast(list(point))
        except Exception:  # noqa: BLE001 - Hydra composes it, and raises what does not compose
            return self.loader.load_sweep_config(self.master, list(point))

    def _fast(self, point: list[str]) -> DictConfig:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname

        parsed = OverridesParser.create().parse_overrides(point)
        if any(o.is_hydra_override() or o.is_sweep_override() for o in parsed):
            raise ValueError("composed by Hydra")
        kinds = tuple((o.key_or_group, o.package, isinstance(o.value(), dict)) for o in parsed)
        if kinds not in self._kinds:
            hydra_overrides = OmegaConf.to_container(self.master.hydra.overrides.hydra)
            _, repo = self.loader._parse_overrides_and_create_caching_repo(
                self.master.hydra.job.config_name, [*hydra_overrides, *point])
            self._kinds[kinds] = [repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict)
                                  for o in parsed]
        is_group = self._kinds[kinds]
        groups = tuple(o.input_line for o, g in zip(parsed, is_group) if g)
        if groups not in self._templates:
            self._templates[groups] = self.loader.load_sweep_config(self.master, list(groups))
        cfg = copy.deepcopy(self._templates[groups])
        ConfigLoaderImpl._apply_overrides_to_config([o for o, g in zip(parsed, is_group) if not g], cfg)
        cfg.hydra.overrides.task = [o.input_line for o in parsed]
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(overrides=parsed, kv_sep=dirname.kv_sep,
                                                               item_sep=dirname.item_sep,
                                                               exclude_keys=dirname.exclude_keys)
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        return cfg


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
    sweep's plan and the other's refusal. So a directory takes one sweep at a time (:func:`directories.hold` on
    ``.sweep.lock``) and one sweep in its life: a sweep whose ``multirun.yaml`` differs in what it sweeps (the
    task overrides, the sweeper and its ``params``) is refused. Running the same command again resumes that sweep.
    A time-named directory (the default) is a new one for every sweep (:func:`directories.pin`), pinned for the
    points too (a ``hydra.sweep.dir`` override of the sweep's, which every point's config is composed with).

    Raises:
        Refused: another sweep runs in the directory, it holds another sweep's points, or it cannot be made or
            written; the message names ``hydra.sweep.dir``. Nothing in the directory is changed.
    """
    sweep_dir = directories.pin(config, "hydra.sweep.dir")
    hydra_overrides = [o for o in OmegaConf.to_container(config.hydra.overrides.hydra)
                       if not o.lstrip("+~").startswith("hydra.sweep.dir=")]
    with read_write(config.hydra.overrides):
        config.hydra.overrides.hydra = [*hydra_overrides, f"hydra.sweep.dir={sweep_dir}"]
    lock = directories.hold(sweep_dir, LOCK_FILE, "hydra.sweep.dir", what="sweep")
    other = _other_sweep(sweep_dir / "multirun.yaml", config)
    if other:
        lock.close()
        raise Refused(f"{sweep_dir} {other}; its points would mix with this one's. Start this one in a "
                      f"directory of its own: hydra.sweep.dir=<dir> (that sweep's own command resumes it)")
    return lock


def detach_problem(config: DictConfig) -> str | None:
    """Why ``launcher.detach=true`` cannot hold for this run or sweep (it queues points on Slurm; launcher=local runs
    them in this process), or None."""
    if OmegaConf.select(config, "launcher.detach", default=False) and \
            OmegaConf.select(config, "launcher.name", default=None) != "slurm":
        return ("launcher.detach=true queues the points on Slurm and returns; it needs launcher=slurm "
                "(launcher=local runs them here, in this process). Nothing was launched; fix: launcher=slurm, or "
                "launcher.detach=false")
    return None


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


class PointsSweeperImpl(Sweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict | None = None):
        super().__init__()
        self.max_batch_size, self.params = max_batch_size, dict(params or {})
        self.config = self.launcher = self.hydra_context = None
        self._composer: Composer | None = None

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
        detached = detach_problem(self.config)
        if detached:
            return [[outcome.refuse(self.hydra_context, self.config, ["launcher.detach=true"], detached)]]
        try:
            lock = claim(self.config)
        except Refused as e:
            return [[outcome.refuse(self.hydra_context, self.config, [f"hydra.sweep.dir={self.config.hydra.sweep.dir}"],
                                  str(e))]]
        with lock:
            OmegaConf.save(self.config, Path(str(self.config.hydra.sweep.dir)) / "multirun.yaml")
            if sequential.requested(self.config):  # repeat=auto: rounds of the arms until decided
                return sequential.drive(self, overrides)
            returns, first = [], 0
            for batch in BasicSweeper.split_arguments(overrides, self.max_batch_size):
                returns.append(self._launch(batch, first))
                first += len(batch)
        return returns

    def work(self, point: list[str]) -> Any:
        """What a step of ``point`` trains (:class:`moe_hydra.core.contract.Work`, from its resolved plan), or None
        when it does not compose or plan (its own launch refuses it, saying why). Pure planning: nothing runs."""
        from moe_hydra.core import contract
        from moe_hydra.core.resolved import resolve
        from moe_hydra.core.schema import typed
        from moe_hydra.core.violations import LayoutError

        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(point))
            return contract.Work.of_resolved(resolve(typed(cfg)))
        except (LayoutError, ConfigCompositionException, OmegaConfBaseException, Refused):
            return None

    def _launch(self, batch: list[list[str]], first: int) -> list:
        """Compose every point of ``batch`` (``first``: its first job number); launch each run of consecutive points
        that compose at once, under their own job numbers, and refuse the others. Every JobReturn, in point order."""
        self._composer = Composer(self.hydra_context.config_loader, self.config)
        points = list(enumerate(batch, first))
        problems = {num: self._composition_problem(point) for num, point in points}
        returns = []
        for composes, run in itertools.groupby(points, key=lambda p: problems[p[0]] is None):
            run = list(run)
            if composes:
                try:
                    returns += self.launcher.launch([point for _, point in run], initial_job_idx=run[0][0])
                finally:  # a launcher that composes for itself leaves them here
                    for _, point in run:
                        _COMPOSED.pop((id(self.config), tuple(point)), None)
            else:
                returns += [self._refuse_point(num, point, problems[num]) for num, point in run]
        return returns

    def _composition_problem(self, point: list[str]) -> str | None:
        """Why Hydra cannot compose this point (a value of the wrong type for its key), or None."""
        try:
            cfg = self._composer(point)
        except ConfigCompositionException as e:
            return "\n".join(str(x).strip() for x in (e, e.__cause__) if x is not None)
        _COMPOSED[(id(self.config), tuple(point))] = cfg
        return None

    def _refuse_point(self, num: int, point: list[str], problem: str) -> Any:
        """Refuse point ``num``, which Hydra cannot compose, under its own number (for the report)."""
        config = copy.deepcopy(self.config)
        with open_dict(config):
            config.hydra.job.num = num
        reason = problem.replace("\n", "\n  ")
        message = f"#{num} {' '.join(point)}: Hydra cannot compose this point; it was not launched.\n  {reason}"
        return outcome.refuse(self.hydra_context, config, list(point), message)
