"""Command-line overrides checked before Hydra composes: a misspelt key or option gets a suggestion.

Hydra already refuses unknown keys and options; this adds the "did you mean" and names the
override to change. The command line is read with Hydra's own parser, so Hydra's flags (``--cfg``,
``-sc install=bash``, ``--info``) pass through untouched and only the overrides are checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from moe_hydra.core import overrides
from moe_hydra.core.schema import Config, conf_dir, site_dir


def groups(search_path: list[Path] | tuple[Path, ...] = ()) -> dict[str, list[str]]:
    """Config groups under ``conf/`` (and the site and ``search_path`` directories) and their options."""
    out: dict[str, set[str]] = {}
    for root in config_roots(search_path):
        for d in sorted(Path(root).iterdir()) if Path(root).is_dir() else ():
            if d.is_dir():
                out.setdefault(d.name, set()).update(p.stem for p in d.glob("*.yaml"))
    return {name: sorted(options) for name, options in sorted(out.items())}


def config_roots(search_path: list[Path] | tuple[Path, ...] = ()) -> list[Path]:
    """The directories Hydra composes from: moe_hydra's configs, the site's, then ``search_path``'s."""
    site = site_dir()
    return [conf_dir(), *([site] if site else []), *search_path]


def search_path(args: list[str]) -> list[Path]:
    """The ``file://`` directories of a ``hydra.searchpath=[...]`` override (the layout search writes one)."""
    for a in args:
        if a.startswith("hydra.searchpath="):
            (o,) = overrides.parse([a])
            return [Path(p[len("file://"):]) for p in o.value() if p.startswith("file://")]
    return []


def normalize(args: list[str]) -> list[str]:
    """``+group=option`` -> ``group=option`` for moe_hydra's own groups; ``hydra.run.dir`` also the sweep's
    directory unless ``hydra.sweep.dir`` is given; ``-m`` first.

    Every group sits in the root defaults (optional ones as null), where Hydra 1.3 takes
    ``group=option`` but refuses ``+group=option`` ("Multiple values for group"). Both spellings are
    common, so both work.

    A command that names its output directory expects its outputs there, whether it runs once or as a sweep:
    ``-m``, or a config that switches to one (``experiment=dispatcher_ab``, ``launcher=slurm`` set
    ``hydra.mode: MULTIRUN``). So ``hydra.run.dir=DIR`` without ``hydra.sweep.dir`` puts a sweep's points in
    ``DIR/<n>/`` (Hydra alone would use ``outputs/multirun/<date>/<time>``).

    ``repeat=auto`` (repeat is an integer) becomes ``compare.sequential=true`` and a sweep
    (:func:`moe_hydra.launch.sequential.normalize`).
    """
    from moe_hydra.launch import sequential

    known = set(groups())
    out = []
    for a in sequential.normalize(args):
        if a.startswith("+") and not a.startswith("++") and "=" in a and a[1:].split("=", 1)[0] in known:
            a = a[1:]
        out.append(a)
    run_dir = [a.split("=", 1)[1] for a in out if a.startswith("hydra.run.dir=")]
    if run_dir and not any(a.startswith("hydra.sweep.dir=") for a in out):
        out.append(f"hydra.sweep.dir={run_dir[-1]}")
    # Hydra's parser takes overrides only in one run: `-m` between overrides ("... -m key=value")
    # would leave the ones after it unrecognised. The flag goes first.
    flags = [a for a in out if a in ("-m", "--multirun")]
    return flags + [a for a in out if a not in flags]


def _fields(cls: type) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_key(path: list[str]) -> str | None:
    node: typing.Any = Config
    for i, part in enumerate(path):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None  # below a free-form field (Any, list, dict): Hydra checks the rest
        fields = _fields(node)
        if part not in fields:
            where = ".".join(path[:i]) or "the root config"
            close = difflib.get_close_matches(part, fields, n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr('.'.join(path[:i] + [c])) for c in close)}?" if close else ""
            return f"unknown key '{'.'.join(path)}': {where} has no '{part}'.{hint}"
        node = fields[part]
    return None


def _values(override) -> list[str]:
    value = override.value()
    options = getattr(value, "list", None)
    if options is None:
        options = [value]
    return [v for v in options if isinstance(v, str)]


def _parse_each(candidates: list[str]) -> tuple[list, list[str]]:
    """(Hydra's parse of each override, a problem for each that its grammar cannot read, with the parser's
    message): one at a time, so the message names the override at fault."""
    from hydra.errors import OverrideParseException

    parsed, problems = [], []
    for c in candidates:
        try:
            parsed += overrides.parse([c])
        except OverrideParseException as e:
            problems.append(f"cannot read the override {c!r}:\n    " + str(e).replace("\n", "\n    "))
    return parsed, problems


def check_overrides(args: list[str]) -> list[str]:
    """Problems found in ``args`` (empty when every override reads and every key and group option exists)."""
    from hydra._internal.utils import get_args_parser

    parsed = get_args_parser().parse_args(args)
    if parsed.shell_completion:  # `-sc install=bash`: Hydra's own arguments, not overrides
        return []
    candidates = parsed.overrides
    if not candidates:
        return []
    parsed_overrides, unreadable = _parse_each(candidates)
    if unreadable:
        return unreadable
    all_groups = groups(search_path(args))
    problems = []
    for o in parsed_overrides:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete():
            continue
        if key in all_groups:
            for v in _values(o):
                if v not in all_groups[key]:
                    close = difflib.get_close_matches(v, all_groups[key], n=3, cutoff=0.5)
                    hint = f" Did you mean {' or '.join(f'{key}={c}' for c in close)}?" if close else ""
                    problems.append(
                        f"unknown option '{key}={v}'.{hint} Options: {', '.join(all_groups[key])}"
                    )
            continue
        problem = _check_key(key.split("."))
        if problem:
            problems.append(problem)
    return problems
