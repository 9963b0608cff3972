"""A bisection's answer, from its journal (bisect.json): ``bisect.md``, the answer first — which units explain how
much of the regression, with the interval, and the walls that moved — then the difference, the reproduction and
every trial; ``bisect.png`` draws the trials (embedded in bisect.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from moe_hydra.analysis import figures
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


def plot(j: dict[str, Any], path: Path) -> None:
    """bisect.png: the reproduction and every trial, a row each, as its A/B's step-time change against good with
    its interval, coloured by outcome, against the trial's margin (half the regression) and the regression itself.
    The figures drawn are in the PNG's ``Description`` text (JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = j.get("reproduce") or {}
    rows = [("bad (all units)", rep, "reproduce")] + [(" + ".join(t["units"]), t, t["outcome"])
                                                      for t in j.get("trials") or []]
    colours = {"fail": "tab:red", "pass": "tab:green", "unresolved": "tab:orange", "refused": "tab:grey",
               "reproduce": "black"}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * len(rows)))
    drawn = []
    for y, (label, ab, outcome) in enumerate(rows):
        rel, iv = ab.get("rel_step_time"), ab.get("interval")
        drawn.append({"units": label, "outcome": outcome, "rel_step_time": rel, "interval": iv,
                      "margin": ab.get("margin")})
        if rel is None:
            continue
        err = [[100 * (rel - iv[0])], [100 * (iv[1] - rel)]] if isinstance(iv, list) and len(iv) == 2 else None
        ax.errorbar([100 * rel], [y], xerr=err, fmt="o", capsize=4, color=colours.get(outcome, "tab:blue"))
        ax.annotate(outcome, (100 * (iv[1] if err else rel), y), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=8, color=colours.get(outcome, "tab:blue"))
        if ab.get("margin"):
            ax.vlines([100 * ab["margin"]], y - 0.4, y + 0.4, colors="tab:blue", linestyles="dashed")
    if rep.get("rel_step_time") is not None:
        ax.axvline(100 * rep["rel_step_time"], color="black", linewidth=0.6, linestyle="dotted")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0].replace("$", r"\$")[:60] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.15)
    ax.set_xlabel("step time against good, % (interval); dashed: the trial's margin; dotted: the regression")
    ax.set_title("bisect: the reproduction, then each trial in order")
    fig.tight_layout()
    figures.save(fig, path, "bisect", drawn)


def write(j: dict[str, Any], out_dir: Path) -> Path:
    """bisect.md, with bisect.png (:func:`plot`) embedded; the markdown's path."""
    path = out_dir / "bisect.md"
    plot(j, out_dir / "bisect.png")
    text = markdown(j).replace("\n## The difference", "\n![trials](bisect.png)\n\n## The difference", 1)
    io.write_text(path, text)
    return path
