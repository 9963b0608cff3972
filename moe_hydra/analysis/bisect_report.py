"""A bisection's answer, from its journal (bisect.json): ``bisect.md``, the answer first — which units explain how
much of the regression, with the interval, and the walls that moved — then the difference, the reproduction and
every trial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_hydra.analysis.report import change, change_interval
from moe_hydra.core import io


def answer(j: dict[str, Any]) -> str:
    """The one line a person reads first."""
    rep = j.get("reproduce") or {}
    if j.get("status") == "not_reproduced":
        return (f"not reproduced: bad against good is {rep.get('verdict')} {change(rep.get('rel_step_time'))} "
                f"{change_interval(rep.get('interval'))}: the noise, or a difference no config switches, explains it")
    culprit = " + ".join(" ".join(u["overrides"]) for u in j.get("culprit") or [])
    share = j.get("share") or {}
    kind = "together (an interaction)" if j.get("interaction") else "alone"
    line = (f"`{culprit}` {kind} explains {change(share.get('rel_step_time'))} "
            f"{change_interval(share.get('interval'))} of the {change(share.get('regression'))} regression")
    moved = (j.get("walls") or {}).get("moved") or {}
    if moved:
        ranked = sorted(moved.items(), key=lambda kv: -abs(kv[1]))
        line += "; " + ", ".join(f"{w} {ms:+.1f} ms/step" for w, ms in ranked)
    if j.get("status") == "max_trials":
        line += f" (not minimal: the search stopped at bisect.max_trials, {len(j.get('trials') or [])} trials)"
    elif j.get("status") == "not_minimal":
        line += (f" (not shown minimal: the A/B without {', '.join(j.get('undecided') or [])} stayed undecided at "
                 "bisect.max_repeats; more repeats there would tell whether it is needed)")
    return line


def markdown(j: dict[str, Any]) -> str:
    diff = j.get("difference") or {}
    lines = ["# moe_hydra bisect", "", f"**{answer(j)}**", "",
             f"Status: {j.get('status')}; {len(j.get('trials') or [])} trials; "
             f"{j.get('gpu_hours', 0):.3f} GPU-hours.",
             "", "## The difference", "", "| unit | good | bad (applied to good) |", "|---|---|---|"]
    for u in diff.get("units") or []:
        good = " ".join(u.get("good") or []) or "(default)"
        lines.append(f"| {u['key']} | `{good}` | `{' '.join(u['overrides'])}` |")
    if diff.get("unswitchable"):
        lines += ["", "Not switchable by a config (reported, not bisected):", ""]
        lines += [f"- {d['what']}: {d['good']} → {d['bad']}" for d in diff["unswitchable"]]
    rep = j.get("reproduce") or {}
    runs = " + ".join(str(n) for n in (rep.get("runs") or {}).values()) or "none"
    lines += ["", "## Reproduce", "", f"Bad against good: **{rep.get('verdict')}** {change(rep.get('rel_step_time'))} "
              f"{change_interval(rep.get('interval'))} ({rep.get('interval_is') or 'sequential'} interval; runs "
              f"good + bad: {runs}).", ""]
    if j.get("trials"):
        lines += ["## Trials (delta debugging)", "", "| # | units applied to good | verdict | step time | interval | "
                  "outcome |", "|---|---|---|---|---|---|"]
        for i, t in enumerate(j["trials"], 1):
            lines.append(f"| {i} | {', '.join(t['units'])} | {t.get('verdict') or ''} | "
                         f"{change(t.get('rel_step_time'))} | {change_interval(t.get('interval'))} | {t['outcome']}"
                         + (f": {'; '.join(t['reasons'])[:200]}" if t.get("reasons") else "") + " |")
        lines.append("")
    walls = j.get("walls") or {}
    if walls.get("moved"):
        lines += ["## Why: the walls (ms a step, slowest rank, profile=window)", "",
                  "| wall | good | culprit | moved |", "|---|---|---|---|"]
        for w, ms in walls["moved"].items():
            lines.append(f"| {w} | {walls['good'].get(w, 0):.1f} | {walls['culprit'].get(w, 0):.1f} | {ms:+.1f} |")
        lines.append("")
    return "\n".join(lines)


def write(j: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "bisect.md"
    io.write_text(path, markdown(j))
    return path
