"""The layout search's hand-off: next to its ready-to-run sweep (``run_top.sh``), the command of each top layout
for Megatron-LM and for Megatron-Bridge, in ``search/export/layout_NN.megatron-lm.sh`` and
``layout_NN.bridge.sh``.

Each layout's config is the search's base config (``multirun.yaml``, written before the search starts) with the
layout's overrides applied as the search applied them (:func:`moe_hydra.core.overrides.apply`), resolved once; its
comment line holds the search command's overrides and the layout's, less what the flags set.

Pure: standard library and moe_hydra.core.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from moe_hydra.core import io, overrides
from moe_hydra.core.resolved import resolve
from moe_hydra.core.violations import LayoutError
from moe_hydra.handoff import export

log = logging.getLogger(__name__)
SUFFIX = {"megatron-lm": "megatron-lm.sh", "bridge": "bridge.sh"}


def write_exports(sweep_dir: Path, ranked: list[dict[str, Any]], base: list[str]) -> dict[str, Any] | None:
    """``search/export/layout_NN.<format>.sh`` for every row of ``ranked`` (the rows ``run_top.sh`` runs); the
    written files and what they could not say, or None when the search's config cannot be read back."""
    from omegaconf import OmegaConf

    from moe_hydra.core.schema import typed

    try:
        cfg = typed(OmegaConf.load(sweep_dir / "multirun.yaml"))
    except Exception as e:  # noqa: BLE001 - the search's own outputs stand without the exports
        log.warning("no exported commands: %s cannot be read back (%s)", sweep_dir / "multirun.yaml", e)
        return None
    out_dir = sweep_dir / "search" / "export"
    out_dir.mkdir(parents=True, exist_ok=True)
    written, unmapped = [], {}
    for row in ranked:
        name = f"layout_{row['rank']:02d}"
        try:
            c = overrides.apply(cfg, row["overrides"])
            r = resolve(c)
        except (LayoutError, ValueError) as e:
            log.warning("%s not exported: %s", name, e)
            continue
        for fmt in export.FORMATS:
            x = export.export(fmt, c, r, [*base, *row["overrides"]])
            path = out_dir / f"{name}.{SUFFIX[fmt]}"
            io.write_text(path, f"# rank {row['rank']} of the layout search: {row['layout']}\n" + x.text)
            written.append(str(path))
            if x.unmapped:
                unmapped[path.name] = x.unmapped
    log.info("exported commands of %d layouts (Megatron-LM and Megatron-Bridge) in %s", len(written) // 2, out_dir)
    return {"dir": str(out_dir), "files": written, "unmapped": unmapped}
