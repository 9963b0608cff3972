"""The reports' pictures (compare.png, noise.png, tune.png, bisect.png): saved with the figures they draw, and logged
to W&B beside the runs they judge.

:func:`save` writes a figure as PNG with the figures drawn as JSON in its ``Description`` text (``{kind: drawn}``,
non-finite numbers as null), so a reader, or a test, reads what the picture shows without reading pixels.

:func:`log` puts a report's pictures into the W&B project and group its runs were logged to, as a run of its own
(``job_type`` the report's kind: compare, noise, tune, bisect): each picture as a ``wandb.Image`` captioned with its
file name, the figures drawn in the run's summary (``<kind>/figures``). Where it logs follows the runs, as they recorded
it: their ``logger`` (``.hydra/config.yaml``; none of them with ``logger=wandb``: nothing is logged) and their W&B
group (results.json ``tracking.group``; the most common one when they differ); the mode as the job's
(:func:`moe_hydra.core.env.wandb_mode`: offline runs land in ``<out>/wandb/offline-run-*``). A report never fails on
W&B: any failure inside wandb is a warning.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from moe_hydra.analysis.runs import recorded
from moe_hydra.core import io
from moe_hydra.core.env import wandb_mode

log_ = logging.getLogger("moe_hydra")


def save(fig: Any, path: Path, kind: str, drawn: Any) -> None:
    """``fig`` as a PNG at ``path`` with ``{kind: drawn}`` in its ``Description`` text; the figure is closed."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=100, metadata={"Description": json.dumps(io.finite({kind: drawn}))})
    finally:
        plt.close(fig)


def drawn(path: Path) -> dict[str, Any]:
    """The figures a picture :func:`save` wrote draws (its ``Description`` text)."""
    from PIL import Image

    with Image.open(path) as im:
        return json.loads(im.text["Description"])


def _logger(dirs: list[Path]) -> tuple[dict[str, Any], str] | None:
    """The W&B settings of the first run logged with ``logger=wandb`` and the runs' group; None when none was."""
    groups: Counter[str] = Counter()
    settings = None
    for d in map(Path, dirs):
        found = [d / "results.json"] if (d / "results.json").is_file() else sorted(
            p for p in d.rglob("results.json") if "wandb" not in p.parts)
        for f in found:
            if settings is None and recorded(f.parent, "logger.name") == "wandb":
                settings = {"project": recorded(f.parent, "logger.project") or "moe_hydra",
                            "mode": recorded(f.parent, "logger.mode")}
            try:
                group = (json.loads(f.read_text()).get("tracking") or {}).get("group")
            except (OSError, ValueError, AttributeError):
                group = None
            if isinstance(group, str) and group:
                groups[group] += 1
    if settings is None:
        return None
    return settings, (groups.most_common(1)[0][0] if groups else "moe_hydra")


def log(kind: str, pictures: list[Path], dirs: list[Path], out_dir: Path) -> str | None:
    """The report's ``pictures`` as a W&B run of ``job_type`` ``kind`` in the project and group of the runs in
    ``dirs`` (run directories, or directories above them); the run's directory, or None when the runs were not
    logged to W&B (or wandb failed: a warning)."""
    found = _logger(dirs)
    if found is None:
        return None
    settings, group = found
    mode = wandb_mode("wandb", settings["mode"])
    if mode == "disabled":
        return None
    try:
        import wandb

        run = wandb.init(project=settings["project"], dir=str(out_dir), mode=mode, group=group, job_type=kind,
                         name=f"{kind}-{group}", config={"runs": [str(d) for d in dirs]},
                         settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
        try:
            run.log({p.stem: wandb.Image(str(p), caption=p.name) for p in pictures})
            run.summary.update({f"{k}/figures": v for p in pictures for k, v in drawn(p).items()})
            return str(Path(run.dir).parent)
        finally:
            run.finish()
    except Exception as e:  # noqa: BLE001 - a mirror: the report on disk is the record
        log_.warning("W&B: %s's pictures were not logged (%s: %s); the files hold them", kind, type(e).__name__, e)
        return None
