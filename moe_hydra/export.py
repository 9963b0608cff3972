"""``python -m moe_hydra.export {megatron-lm,bridge} (DIR | OVERRIDES...)``: a moe_hydra plan as the command that
trains it with Megatron-LM's ``pretrain_gpt.py`` or a Megatron-Bridge recipe (the mapping lives in
:mod:`moe_hydra.handoff`; docs/handoff.md).

DIR: a run or sweep-point directory (its ``.hydra/config.yaml`` and ``overrides.yaml``); OVERRIDES: moe_hydra
overrides, composed as ``python -m moe_hydra`` would and checked by the same rules. The command goes to stdout; what
it could not say goes to stderr. Exit codes: 0 printed; 2 bad input (no such directory, an override that does not
compose, a layout the rules refuse), one message, nothing printed on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = """usage: python -m moe_hydra.export {megatron-lm,bridge} (DIR | OVERRIDES...)

  DIR        a run or sweep-point directory of python -m moe_hydra (it holds .hydra/config.yaml)
  OVERRIDES  moe_hydra overrides, e.g. model=qwen3_30b_a3b hardware=h100_sxm mesh=ep8

Prints the command (a '# moe_hydra:' line, the launcher line, one flag or override per line) on stdout and what it
could not say on stderr. python -m moe_hydra.ingest reads it back. Exit codes: 0 printed, 2 bad input."""
EXIT_INVALID = 2


class Bad(Exception):
    """Bad input: exit 2 with this message."""


def _from_dir(path: Path):
    from omegaconf import OmegaConf

    from moe_hydra.core.resolved import resolve
    from moe_hydra.core.schema import typed

    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").is_file():
        inside = sorted(p.parent.parent.name for p in path.glob("*/.hydra/config.yaml"))
        hint = f"; it is a sweep: export one of its points ({path}/{inside[0]}, ...)" if inside else ""
        if (path / "search" / "export").is_dir():
            hint = f"; it is a layout search: its top layouts are exported in {path / 'search' / 'export'}"
        raise Bad(f"{path} has no .hydra/config.yaml: not the directory of a moe_hydra run or sweep point{hint}")
    if (path / "violations.json").is_file() and not (path / "plan.json").is_file():
        raise Bad(f"{path} holds a refused point (violations.json): there is no plan to export")
    try:
        cfg = typed(OmegaConf.load(hydra_dir / "config.yaml"))
        overrides_file = hydra_dir / "overrides.yaml"
        original = list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else []
        hydra_overrides = []
        if (hydra_dir / "hydra.yaml").is_file():
            hydra_overrides = list(OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.overrides.hydra")
                                   or [])
    except Exception as e:  # noqa: BLE001 - any unreadable file is bad input, said in one line
        raise Bad(f"{hydra_dir} cannot be read as a moe_hydra config: {str(e).splitlines()[0]}") from None
    return cfg, resolve(cfg), [str(o) for o in original], [str(o) for o in hydra_overrides]


def _from_overrides(args: list[str]):
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from moe_hydra import cli
    from moe_hydra.core import overrides
    from moe_hydra.core.resolved import resolve
    from moe_hydra.core.schema import CONF_PACKAGE, register_configs, typed
    from moe_hydra.core.versions import mcore_facts
    from moe_hydra.core.violations import LayoutError
    from moe_hydra.launch import points, slurm
    from moe_hydra.planning import rules

    args = cli.normalize(args)
    try:
        parsed = overrides.parse(args)
    except Exception as e:  # noqa: BLE001 - Hydra's parser error, said in one line
        raise Bad(f"cannot read the overrides: {str(e).splitlines()[0]}") from None
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    if sweeps or "-m" in args:
        raise Bad(f"export takes one configuration, not a sweep ({' '.join(sweeps) or '-m'}): export each point")
    problems = cli.check_overrides(args)
    if problems:
        raise Bad("\n  ".join(problems))
    register_configs()
    slurm.register()
    points.register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(CONF_PACKAGE, version_base="1.3"):
            composed = compose("config", overrides=[a for a in args if not a.startswith("hydra.")])
        cfg = typed(composed)
    except Exception as e:  # noqa: BLE001 - a composition error is bad input, said in one line
        raise Bad(f"the overrides do not compose: {str(e).splitlines()[0]}") from None
    finally:
        GlobalHydra.instance().clear()
    try:
        r = resolve(cfg)
        rules.validate(r, mcore=mcore_facts())
    except LayoutError as e:
        raise Bad(e.report()) from None
    return cfg, r, [a for a in args if not a.startswith("hydra.")], [a for a in args if a.startswith("hydra.")]


def main(argv: list[str] | None = None) -> int:
    from moe_hydra.handoff import export

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else EXIT_INVALID
    fmt, rest = args[0], args[1:]
    try:
        if fmt not in export.FORMATS:
            raise Bad(f"unknown format {fmt!r}: megatron-lm or bridge (python -m moe_hydra.export --help)")
        if len(rest) == 1 and ("=" not in rest[0] or Path(rest[0]).exists()):
            path = Path(rest[0])
            if not path.is_dir():
                raise Bad(f"{path}: no such directory (give a run directory, or moe_hydra overrides)")
            cfg, r, original, hydra_overrides = _from_dir(path)
        else:
            cfg, r, original, hydra_overrides = _from_overrides(rest)
        out = export.export(fmt, cfg, r, original, hydra_overrides)
    except Bad as e:
        print(f"moe_hydra.export: {e}", file=sys.stderr)
        return EXIT_INVALID
    sys.stdout.write(out.text)
    for line in export.report(fmt, out):
        print(f"moe_hydra.export: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
