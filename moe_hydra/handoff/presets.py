"""The config groups' presets as literal values: what ingest compares flags against, without composing.

Ingest needs two things from the presets, hundreds of times a second (the layout search exports its top layouts,
the benchmark every preset): which option of a group the flags match (``flex`` + ``deepep`` is ``dispatcher=deepep``),
and which of the keys it derived from the flags the chosen presets already set (those are not printed again). Both
read ``conf/<group>/<option>.yaml`` as written — its ``# @package`` placement, its values — over the schema's
defaults, in the order of ``conf/config.yaml``'s defaults list, which is what Hydra composes for presets without
defaults lists of their own. Interpolations resolve when they name one key (``${model.seq_length}``,
``${.devices_per_node}``, ``${moe_hydra.last_step:${contract.window}}``: :func:`moe_hydra.core.presets.reference`);
anything else counts as unknown, and an unknown value is never
taken as equal. A site configuration (``MOE_HYDRA_SITE``) or an experiment can set any key: with either, nothing is
left out.

The readers of the preset files themselves are the core's (:mod:`moe_hydra.core.presets`).

Pure: the standard library, omegaconf (YAML), moe_hydra.core.
"""

from __future__ import annotations

from typing import Any

from moe_hydra.core.presets import UNKNOWN, defaults, options, preset, reference, schema_defaults
from moe_hydra.core.schema import site_dir

__all__ = ["UNKNOWN", "defaults", "literal", "mismatches", "options", "preset", "same", "schema_defaults"]


def literal(choices: dict[str, str | None], key_overrides: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """The values a composition would give the keys the presets (and ``key_overrides``) set literally; None when
    a site configuration or an experiment could set anything."""
    if site_dir() is not None or choices.get("experiment"):
        return None
    base = dict(schema_defaults())
    for group, default in defaults():
        option = choices.get(group, default)
        if option is None:
            continue
        if option not in options(group):
            return None
        base.update(preset(group, option))
    for key, value in key_overrides:
        base[key] = value
    return {k: _resolve(base, k, v) for k, v in base.items()}


def _resolve(base: dict[str, Any], key: str, v: Any, depth: int = 0) -> Any:
    if not isinstance(v, str) or "${" not in v:
        return v
    ref = reference(v)
    if ref is None or depth > 8:
        return UNKNOWN
    relative, path, index, fn = ref
    target = f"{key.rsplit('.', 1)[0]}.{path}" if relative else path
    if target not in base:
        return UNKNOWN
    x = _resolve(base, target, base[target], depth + 1)
    if x is UNKNOWN:
        return UNKNOWN
    try:
        return fn(x if index is None else x[index])
    except (TypeError, IndexError, KeyError):
        return UNKNOWN


def same(a: Any, b: Any) -> bool:
    """Equal as config values: bools only equal bools, numbers by value, sequences item by item."""
    if a is UNKNOWN or b is UNKNOWN:
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def mismatches(group: str, option: str, values: dict[str, Any], section: str | None = None) -> list[str]:
    """The keys of ``values`` under ``section`` (the group's name by default) that ``group=option`` (over the
    schema's defaults) sets otherwise."""
    p, d = preset(group, option), schema_defaults()
    prefix = (section or group) + "."
    out = []
    for k, v in values.items():
        if not k.startswith(prefix):
            continue
        have = p.get(k, d.get(k, UNKNOWN))
        if isinstance(have, str) and "${" in have:
            continue
        if not same(have, v):
            out.append(k)
    return out
