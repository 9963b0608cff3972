"""The config groups' presets as literal values, read without composing: ``conf/<group>/<option>.yaml`` as written
(its ``# @package`` placement, its values) over the schema's defaults, in the order of ``conf/config.yaml``'s
defaults list, which is what Hydra composes for presets without defaults lists of their own.

Two readers: the hand-off (:mod:`moe_hydra.handoff.presets`: which option of a group a set of flags matches) and
the fixes of refused values (:func:`chosen`: the value a key had from the presets a config was composed from, what
:mod:`moe_hydra.core.bounds` suggests in place of a value outside its domain).

Pure: the standard library, PyYAML and omegaconf (imported when a preset is first read).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from operator import attrgetter
from pathlib import Path
from typing import Any

from moe_hydra.core.schema import Config, conf_dir, last_step

UNKNOWN = object()
_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)")
_REF = re.compile(r"^\$\{(\.?)([\w.]+?)(?:\[(\d+)\])?\}$")
# the schema's resolvers an interpolation of one key may call, by name
_RESOLVERS = {"moe_hydra.last_step": last_step}
_CALL = re.compile(r"^\$\{([\w.]+):(\$\{[^{}]+\})\}$")


def reference(v: str) -> tuple[bool, str, int | None, Any] | None:
    """An interpolation of one key: (relative, the key, an index or None, the function applied to the value, e.g.
    :func:`moe_hydra.core.schema.last_step` for ``${moe_hydra.last_step:${contract.window}}``); None for anything
    else."""
    fn = None
    call = _CALL.match(v.strip())
    if call:
        fn = _RESOLVERS.get(call.group(1))
        if fn is None:
            return None
        v = call.group(2)
    m = _REF.match(v.strip())
    if not m:
        return None
    relative, target, index = m.groups()
    return bool(relative), target, None if index is None else int(index), fn or (lambda x: x)


@functools.cache
def _loader() -> type:
    """OmegaConf's YAML loader (its float resolver, no timestamps) on libyaml's parser where PyYAML has it: a
    file's values as ``OmegaConf.load`` reads them, in a tenth of the time (a layout search whose fixes name a
    preset's value reads every option of a group; tests/test_presets.py compares the two on every file)."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    loader = get_yaml_loader()
    if not hasattr(yaml, "CSafeLoader"):
        return loader
    return type("PresetLoader", (yaml.CSafeLoader,), {"yaml_implicit_resolvers": loader.yaml_implicit_resolvers})


def read_yaml(path: Path) -> Any:
    """A YAML file's values as plain containers, as ``OmegaConf.to_container(OmegaConf.load(path))`` gives them
    (interpolations kept as strings); an empty file is an empty mapping."""
    import yaml

    node = yaml.load(path.read_text(), Loader=_loader())
    return {} if node is None else node


@functools.lru_cache(maxsize=1)
def defaults() -> tuple[tuple[str, str | None], ...]:
    """(group, default option) in the order of ``conf/config.yaml``'s defaults list."""
    out = []
    for item in read_yaml(conf_dir() / "config.yaml")["defaults"]:
        if isinstance(item, dict):
            (group, option), = item.items()
            if " " in group or group.startswith("hydra"):  # "optional site", "override hydra/sweeper"
                continue
            out.append((group, option))
    return tuple(out)


@functools.cache
def options(group: str) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (conf_dir() / group).glob("*.yaml")))


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _flatten(v, f"{prefix}{k}.", out)
    else:
        out[prefix[:-1]] = node


@functools.cache
def preset(group: str, option: str) -> dict[str, Any]:
    """``conf/<group>/<option>.yaml`` as flat dotted keys, placed at its package."""
    path = conf_dir() / group / f"{option}.yaml"
    text = path.read_text()
    package = group
    for line in text.splitlines():
        m = _PACKAGE.match(line.strip())
        if m:
            package = m.group(1)
            break
        if line.strip() and not line.startswith("#"):
            break
    node = read_yaml(path)
    node.pop("defaults", None)
    node.pop("hydra", None)
    out: dict[str, Any] = {}
    _flatten(node, "" if package == "_global_" else f"{package}.", out)
    return out


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Every leaf of the schema with its default (``${...}`` for interpolated defaults); mandatory ones left out."""
    out: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                v = f.default_factory()  # type: ignore[misc]
                if dataclasses.is_dataclass(v):
                    walk(type(v), f"{prefix}{f.name}.")
                    continue
            else:
                v = f.default
            if v == "???" or v is dataclasses.MISSING:
                continue
            out[f"{prefix}{f.name}"] = getattr(v, "value", v)

    walk(Config, "")
    return out


def chosen(cfg: Config, path: str, *, own: bool = False) -> Any:
    """The value ``path`` has from the presets the typed config ``cfg`` was composed from, over the schema's
    defaults: each group's option is its node's ``name`` (what the mesh groups, an experiment and a site
    configuration set is not recorded in ``cfg``, so not read). An interpolation of one key (:func:`reference`) is read
    from ``cfg``, or with ``own`` from the presets' value of the key it names. :data:`UNKNOWN` when nothing sets it
    or the interpolation cannot be read."""
    found = schema_defaults().get(path, UNKNOWN)
    for group, _ in defaults():
        if not _sets(group, path):  # the group's choice is not read: the layout search varies some of them
            continue
        option = getattr(getattr(cfg, group, None), "name", None)
        if isinstance(option, str) and option in options(group):
            found = preset(group, option).get(path, found)
    return _read(cfg, path, found, own)


@functools.cache
def _sets(group: str, path: str) -> bool:
    """Whether any option of ``group`` sets ``path``."""
    return any(path in preset(group, option) for option in options(group))


def _read(cfg: Config, path: str, v: Any, own: bool) -> Any:
    if not isinstance(v, str) or "${" not in v:
        return v
    ref = reference(v)
    if ref is None:
        return UNKNOWN
    relative, target, index, fn = ref
    target = f"{path.rsplit('.', 1)[0]}.{target}" if relative else target
    try:
        x = chosen(cfg, target, own=True) if own else attrgetter(target)(cfg)
        return fn(x if index is None else x[index])
    except (AttributeError, TypeError, IndexError, KeyError):
        return UNKNOWN
