"""Composing moe_hydra's config outside ``hydra.main``, one way: the commands (export), the tests and the benchmarks.

:func:`compose` gives the config ``python -m moe_hydra OVERRIDES`` composes: Hydra's own composition of the real
``conf/`` (and the site and ``hydra.searchpath`` directories), through :class:`~moe_hydra.launch.points.Composer`,
the points sweeper's template composer, which composes once per distinct set of config groups and applies the value
overrides to a copy as Hydra applies them. ``tests/test_campaign_units.py`` holds the composer equal to Hydra's
``load_sweep_config``, and ``tests/test_configs.py`` :func:`compose` equal to Hydra's ``compose`` API.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, open_dict

from moe_hydra.core.schema import CONF_PACKAGE, Config, register_configs, typed
from moe_hydra.launch import layout_sweeper, points, slurm


_COMPOSERS: dict[tuple[str, ...], points.Composer] = {}  # per set of Hydra overrides (hydra.searchpath=..., ...)


def _is_hydra_override(override: str) -> bool:
    key = override.lstrip("+~")
    return key.startswith(("hydra.", "hydra/")) or key.split("=", 1)[0] == "hydra"


def register() -> None:
    """Register what moe_hydra's root config refers to: the schema, the Slurm launcher, the sweepers."""
    register_configs()
    slurm.register()
    layout_sweeper.register()
    points.register()


def compose(overrides: Sequence[str] = (), *, hydra: bool = False) -> DictConfig:
    """The config ``python -m moe_hydra OVERRIDES`` composes, with its ``hydra`` node when ``hydra`` is set.

    Raises:
        hydra.errors.ConfigCompositionException: an override that does not compose (as Hydra raises it).
        hydra.errors.OverrideParseException: an override Hydra's grammar cannot read.
    """
    hydra_overrides = tuple(o for o in overrides if _is_hydra_override(o))
    composer = _COMPOSERS.get(hydra_overrides)
    if composer is None:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra._internal.utils import create_config_search_path
        from hydra.types import RunMode

        register()
        loader = ConfigLoaderImpl(config_search_path=create_config_search_path(f"pkg://{CONF_PACKAGE}"))
        master = loader.load_configuration("config", overrides=list(hydra_overrides), run_mode=RunMode.RUN)
        composer = _COMPOSERS[hydra_overrides] = points.Composer(loader, master)
    cfg = composer([o for o in overrides if not _is_hydra_override(o)])
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def compose_typed(overrides: Sequence[str] = ()) -> Config:
    """:func:`compose` as the schema's objects (what the rules and the planner read)."""
    return typed(compose(overrides))
