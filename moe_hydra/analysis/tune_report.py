"""A tune's story, from its journal (tune.json): ``tune.md``, read in two minutes — the start, the contract, each
stage's evidence, every accepted change with its measured gain and the wall that moved, the rejected candidates and
why, the validated winner and the command that reproduces it — and ``tune.png``: the step time after each accepted
change (with the interval of its A/B) and the walls of the first and last profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_hydra.analysis import figures
from moe_hydra.analysis.report import change, change_interval
from moe_hydra.core import io


def _bar(x: float) -> float:
    return x if x == x and x > 0 else 0.0  # NaN (one run) and a mean outside its interval draw no bar


def markdown(j: dict[str, Any]) -> str:
    stages = {s["stage"]: s for s in j.get("stages") or []}
    start, winner = j.get("start") or {}, j.get("winner") or {}
    lines = ["# moe_hydra tune", "",
             f"**Start** `{' '.join(start.get('overrides') or []) or '(defaults)'}`: "
             f"{start.get('step_time_ms') or float('nan'):.1f} ms/step.  ",
             f"**Winner** `{' '.join(winner.get('overrides') or [])}`: "
             f"{winner.get('step_time_ms') or float('nan'):.1f} "
             f"ms/step, {winner.get('verdict')} against the start {change(winner.get('rel_step_time'))} "
             f"{change_interval(winner.get('interval'))} ({winner.get('interval_is') or 'sequential A/B'} interval); "
             f"{'validated' if winner.get('validated') else 'not accepted by the gate (see validate)'}.  ",
             f"Spent {j.get('gpu_hours', 0):.3f} of {j.get('budget_gpu_hours')} GPU-hours ("
             + ", ".join(f"{k} {v:.3f}" for k, v in (j.get("gpu_hours_by_stage") or {}).items()) + ").", ""]
    c = stages.get("contract", {})
    if c:
        lines += ["## Contract", "", f"Frozen: {', '.join(f'`{k}={v}`' for k, v in (c.get('frozen') or {}).items())}.",
                  f"The loop may change: {', '.join(c.get('tunable') or [])}. Label: **{c.get('label')}**"
                  + (" — every figure here is a benchmark's (mock data)." if c.get("label") == "benchmark-only"
                     else "."),
                  ""]
    for name in ("fit", "scale", "screen"):
        if name in stages:
            lines += [f"## {name.capitalize()}", "", stages[name].get("summary", ""), ""]
    screen = stages.get("screen", {})
    if screen.get("arms"):
        lines += ["| measured | predicted | layout | step ms | status |", "|---|---|---|---|---|"]
        for a in screen["arms"]:
            lines.append(f"| {a.get('measured_rank')} | {a.get('predicted_rank')} | {a.get('layout')} | "
                         f"{a.get('step_ms') or float('nan'):.1f} | {a.get('status')} |")
        lines.append("")
    r = stages.get("retune", {})
    if r:
        lines += ["## Retune", "", r.get("summary", ""), "", "| # | wall | candidate | change | verdict | step time "
                  "| interval | outcome |", "|---|---|---|---|---|---|---|---|"]
        for t in r.get("trials") or []:
            lines.append(f"| {t.get('n')} | {t.get('wall')} | {t.get('candidate')} | "
                         f"`{' '.join(t.get('change') or [])}` | {t.get('verdict') or ''} | "
                         f"{change(t.get('rel_step_time'))} | {change_interval(t.get('interval'))} "
                         f"| {t.get('outcome')}"
                         + (f": {'; '.join(t.get('reasons'))[:200]}" if t.get("reasons") else "") + " |")
        lines += ["", "Walls of each profile (share of the slowest rank's step):", ""]
        for p in r.get("profiles") or []:
            walls = p.get("walls") or {}
            lines.append(f"- {p.get('experiment')}: " + (", ".join(f"{w} {s:.0%}" for w, s in walls.items()) or "none"))
        lines.append("")
    for name in ("validate", "export"):
        if name in stages:
            lines += [f"## {name.capitalize()}", "", stages[name].get("summary", ""), ""]
    if winner.get("command"):
        lines += ["## Reproduce", "", "```", winner["command"], "```", ""]
    return "\n".join(lines)


def plot(j: dict[str, Any], path: Path) -> None:
    """tune.png: the steady step time at the start, after the layout screen and after each accepted change (with
    the A/B's interval drawn on the new mean), and the walls' shares in the first and the last profile. The figures
    drawn are in the PNG's ``Description`` text (JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = {s["stage"]: s for s in j.get("stages") or []}
    trials = [t for t in (stages.get("retune", {}).get("trials") or []) if t.get("outcome") == "accepted"]
    names, times, errs = ["start"], [(j.get("start") or {}).get("step_time_ms")], [(0.0, 0.0)]
    if stages.get("screen"):
        names.append(f"layout\n{stages['screen'].get('best', '')[:18]}")
        best = next((a for a in stages["screen"].get("arms") or [] if a.get("measured_rank") == 1), {})
        times.append(best.get("step_ms"))
        ci = best.get("ci_ms")
        errs.append((best["step_ms"] - ci[0], ci[1] - best["step_ms"]) if isinstance(ci, list) and len(ci) == 2
                    and best.get("step_ms") is not None else (0.0, 0.0))
    for t in trials:
        names.append(t["candidate"][:18])
        a, b = (t.get("step_time_ms") or [None, None])[:2]
        times.append(b)
        iv = t.get("interval")  # the A/B's interval of B's change against A, drawn on B's mean
        errs.append((b - a * (1 + iv[0]), a * (1 + iv[1]) - b) if a and b and isinstance(iv, list) and len(iv) == 2
                    else (0.0, 0.0))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [i for i, t in enumerate(times) if t is not None]
    ax.errorbar(xs, [times[i] for i in xs], yerr=[[_bar(errs[i][0]) for i in xs], [_bar(errs[i][1]) for i in xs]],
                fmt="o-", capsize=4)
    ax.set_xticks(range(len(names)), [n.replace("$", r"\$") for n in names], rotation=15, fontsize=8)
    ax.set_ylabel("steady step time (ms)")
    ax.set_title("step time after each accepted change")
    profiles = stages.get("retune", {}).get("profiles") or []
    first, last = (profiles[0].get("walls") or {}, profiles[-1].get("walls") or {}) if profiles else ({}, {})
    if profiles:
        walls = list(first or last)
        width = 0.4
        bx.bar([i - width / 2 for i in range(len(walls))], [first.get(w, 0) for w in walls], width, label="first")
        bx.bar([i + width / 2 for i in range(len(walls))], [last.get(w, 0) for w in walls], width, label="last")
        bx.set_xticks(range(len(walls)), walls)
        bx.set_ylabel("share of the profiled step")
        bx.set_title("walls: first and last profile")
        bx.legend()
    fig.tight_layout()
    steps = [{"after": n.replace("\n", " "), "step_ms": t, "interval_ms": None if t is None else [t - lo, t + hi]}
             for n, t, (lo, hi) in zip(names, times, errs)]
    figures.save(fig, path, "tune", {"steps": steps, "walls": {"first": first, "last": last}})


def write(j: dict[str, Any], out_dir: Path) -> list[Path]:
    """tune.md, with tune.png embedded after its first paragraph, and tune.png; their paths."""
    md, png = out_dir / "tune.md", out_dir / "tune.png"
    text = markdown(j)
    head, sep, rest = text.partition("\n\n## ")
    io.write_text(md, head + "\n\n![tune](tune.png)" + sep + rest if sep else text + "\n![tune](tune.png)\n")
    plot(j, png)
    return [md, png]
