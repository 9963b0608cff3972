"""The vocabulary of the legality rules: a violation, the error that carries them, the context a rule
reads, and the registry every rule joins with ``@rule``. Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from moe_hydra.core.arch import Arch
from moe_hydra.core.layout import Layout
from moe_hydra.core.versions import McoreFacts


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    message: str  # what broke, with the values and the arithmetic
    fields: tuple[tuple[str, Any], ...]  # (dotted path, value) of every field involved
    fix: str  # an override (or a choice of overrides) that makes the rule hold

    def render(self) -> str:
        where = "  ".join(f"{k}={_fmt(v)}" for k, v in self.fields)
        return f"[{self.rule}] {self.message}\n        {where}\n        fix: {self.fix}"


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(getattr(v, "value", v))


class LayoutError(ValueError):
    """The composed config breaks one or more rules. ``violations`` holds all of them."""

    def __init__(self, violations: list[Violation], subject: str = "this config"):
        self.violations = violations
        self.subject = subject
        super().__init__(self.report())

    def record(self) -> dict[str, Any]:
        """What ``violations.json`` holds."""
        return {"stage": "plan", "status": "invalid", "violations": [
            {"rule": v.rule, "message": v.message, "fields": dict(v.fields), "fix": v.fix} for v in self.violations]}

    def report(self) -> str:
        n = len(self.violations)
        head = f"{n} layout violation{'s' if n > 1 else ''} for {self.subject}; nothing was launched."
        return "\n".join([head] + ["  " + v.render() for v in self.violations])


@dataclass(slots=True)
class Ctx:
    """What every rule reads: the config, its layout, its architecture, the megatron-core facts."""

    cfg: Any
    layout: Layout
    arch: Arch | None  # None when moe_layer_freq itself is malformed (S02 reports it)
    mcore: McoreFacts

    @property
    def p(self):
        return self.cfg.parallel

    @property
    def m(self):
        return self.cfg.model

    @property
    def seq(self) -> int:
        return self.cfg.train.seq_length

    @property
    def fp8(self) -> bool:
        return self.cfg.precision.fp8 is not None

    @property
    def flex(self) -> bool:
        return self.cfg.dispatcher.moe_token_dispatcher_type == "flex"


Rule = Callable[[Ctx], Iterator[Violation]]
RULES: list[Rule] = []


def rule(fn: Rule | None = None, *, reads: str = "mesh", comm: bool = False):
    """Register a rule. ``reads`` says what of a layout it reads, so the layout search checks each rule
    as rarely as it can:

    - ``fixed``: nothing the search varies (once per search);
    - ``mesh``: the parallel sizes and the micro batch (once per mesh);
    - ``pipeline``: PP, VPP, the pipeline split and the batch (DP, micro batch), nothing else of the mesh;
    - ``recompute``: PP, VPP, the split, EP and the recompute settings (once per recompute level the
      search tries).

    ``comm``: the rule reads the dispatcher or EP overlap (the search also tries other settings of these)."""

    def register(f: Rule) -> Rule:
        f.reads, f.comm = reads, comm
        RULES.append(f)
        return f

    return register(fn) if fn is not None else register


def V(rule_id: str, message: str, fix: str, **fields: Any) -> Violation:
    """A violation; ``fields`` are dotted paths written with ``__`` for ``.``."""
    return Violation(rule_id, message, tuple((k.replace("__", "."), v) for k, v in fields.items()), fix)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values)) if values else "none"
