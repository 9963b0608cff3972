"""compare's output: the verdict table on the terminal, ``compare.md``, ``compare.json`` (the verdicts,
machine-readable), ``compare.png`` (each arm's runs, each difference with its interval against the noise) and
``--diff``'s report. Values from the files are text, never markup: rich's markup is escaped, and matplotlib's mathtext ``$`` too.

``compare.json`` (``compare_version`` 1): ``pairs``, one per candidate arm against its baseline: ``variable`` (the
variables, comma-separated), ``variables``, ``contract_hash``, ``arms`` ([baseline, candidate]), ``runs``
(per arm), ``metric`` (what is judged: ``step_time_ms``, or ``tokens_per_s_per_gpu`` when the design varies the
work a step: :func:`moe_hydra.core.contract.measure`), ``judged_as`` (step time, or time per token), ``mean_ms``
(per arm, of what was judged), ``unit``, ``verdict`` (faster, slower, equivalent, undecided, or "none: ..."),
``relative_difference`` (of what was judged, B / A - 1), ``ci`` (95 %), ``p_value``, ``df``, ``mde``, ``tokens_per_s``
(``relative``, ``ci``), ``equivalence`` (``margin``, ``p_value``, ``ci90``, ``runs_needed`` per arm to show it when
undecided; null when not tested), ``noise_floor``
(``value``, ``source``: measured / repeats / declared / --noise-floor, and for a measured one ``file``,
``interval``, ``df``), ``not_steady`` (the two arms' runs whose window is not steady, each with its judgment: their
verdict is "none: a window is not steady"); ``notes``; ``skipped``; ``sequential`` (the sweep's repeat=auto record, when there is one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from moe_hydra.analysis import figures
from moe_hydra.core import contract, io, stats

Comparison = Any  # moe_hydra.analysis.compare.Comparison (not imported: compare imports this module)
COMPARE_VERSION = 1


def pct(x: float) -> str:
    return f"{x:+.2%}" if math.isfinite(x) else str(x)


def change(x: Any) -> str:
    """A relative change as the loops' reports print it ("-12.3%"), "n/a" when there is none."""
    return f"{x:+.1%}" if isinstance(x, (int, float)) else "n/a"


def change_interval(iv: Any) -> str:
    """An interval of a relative change ("[-20.1%, -4.5%]"), "" when there is none."""
    return f"[{change(iv[0])}, {change(iv[1])}]" if isinstance(iv, (list, tuple)) and len(iv) == 2 else ""


def verdict_text(e: Any) -> str:
    """The verdict as shown: "equivalent within +-5.00% (90% CI [..])" names its margin and the interval its test
    read; "undecided" says what it was called before equivalence existed (no significant difference), which readers
    of the table grep for, and how many runs per arm would show equivalence when it was tested."""
    if e.verdict == stats.EQUIVALENT and e.margin is not None:
        return f"{e.verdict} within ±{e.margin:.2%} (90% CI [{pct(e.eq_ci_low)}, {pct(e.eq_ci_high)}])"
    if e.verdict != stats.UNDECIDED:
        return e.verdict
    more = ""
    if e.margin is not None:
        more = (f"; about {e.runs_needed} runs per arm would show equivalence within ±{e.margin:.2%}"
                if e.runs_needed else f"; the difference is at the ±{e.margin:.2%} margin")
    return f"{e.verdict} (no significant difference{more})"


def _noise(c: Comparison, name: str, interval: bool = True) -> str:
    floor = c.noise.get(name)
    if floor is None:
        return ""
    return floor.label() if interval else f"{floor.value:.1%} {floor.source}"


def markdown(comps: list[Comparison], warnings: list[str]) -> str:
    lines = ["# moe_hydra compare", ""]
    for c in comps:
        lines += [f"## {', '.join(c.variables)} (contract {c.contract_hash}), baseline `{c.baseline}`", "",
                  ("| arm | runs | step ms | step time vs baseline (95% CI) | tokens/s/GPU vs baseline (95% CI) | "
                   "MDE | run-to-run noise | verdict |"), "|---|---|---|---|---|---|---|---|"]
        base_ms = sum(r.window_mean for r in c.arms[c.baseline]) / len(c.arms[c.baseline])
        lines.append(f"| {c.baseline} | {len(c.arms[c.baseline])} | {base_ms:.2f} | baseline | baseline | | | |")
        for name, e in c.effects.items():
            lines.append(f"| {name} | {len(c.arms[name])} | {e.mean_b_ms:.2f} | {pct(e.rel_step_time)} "
                         f"[{pct(e.ci_low)}, {pct(e.ci_high)}] | {pct(e.rel_tokens_per_s)} [{pct(e.tokens_ci_low)}, "
                         f"{pct(e.tokens_ci_high)}] | {e.mde:.2%} | {_noise(c, name)} | {verdict_text(e)} "
                         f"(unit: {e.unit}, p={e.p_value:.3g}) |")
        lines += [""] + [f"> {n}" for n in c.notes] + [""]
    if warnings:
        lines += ["## Skipped", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _plain(label: str) -> str:
    """A label matplotlib draws as written: "$" would start mathtext (and a bad formula fails at savefig)."""
    return label.replace("$", r"\$")


def plot(comps: list[Comparison], path: Path) -> None:
    """compare.png: a row per comparison — each arm's runs (a dot per run's steady-window mean, a bar at the arm's
    mean), and each candidate's difference from the baseline with its 95 % interval, against the run-to-run noise
    its verdict used (grey) and the equivalence margin (dashed). The figures drawn are in the PNG's
    ``Description`` text (JSON), the same as compare.json's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(comps), 2, figsize=(12, 3.8 * len(comps)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1.3]})
    drawn = []
    for (runs_ax, diff_ax), c in zip(axes, comps):
        names = list(c.arms)
        for x, name in enumerate(names):
            means = [r.window_mean for r in c.arms[name]]
            spread = [x + 0.12 * (i - (len(means) - 1) / 2) / max(len(means), 1) for i in range(len(means))]
            runs_ax.scatter(spread, means, s=22, zorder=3)
            runs_ax.hlines(sum(means) / len(means), x - 0.3, x + 0.3, color="black", linewidth=1.5)
        runs_ax.set_xticks(range(len(names)), [_plain(n if len(n) < 30 else n[:27] + "...") for n in names],
                           rotation=15)
        runs_ax.set_ylabel("run's steady-window mean step (ms)")
        runs_ax.set_title(_plain(f"{', '.join(c.variables)} [{c.contract_hash[:8]}]: one dot a run"))
        judged = "time per token" if c.metric == contract.THROUGHPUT else "step time"
        for y, (name, e) in enumerate(c.effects.items()):
            floor = c.noise.get(name)
            if floor is not None:
                diff_ax.fill_betweenx([y - 0.35, y + 0.35], -100 * floor.value, 100 * floor.value, color="grey",
                                      alpha=0.25, linewidth=0)
            if e.margin is not None:
                diff_ax.vlines([-100 * e.margin, 100 * e.margin], y - 0.4, y + 0.4, colors="tab:blue",
                               linestyles="dashed")
            color = {"faster": "tab:green", "slower": "tab:red", "equivalent": "tab:cyan"}.get(e.verdict, "tab:orange")
            diff_ax.errorbar([100 * e.rel_step_time], [y], xerr=[[100 * (e.rel_step_time - e.ci_low)],
                                                                 [100 * (e.ci_high - e.rel_step_time)]],
                             fmt="o", capsize=5, color=color)
            diff_ax.annotate(e.verdict, (100 * e.ci_high, y), xytext=(6, 0), textcoords="offset points",
                             va="center", color=color)
            drawn.append({"variable": ", ".join(c.variables), "arms": [c.baseline, name], "judged_as": judged,
                          "run_means_ms": {n: [r.window_mean for r in c.arms[n]] for n in (c.baseline, name)},
                          "relative_difference": e.rel_step_time, "ci": [e.ci_low, e.ci_high], "verdict": e.verdict,
                          "noise_floor": floor.value if floor is not None else None, "margin": e.margin})
        diff_ax.axvline(0, color="black", linewidth=0.8)
        diff_ax.set_yticks(range(len(c.effects)), [_plain(n if len(n) < 24 else n[:21] + "...") for n in c.effects])
        diff_ax.set_ylim(-0.6, len(c.effects) - 0.4)
        diff_ax.margins(x=0.12)  # room for the verdicts written after the intervals
        diff_ax.set_title(_plain(f"against {c.baseline}"))
        diff_ax.set_xlabel(f"difference in {judged}, % (95 % interval)")
        diff_ax.legend(handles=[Patch(color="grey", alpha=0.25, label="run-to-run noise"),
                                Line2D([], [], color="tab:blue", linestyle="dashed", label="equivalence margin")],
                       loc="best", fontsize="small")
    fig.tight_layout()
    figures.save(fig, path, "compare", drawn)


def table(comps: list[Comparison]):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="A/B verdicts (steady-window step time; 95% CI, Welch)", title_justify="left")
    for col in ("variable", "baseline", "candidate", "unit", "step time", "95% CI", "tokens/s/GPU", "MDE",
                "run-to-run noise"):
        t.add_column(col)
    t.add_column("verdict", no_wrap=True)  # whole, whatever the terminal's width: what a reader looks for first
    for c in comps:
        for name, e in c.effects.items():
            color = {"faster": "green", "slower": "red", "equivalent": "cyan"}.get(e.verdict, "yellow")
            per_token = c.metric == contract.THROUGHPUT  # the test read time per token
            unit, per = ("ms/token", " per token") if per_token else ("ms", "")
            t.add_row(escape(", ".join(c.variables)), escape(f"{c.baseline} ({e.mean_a_ms:.4g} {unit}, n={e.n_a})"),
                      escape(f"{name} ({e.mean_b_ms:.4g} {unit}, n={e.n_b})"), e.unit, pct(e.rel_step_time) + per,
                      escape(f"[{pct(e.ci_low)}, {pct(e.ci_high)}]"), pct(e.rel_tokens_per_s), f"{e.mde:.2%}",
                      escape(_noise(c, name, interval=False)), f"[{color}]{escape(verdict_text(e))}")
    return t


def pairs(comps: list[Comparison]) -> list[dict[str, Any]]:
    """compare.json's pairs: one per candidate arm against its baseline."""
    out = []
    for c in comps:
        for name, e in c.effects.items():
            floor = c.noise.get(name)
            out.append({
                "variable": ", ".join(c.variables), "variables": list(c.variables), "contract_hash": c.contract_hash,
                "metric": c.metric, "judged_as": "time per token" if c.metric == contract.THROUGHPUT else "step time",
                "arms": [c.baseline, name], "runs": {c.baseline: len(c.arms[c.baseline]), name: len(c.arms[name])},
                "mean_ms": {c.baseline: e.mean_a_ms, name: e.mean_b_ms}, "unit": e.unit, "verdict": e.verdict,
                "relative_difference": e.rel_step_time, "ci": [e.ci_low, e.ci_high], "confidence": 0.95,
                "p_value": e.p_value, "df": e.df, "mde": e.mde,
                "tokens_per_s": {"relative": e.rel_tokens_per_s, "ci": [e.tokens_ci_low, e.tokens_ci_high]},
                "equivalence": None if e.margin is None else {
                    "margin": e.margin, "p_value": e.eq_p_value, "ci90": [e.eq_ci_low, e.eq_ci_high],
                    "runs_needed": e.runs_needed},
                "noise_floor": floor.as_dict() if floor is not None else None,
                "walls": (c.walls.get(name) or {}).get("summary"),
                # the runs of the two arms whose window is not steady: no verdict (compare.NOT_STEADY)
                "not_steady": [{"run": str(r.path), "steady": r.steady.describe()}
                               for r in (*c.arms[c.baseline], *c.arms[name]) if not r.steady.window_steady],
            })
    return out


def record(comps: list[Comparison], warnings: list[str], sequential: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return io.finite({"compare_version": COMPARE_VERSION, "pairs": pairs(comps),
                    "notes": [n for c in comps for n in c.notes], "skipped": list(warnings),
                    "sequential": list(sequential) or None})


def sequential_line(seq: dict[str, Any]) -> str:
    """One line for a repeat=auto record (sequential.json)."""
    verdicts = "; ".join(f"{p.get('candidate')} vs {p.get('baseline')}: {p.get('verdict')}"
                         for p in seq.get("pairs") or [])
    used = seq.get("runs_used") or {}
    return (f"repeat=auto ({seq.get('file')}): {seq.get('status')}, {verdicts or 'no verdict yet'}; runs used "
            f"{', '.join(f'{k}: {v}' for k, v in used.items()) or 'none'}. Its verdict is the sequential test's "
            "(alpha spent over the looks); the table above reads the same runs as one fixed-size A/B")


def write(comps: list[Comparison], warnings: list[str], out_dir: Path,
          sequential: list[dict[str, Any]] = ()) -> list[Path]:
    """compare.md, compare.json and compare.png in ``out_dir`` (created); their paths.

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """

    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = out_dir / "compare.md", out_dir / "compare.json", out_dir / "compare.png"
    text = markdown(comps, warnings)
    if sequential:
        text += "\n## repeat=auto\n\n" + "".join(f"- {sequential_line(s)}\n" for s in sequential)
    io.write_text(md, text, errors="replace")
    io.write_json(record(comps, warnings, sequential), js)
    plot(comps, png)
    return [md, js, png]


def print_diff(out, report: dict[str, Any]) -> None:
    """--diff's report on the console ``out``; values from the files are printed as text, never as markup."""
    out.print(f"[bold]config[/bold] ({len(report['config'])} differences, first differing knob first)")
    for k, va, vb in report["config"]:
        out.print(f"  {k}: {va!r} -> {vb!r}", highlight=False, markup=False)
    out.print(f"[bold]reading[/bold] ({len(report['reading'])} differences that change how the figures compare)")
    for what, va, vb, why in report["reading"]:
        out.print(f"  {what}: {va!r} -> {vb!r}: {why}", highlight=False, markup=False)
    if report.get("unlike"):
        out.print(f"  not like with like: {report['unlike']}", highlight=False, markup=False)
    out.print(f"[bold]environment[/bold] ({len(report['env'])} differences)")
    for k, va, vb in report["env"]:
        out.print(f"  {k}: {va!r} -> {vb!r}", highlight=False, markup=False)
    out.print("[bold]metrics[/bold]")
    for k, (va, vb, rel, noise) in report["metrics"].items():
        out.print(f"  {k}: {va} -> {vb}" + (f" ({rel:+.2%})" if rel is not None else "")
                  + (f"; {noise}" if noise else ""), highlight=False, markup=False)
    out.print("[bold]walls[/bold]")
    for wall, verdict in report["walls"].items():
        out.print(f"  {wall}: {verdict}", highlight=False, markup=False)
