"""A moe_hydra plan as the command that trains it with Megatron-LM's pretrain_gpt.py or a Megatron-Bridge recipe.

    moe-hydra export {megatron-lm,bridge} DIR           a run or sweep-point directory (its .hydra/config.yaml)
    moe-hydra export {megatron-lm,bridge} OVERRIDES...  moe_hydra overrides, e.g. model=qwen3_30b_a3b mesh=ep8

Overrides are composed as ``python -m moe_hydra`` would and checked by the same rules. The command goes to stdout (a
'# moe_hydra:' line, the launcher line, one flag or override per line); what it could not say goes to stderr.
``moe-hydra ingest`` reads it back. The mapping: docs/handoff.md.

examples:
  moe-hydra export megatron-lm model=qwen3_30b_a3b hardware=h100_sxm expert_mesh=ep8 > train.sh
  moe-hydra export bridge outputs/runs/2025-01-06/09-00-00
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moe_hydra.core.errors import EXIT_OK, EXIT_REFUSED, Refused

EXITS = {EXIT_OK: "printed", EXIT_REFUSED: "bad input (no such directory, an override that does not compose, a "
         "layout the rules refuse): one message, nothing on stdout"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("format", choices=("megatron-lm", "bridge"), help="the command to write")
    ap.add_argument("source", nargs="+", metavar="DIR | OVERRIDES", help="a run directory, or moe_hydra overrides")


def _from_dir(path: Path):
    """(the typed config, its resolved plan, the overrides it was made with, its Hydra overrides) of a run."""
    from omegaconf import OmegaConf

    from moe_hydra.core.resolved import resolve
    from moe_hydra.core.schema import typed

    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").is_file():
        inside = sorted(p.parent.parent.name for p in path.glob("*/.hydra/config.yaml"))
        hint = f"; it is a sweep: export one of its points ({path}/{inside[0]}, ...)" if inside else ""
        if (path / "search" / "export").is_dir():
            hint = f"; it is a layout search: its top layouts are exported in {path / 'search' / 'export'}"
        raise Refused(f"{path} has no .hydra/config.yaml: not the directory of a moe_hydra run or sweep point{hint}")
    if (path / "violations.json").is_file() and not (path / "plan.json").is_file():
        raise Refused(f"{path} holds a refused point (violations.json): there is no plan to export")
    try:
        cfg = typed(OmegaConf.load(hydra_dir / "config.yaml"))
        overrides_file = hydra_dir / "overrides.yaml"
        original = list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else []
        hydra_overrides = []
        if (hydra_dir / "hydra.yaml").is_file():
            hydra_overrides = list(OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.overrides.hydra")
                                   or [])
    except Exception as e:  # noqa: BLE001 - any unreadable file is bad input, said in one line
        raise Refused(f"{hydra_dir} cannot be read as a moe_hydra config: {str(e).splitlines()[0]}") from None
    return cfg, resolve(cfg), [str(o) for o in original], [str(o) for o in hydra_overrides]


def _from_overrides(args: list[str]):
    """As :func:`_from_dir`, for overrides composed as the run command composes them."""
    from moe_hydra.commands import _overrides
    from moe_hydra.core import overrides
    from moe_hydra.core.resolved import resolve
    from moe_hydra.core.versions import mcore_facts
    from moe_hydra.launch.compose import compose_typed
    from moe_hydra.planning import rules

    args = _overrides.normalize(args)
    try:
        parsed = overrides.parse(args)
    except Exception as e:  # noqa: BLE001 - Hydra's parser error, said in one line
        raise Refused(f"cannot read the overrides: {str(e).splitlines()[0]}") from None
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    if sweeps or "-m" in args:
        raise Refused(f"export takes one configuration, not a sweep ({' '.join(sweeps) or '-m'}): export each point")
    problems = _overrides.check_overrides(args)
    if problems:
        raise Refused("\n  ".join(problems))
    task = [a for a in args if not a.startswith("hydra.")]
    try:
        cfg = compose_typed(task)
    except Exception as e:  # noqa: BLE001 - a composition error is bad input, said in one line
        raise Refused(f"the overrides do not compose: {str(e).splitlines()[0]}") from None
    r = resolve(cfg)
    rules.validate(r, mcore=mcore_facts())  # a LayoutError is a Refused: every broken rule, at once
    return cfg, r, task, [a for a in args if a.startswith("hydra.")]


def run(args: argparse.Namespace) -> int:
    from moe_hydra.handoff import export

    rest = args.source
    if len(rest) == 1 and ("=" not in rest[0] or Path(rest[0]).exists()):
        path = Path(rest[0])
        if not path.is_dir():
            raise Refused(f"{path}: no such directory (give a run directory, or moe_hydra overrides)")
        cfg, r, original, hydra_overrides = _from_dir(path)
    else:
        cfg, r, original, hydra_overrides = _from_overrides(rest)
    out = export.export(args.format, cfg, r, original, hydra_overrides)
    sys.stdout.write(out.text)
    for line in export.report(args.format, out):
        print(f"moe_hydra.export: {line}", file=sys.stderr)
    return EXIT_OK
