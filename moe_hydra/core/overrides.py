"""Command-line overrides, written and read in Hydra's own grammar: the one codec every part uses.

:func:`text` writes a value as Hydra's parser reads it back (``null``, ``true``, ``[a,b]``, quoted strings);
:func:`apply` reads overrides with Hydra's ``OverridesParser`` and applies them to a typed config the way a
command line would (``group=option`` merges ``conf/<group>/<option>.yaml``, ``a.b=value`` sets a key);
:func:`tree` turns key overrides into the nested mapping an experiment file holds.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import replace
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z0-9_./+\-:]+$")  # a string Hydra reads back as itself, unquoted


def text(v: Any) -> str:
    """``v`` as override text that Hydra's grammar parses back to ``v``."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(text(x) for x in v) + "]"
    v = getattr(v, "value", v)  # enums by value
    if isinstance(v, str) and not (_PLAIN.match(v) and not _reads_as_other(v)):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(v)


def _reads_as_other(v: str) -> bool:
    """Whether Hydra reads the unquoted string as something else: a number, a bool, null."""
    if v.lower() in ("null", "true", "false"):
        return True
    try:
        float(v)
    except ValueError:
        return False
    return True


def override(key: str, v: Any) -> str:
    return f"{key}={text(v)}"


def key(o: str) -> str:
    """The key (or config group) an override sets: ``recompute`` of ``recompute=full``, ``a.b`` of ``+a.b=1``."""
    return o.lstrip("+~").split("=", 1)[0]


def merge(arm: list[str], change: list[str]) -> list[str]:
    """``arm`` with ``change`` applied: an override of the same key replaced; a config group's option replaced with
    the dotted overrides of that group (``recompute=none`` drops ``recompute.recompute_modules=...``)."""
    keys = {key(o) for o in change}
    groups = {k for k in keys if "." not in k}
    return [o for o in arm if key(o) not in keys and key(o).split(".")[0] not in groups] + list(change)


def parse(overrides: list[str]) -> list:
    """Hydra's parse of ``overrides`` (``hydra.core.override_parser.types.Override`` objects)."""
    return _parser().parse_overrides(list(overrides))


@functools.lru_cache(maxsize=1)
def _parser():
    """Hydra's override parser, made once (building it costs milliseconds)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def preset(group: str, option: str, node: Any) -> Any:
    """``conf/<group>/<option>.yaml`` applied over ``node`` (a typed config node), as choosing it on the command
    line would. Kept by the node's field values: the suggestions and the search apply the same presets to the
    same nodes many times (the result is shared; nodes are replaced, never changed in place)."""
    key = (group, option, type(node), _hashable(dataclasses.astuple(node)))
    found = _PRESETS.get(key)
    if found is None:
        from omegaconf import OmegaConf

        from moe_hydra.core.schema import conf_dir

        merged = OmegaConf.merge(OmegaConf.structured(node), OmegaConf.load(conf_dir() / group / f"{option}.yaml"))
        found = _PRESETS[key] = OmegaConf.to_object(merged)
    return found


_PRESETS: dict[tuple, Any] = {}


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, (list, tuple)) else v


def apply(cfg: Any, overrides: list[str]) -> Any:
    """A copy of the typed config ``cfg`` with ``overrides`` applied (``group=option`` or ``section.key=value``)."""
    from omegaconf import OmegaConf

    for o in parse(overrides):
        key, value = o.key_or_group, o.value()
        if "." not in key:
            cfg = replace(cfg, **{key: preset(key, value, getattr(cfg, key))})
            continue
        section, path = key.split(".", 1)
        node = getattr(cfg, section)
        if "." in path or not dataclasses.is_dataclass(node):  # deeper than section.field: OmegaConf walks it
            typed = OmegaConf.structured(node)
            OmegaConf.update(typed, path, value, merge=False)
            cfg = replace(cfg, **{section: OmegaConf.to_object(typed)})
        else:
            cfg = replace(cfg, **{section: replace(node, **{path: value})})
    return cfg


def tree(overrides: list[str]) -> dict[str, Any]:
    """The key overrides (``a.b=value``) as a nested mapping, values as Hydra parses them."""
    from omegaconf import OmegaConf

    keys = [o for o in parse(overrides) if "." in o.key_or_group]
    dotlist = [f"{o.key_or_group}={text(o.value())}" for o in keys]
    return OmegaConf.to_container(OmegaConf.from_dotlist(dotlist))
