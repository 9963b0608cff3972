"""Legality of a composed config, decided before anything is launched.

Each rule mirrors a check that Megatron-Core (or its kernels) makes at run time, or a trap that
gives silently wrong results; ids follow docs/rules.md (``L01``..``L74``), with
moe_hydra's own rules as ``C`` (contract), ``P`` (precision/hardware), ``S`` (schema values) and
``V`` (megatron-core version). :func:`check` runs every rule and returns *all* violations; each
names the fields and values involved, the arithmetic that failed, and an override that fixes it.

Whether a package (DeepEP, HybridEP, Transformer Engine) is installed is not decided here: plans
are made on laptops; the job checks its own machine.

Pure: standard library only.
"""

from __future__ import annotations

from moe_hydra.core.resolved import Resolved
from moe_hydra.core.versions import McoreFacts, mcore_facts

# importing registers their rules, in this order: the layout first, then the features
from moe_hydra.planning.rules import layout_rules  # noqa: F401  # isort: skip
from moe_hydra.planning.rules import feature_rules  # noqa: F401  # isort: skip
from moe_hydra.planning.rules.base import RULES, Ctx, LayoutError, Violation  # isort: skip

__all__ = ["RULES", "LayoutError", "Violation", "check", "validate"]


def check(r: Resolved, mcore: McoreFacts | None = None, reads: tuple[str, ...] | None = None,
          comm_only: bool = False) -> list[Violation]:
    """Every violation of the resolved plan ``r``.

    ``reads``: only the rules that read these (``fixed``, ``mesh``, ``pipeline``, ``recompute``; see
    :func:`~moe_hydra.planning.rules.base.rule`); None checks all. ``comm_only``: only the rules that read the
    dispatcher or EP overlap."""
    ctx = Ctx(r, mcore or mcore_facts())
    return [v for rule in RULES if (reads is None or rule.reads in reads) and (rule.comm or not comm_only)
            for v in rule(ctx)]


def validate(r: Resolved, subject: str | None = None, mcore: McoreFacts | None = None) -> None:
    """Raise :class:`LayoutError` listing every violation, if there are any."""
    violations = check(r, mcore)
    if violations:
        raise LayoutError(violations, subject or f"{r.cfg.model.name} on {r.layout.world_size} x {r.cfg.hardware.name}")
