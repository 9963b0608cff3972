"""Legality of a composed config, decided before anything is launched.

Each rule mirrors a check that Megatron-Core (or its kernels) makes at run time, or a trap that
gives silently wrong results; ids follow ``megatron-knobs.md`` §13 (``L01``..``L74``), with
moe_hydra's own rules as ``C`` (contract), ``P`` (precision/hardware), ``S`` (schema values) and
``V`` (megatron-core version). :func:`check` runs every rule and returns *all* violations; each
names the fields and values involved, the arithmetic that failed, and an override that fixes it.

Whether a package (DeepEP, HybridEP, Transformer Engine) is installed is not decided here: plans
are made on laptops; the job checks its own machine.

Pure: standard library only.
"""

from __future__ import annotations

from typing import Any

from moe_hydra.core.arch import Arch
from moe_hydra.core.layout import Layout
from moe_hydra.core.versions import McoreFacts, mcore_facts

# importing registers their rules, in this order: the layout first, then the features
from moe_hydra.planning.rules import (
    feature_rules,  # noqa: F401
    layout_rules,  # noqa: F401, I001
)
from moe_hydra.planning.rules.base import RULES, Ctx, LayoutError, Violation

__all__ = ["RULES", "LayoutError", "Violation", "check", "validate"]


def check(cfg: Any, mcore: McoreFacts | None = None, arch: Arch | None = None,
          reads: tuple[str, ...] | None = None, comm_only: bool = False) -> list[Violation]:
    """Every violation of ``cfg`` (a composed config as objects, e.g. ``OmegaConf.to_object``).

    ``arch``: the model's :class:`Arch` when the caller has it. ``reads``: only the rules that read
    these (``fixed``, ``mesh``, ``pipeline``; see :func:`~moe_hydra.rules.base.rule`); None checks all.
    ``comm_only``: only the rules that read the dispatcher or EP overlap."""
    if arch is None:
        try:
            arch = Arch.from_model(cfg.model)
        except ValueError:
            arch = None
    ctx = Ctx(cfg, Layout.from_config(cfg), arch, mcore or mcore_facts())
    return [v for r in RULES if (reads is None or r.reads in reads) and (r.comm or not comm_only) for v in r(ctx)]


def validate(cfg: Any, subject: str | None = None, mcore: McoreFacts | None = None, arch: Arch | None = None) -> None:
    """Raise :class:`LayoutError` listing every violation, if there are any."""
    violations = check(cfg, mcore, arch)
    if violations:
        lo = Layout.from_config(cfg)
        raise LayoutError(violations, subject or f"{cfg.model.name} on {lo.world_size} x {cfg.hardware.name}")
