"""A broken rule and the error that carries every broken rule of a config at once.

Shared by the resolved plan (sizes that are not positive) and the legality rules (moe_hydra.planning.rules).
Pure: standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from moe_hydra.core import overrides
from moe_hydra.core.errors import Refused


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    message: str  # what broke, with the values and the arithmetic
    fields: tuple[tuple[str, Any], ...]  # (dotted path, value) of every field involved
    fix: str  # overrides that make the rule hold, then ", or " other choices (see :func:`first_fix`)

    def line(self) -> str:
        """One line: "[L50] what broke; fix: overrides" (a journal's reasons, a refusal listing several)."""
        return f"[{self.rule}] {self.message}; fix: {self.fix}"

    def render(self) -> str:
        where = "  ".join(overrides.override(k, v) for k, v in self.fields)
        return f"[{self.rule}] {self.message}\n        {where}\n        fix: {self.fix}"


class LayoutError(Refused):
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


def V(rule_id: str, message: str, fix: str, **fields: Any) -> Violation:
    """A violation; ``fields`` are dotted paths written with ``__`` for ``.``."""
    return Violation(rule_id, message, tuple((k.replace("__", "."), v) for k, v in fields.items()), fix)


# One override of a fix: key=value, the value a quoted string, a list, a choice "<one of a, b>" or a plain word.
_OVERRIDE = re.compile(r"""([\w.+/]+)=(<one of ([^>]+)>|'[^']*'|"[^"]*"|\[[^\]]*\]|[^\s,;()<>\[\]'"]+)(?=[\s,;(]|$)""")


def first_fix(fix: str) -> list[str]:
    """The overrides a fix starts with, pasteable as they are (``key=<one of a, b>``: its first choice, ``key=a``):
    what applying the fix means. A fix is written ``OVERRIDE [OVERRIDE...]``, then ``, or`` other choices or a
    note in parentheses; empty when it starts with prose."""
    out, pos = [], 0
    while m := _OVERRIDE.match(fix, pos):
        key, value, choices = m.groups()
        out.append(f"{key}={choices.split(',')[0].strip()}" if choices else f"{key}={value}")
        pos = m.end()
        if not fix.startswith(" ", pos) or not _OVERRIDE.match(fix, pos + 1):
            break
        pos += 1
    return out
