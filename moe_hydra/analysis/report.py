"""compare's output: the verdict table on the terminal, ``compare.md``, ``compare.png`` (step-time distributions per
arm) and ``--diff``'s report. Values from the files are text, never markup: rich's markup is escaped, and
matplotlib's mathtext ``$`` too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

Comparison = Any  # moe_hydra.analysis.compare.Comparison (not imported: compare imports this module)


def pct(x: float) -> str:
    return f"{x:+.2%}" if math.isfinite(x) else str(x)


def markdown(comps: list[Comparison], warnings: list[str]) -> str:
    lines = ["# moe_hydra compare", ""]
    for c in comps:
        lines += [f"## {', '.join(c.variables)} (contract {c.contract_hash}), baseline `{c.baseline}`", "",
                  ("| arm | runs | step ms | step time vs baseline (95% CI) | tokens/s/GPU vs baseline (95% CI) | MDE | "
                   "verdict |"), "|---|---|---|---|---|---|---|"]
        base_ms = sum(r.window_mean for r in c.arms[c.baseline]) / len(c.arms[c.baseline])
        lines.append(f"| {c.baseline} | {len(c.arms[c.baseline])} | {base_ms:.2f} | baseline | baseline | | |")
        for name, e in c.effects.items():
            lines.append(f"| {name} | {len(c.arms[name])} | {e.mean_b_ms:.2f} | {pct(e.rel_step_time)} "
                         f"[{pct(e.ci_low)}, {pct(e.ci_high)}] | {pct(e.rel_tokens_per_s)} [{pct(e.tokens_ci_low)}, "
                         f"{pct(e.tokens_ci_high)}] | {e.mde:.2%} | {e.verdict} (unit: {e.unit}, p={e.p_value:.3g}) |")
        lines += [""] + [f"> {n}" for n in c.notes] + [""]
    if warnings:
        lines += ["## Skipped", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _plain(label: str) -> str:
    """A label matplotlib draws as written: "$" would start mathtext (and a bad formula fails at savefig)."""
    return label.replace("$", r"\$")


def plot(comps: list[Comparison], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(comps), figsize=(6 * len(comps), 4), squeeze=False)
    for ax, c in zip(axes[0], comps):
        names = list(c.arms)
        data = [[t for r in c.arms[n] for t in r.window_steps] for n in names]
        ax.boxplot(data, showmeans=True)
        labels = [_plain(n if len(n) < 30 else n[:27] + "...") for n in names]
        ax.set_xticks(range(1, len(names) + 1), labels, rotation=15)
        ax.set_ylabel("steady-window step time (ms)")
        ax.set_title(_plain(f"{', '.join(c.variables)} [{c.contract_hash[:8]}]"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(comps: list[Comparison]):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="A/B verdicts (steady-window step time; 95% CI, Welch)", title_justify="left")
    for col in ("variable", "baseline", "candidate", "unit", "step time", "95% CI", "tokens/s/GPU", "MDE", "verdict"):
        t.add_column(col)
    for c in comps:
        for name, e in c.effects.items():
            color = {"faster": "green", "slower": "red"}.get(e.verdict, "yellow")
            t.add_row(escape(", ".join(c.variables)), escape(f"{c.baseline} ({e.mean_a_ms:.2f} ms, n={e.n_a})"),
                      escape(f"{name} ({e.mean_b_ms:.2f} ms, n={e.n_b})"), e.unit, pct(e.rel_step_time),
                      escape(f"[{pct(e.ci_low)}, {pct(e.ci_high)}]"), pct(e.rel_tokens_per_s), f"{e.mde:.2%}",
                      f"[{color}]{escape(e.verdict)}")
    return t


def write(comps: list[Comparison], warnings: list[str], out_dir: Path) -> list[Path]:
    """compare.md and compare.png in ``out_dir`` (created); their paths.

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png = out_dir / "compare.md", out_dir / "compare.png"
    md.write_text(markdown(comps, warnings), encoding="utf-8", errors="replace")
    plot(comps, png)
    return [md, png]


def print_diff(out, report: dict[str, Any]) -> None:
    """--diff's report on the console ``out``; values from the files are printed as text, never as markup."""
    out.print(f"[bold]config[/bold] ({len(report['config'])} differences, first differing knob first)")
    for k, va, vb in report["config"]:
        out.print(f"  {k}: {va!r} -> {vb!r}", highlight=False, markup=False)
    out.print(f"[bold]environment[/bold] ({len(report['env'])} differences)")
    for k, va, vb in report["env"]:
        out.print(f"  {k}: {va!r} -> {vb!r}", highlight=False, markup=False)
    out.print("[bold]metrics[/bold]")
    for k, (va, vb, rel) in report["metrics"].items():
        out.print(f"  {k}: {va} -> {vb}" + (f" ({rel:+.2%})" if rel is not None else ""), highlight=False)
    out.print("[bold]walls[/bold]")
    for wall, verdict in report["walls"].items():
        out.print(f"  {wall}: {verdict}", highlight=False)
