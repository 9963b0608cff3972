"""``python -m moe_hydra.compare``: matched A/B verdicts with their confidence, acceptance, regression diagnosis.

    python -m moe_hydra.compare DIR [DIR ...] [--variable KEY ...] [--baseline ARM]   verdict per A/B
    python -m moe_hydra.compare --accept DIR                                          the validation gate
    python -m moe_hydra.compare --diff RUN_A RUN_B                                    what changed, which wall moved

Runs (``results.json`` under the directories) are grouped by their contract with the compared variables left
out: the variables swept by the runs' own multirun, or ``--variable``. Arms of a group differ only in those
variables by construction; runs that differ in anything else are never compared, and when no group has two
arms the comparison is refused with the contract diff shown. Statistics: :mod:`moe_hydra.core.stats`.

Output: a table on the terminal, ``compare.md`` and ``compare.png`` (step-time distributions per arm) in the
first directory. Exit code 0 whatever the verdict; 2 for refusals, 1 for errors. Corrupt, truncated or
missing results, failed points and plan-only directories are skipped with a warning naming the file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_hydra.core import contract as contracts
from moe_hydra.core import stats

EXIT_REFUSED = 2
NOT_ARM_VARIABLES = ("repeat",)  # swept to repeat an arm, not to make one


class Refused(Exception):
    """The comparison cannot be made honestly; the message says why."""


@dataclass
class Run:
    path: Path
    results: dict[str, Any]

    @property
    def window_steps(self) -> list[float]:
        first, last = self.results["window"]
        return self.results["step_times_ms"][first - 1:last]

    @property
    def window_mean(self) -> float:
        return sum(self.window_steps) / len(self.window_steps)


def load(dirs: list[Path], warn) -> list[Run]:
    """Every complete run under ``dirs``; everything else is skipped with a warning naming the file."""
    runs = []
    for d in dirs:
        if not d.exists():
            warn(f"skipped {d}: no such directory")
            continue
        found = [d / "results.json"] if (d / "results.json").exists() else sorted(
            p for p in d.rglob("results.json") if "wandb" not in p.parts)
        plans = {p.parent for p in d.rglob("plan.json")} - {p.parent for p in found}
        for p in sorted(plans):
            warn(f"skipped {p}: a plan without results (stage=plan, or a point that never ran)")
        for path in found:
            try:
                res = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                warn(f"skipped {path}: unreadable or truncated ({type(e).__name__})")
                continue
            if res.get("status") != "ok":
                warn(f"skipped {path}: status {res.get('status')!r} ({str(res.get('error', ''))[:120]})")
                continue
            missing = [k for k in ("contract", "step_times_ms", "window", "contract_hash") if k not in res]
            if missing:
                warn(f"skipped {path}: missing {', '.join(missing)}")
                continue
            runs.append(Run(path.parent, res))
    return runs


def _select(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in contracts.GROUP_SECTIONS.get(key, key).split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: tree}


def contract_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    fa, fb = _flat(a), _flat(b)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def _arm_name(run: Run, variables: list[str]) -> str:
    parts = []
    arm = dict(t.split("=", 1) for t in (run.results.get("tracking") or {}).get("job_type", "").split() if "=" in t)
    for v in variables:
        value = _select(run.results["contract"], v)
        if value is None:  # a swept key outside the contract (e.g. repeat): the run's own override
            value = arm.get(v)
        if isinstance(value, dict):
            value = value.get("name", json.dumps(value, sort_keys=True))
        parts.append(f"{v}={value}")
    return " ".join(parts)


@dataclass
class Comparison:
    variables: list[str]
    contract_hash: str
    arms: dict[str, list[Run]]
    baseline: str
    effects: dict[str, stats.Effect] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def compare(runs: list[Run], variables: list[str] | None = None, baseline: str | None = None,
            noise_floor: float | None = None) -> list[Comparison]:
    """A/B comparisons of ``runs`` over ``variables`` (default: what the runs' multiruns swept).

    ``noise_floor``: run-to-run noise for one-run arms (default: the hardware's ``run_to_run_noise``).

    Raises:
        Refused: no two runs share a contract apart from the variables, or there is nothing to compare.
    """
    if len(runs) < 2:
        raise Refused(f"{len(runs)} complete run(s): an A/B needs at least two")
    if not variables:
        variables = sorted({k for r in runs for k in r.results.get("swept", []) if k not in NOT_ARM_VARIABLES})
    if not variables:
        raise Refused("no variable to compare: the runs were not swept; name it with --variable KEY")
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(contracts.digest(contracts.excluding(r.results["contract"], variables)), []).append(r)
    out = []
    for key, members in groups.items():
        arms: dict[str, list[Run]] = {}
        for r in members:
            arms.setdefault(_arm_name(r, variables), []).append(r)
        if len(arms) < 2:
            continue
        names = list(arms)  # in run order: the sweep's first value is the baseline unless --baseline says
        base = baseline if baseline in arms else names[0]
        comp = Comparison(variables, key, arms, base)
        by_runs = all(len(rs) >= 2 for rs in arms.values())
        floor = 0.0 if by_runs else (noise_floor if noise_floor is not None else max(
            float((r.results["contract"].get("hardware") or {}).get("run_to_run_noise") or 0.0) for r in members))
        for name in names:
            if name == base:
                continue
            if by_runs:
                a, b = [r.window_mean for r in arms[base]], [r.window_mean for r in arms[name]]
            else:
                a = [t for r in arms[base] for t in r.window_steps]
                b = [t for r in arms[name] for t in r.window_steps]
            comp.effects[name] = stats.welch(a, b, "runs" if by_runs else "steps", floor=floor)
        if not by_runs:
            comp.notes.append(f"one run per arm: a difference counts only beyond the run-to-run noise of {floor:.0%} "
                              "(hardware.run_to_run_noise); repeat the arms (e.g. repeat=0,1,2) for a run-level verdict")
        out.append(comp)
    if not out:
        a, b = runs[0], next((r for r in runs[1:] if _arm_name(r, variables) != _arm_name(runs[0], variables)), runs[1])
        diff = [d for d in contract_diff(contracts.excluding(a.results["contract"], variables),
                                         contracts.excluding(b.results["contract"], variables))]
        shown = "\n  ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in diff[:20]) or "(identical contracts, one arm)"
        raise Refused(f"no two arms share a contract apart from {', '.join(variables)}; never compared across "
                      f"contracts. {a.path} vs {b.path} differ in:\n  {shown}")
    return out


# --------------------------------------------------------------------------- acceptance

ACCEPT_MIN_STEPS, ACCEPT_MIN_WINDOW = 50, 10
EVIDENCE_FOR = {"dispatcher": "dispatcher_class", "precision": "precision_recipe",
                "kernels.moe_grouped_gemm": "grouped_gemm", "expert_mesh": "local_experts_per_rank",
                "mesh": "local_experts_per_rank", "parallel.expert_model_parallel_size": "local_experts_per_rank"}


def acceptance_problems(run: Run, variables: list[str]) -> list[str]:
    r, problems = run.results, []
    if r.get("label") != contracts.TRAINING_EQUIVALENT:
        problems.append(f"benchmark-only: {'; '.join(r.get('label_reasons', []))}")
    first, last = r["window"]
    if last - first + 1 < ACCEPT_MIN_WINDOW:
        problems.append(f"window [{first},{last}] has {last - first + 1} steps; acceptance needs >= {ACCEPT_MIN_WINDOW}")
    if r.get("steps", 0) < ACCEPT_MIN_STEPS:
        problems.append(f"{r.get('steps')} steps; acceptance needs >= {ACCEPT_MIN_STEPS}")
    loss = r.get("loss", {})
    if not loss.get("all_finite", False):
        problems.append("non-finite loss")
    if loss.get("nan_or_skipped", 1):
        problems.append(f"{loss.get('nan_or_skipped')} NaN or skipped steps")
    evidence = r.get("evidence") or {}
    for v in variables:
        key = EVIDENCE_FOR.get(v)
        if key and evidence.get(key) is None:
            problems.append(f"no evidence that {v} was active (evidence.{key} missing)")
    if not evidence:
        problems.append("no evidence read from the built model")
    return problems


def accept(runs: list[Run], variables: list[str]) -> tuple[list[str], list[str]]:
    """(refusals, report lines): the acceptance gate of docs/workflow.md for every run."""
    refusals, report = [], []
    for run in runs:
        problems = acceptance_problems(run, variables)
        refusals += [f"{run.path}: {p}" for p in problems]
        r = run.results
        ev = r.get("evidence", {})
        report.append(
            f"{run.path}\n  label {r.get('label')}; contract {r.get('contract_hash')}; {r['steps']} steps, window "
            f"{r['window']}\n  step {r['step_time_ms']:.2f} ms, {r['tokens_per_s_per_gpu']:.1f} tokens/s/GPU, "
            f"{r['tflops_per_gpu']:.4f} TFLOP/s/GPU, MFU {r.get('mfu')}\n  loss {r['loss']['first']:.4f} -> "
            f"{r['loss']['last']:.4f}, finite {r['loss']['all_finite']}, NaN/skipped {r['loss']['nan_or_skipped']}\n"
            f"  peak memory {r.get('peak_memory_gib')}\n  evidence: {json.dumps(ev, sort_keys=True)}")
    return refusals, report


# --------------------------------------------------------------------------- regression diagnosis

METRICS = ("step_time_ms", "host_time_ms", "device_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu")
WALL_THRESHOLD = 0.05


def _memory(r: dict[str, Any]) -> float | None:
    m = r.get("peak_memory_gib") or {}
    return m.get("reserved") or m.get("allocated") or m.get("rss")


def diagnose(a: Run, b: Run) -> dict[str, Any]:
    ra, rb = a.results, b.results
    order = ["parallel", "dispatcher", "routing", "precision", "recompute", "offload", "kernels", "overlap", "train",
             "timing", "model", "optimizer", "data", "hardware", "launcher", "software", "seed"]
    config = sorted(contract_diff(ra["contract"], rb["contract"]),
                    key=lambda d: (order.index(d[0].split(".")[0]) if d[0].split(".")[0] in order else len(order), d[0]))
    ea = json.loads((a.path / "env.json").read_text()) if (a.path / "env.json").exists() else {}
    eb = json.loads((b.path / "env.json").read_text()) if (b.path / "env.json").exists() else {}
    env_keys = ("versions", "env", "runtime", "slurm", "hostname", "git")
    env = contract_diff({k: ea.get(k) for k in env_keys}, {k: eb.get(k) for k in env_keys})
    metrics = {}
    for k in METRICS:
        va, vb = ra.get(k), rb.get(k)
        metrics[k] = (va, vb, (vb - va) / va if va and vb is not None else None)
    ma, mb = _memory(ra), _memory(rb)
    metrics["peak_memory_gib"] = (ma, mb, (mb - ma) / ma if ma and mb is not None else None)
    la, lb = ra["loss"]["last"], rb["loss"]["last"]
    metrics["loss.last"] = (la, lb, (lb - la) / la if la else None)

    def moved(key: str) -> str:
        rel = metrics[key][2]
        if rel is None:
            return "unknown (not measured on this backend)"
        return f"{'moved' if abs(rel) > WALL_THRESHOLD else 'steady'} ({rel:+.1%})"

    walls = {
        "memory": moved("peak_memory_gib"),
        "compute": moved("device_time_ms"),
        "host": moved("host_time_ms"),
        "communication": "unknown: no profile breakdown in these runs",
    }
    return {"config": config, "env": env, "metrics": metrics, "walls": walls}


# --------------------------------------------------------------------------- output

def _pct(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:+.2%}"


def _markdown(comps: list[Comparison], warnings: list[str]) -> str:
    lines = ["# moe_hydra compare", ""]
    for c in comps:
        lines += [f"## {', '.join(c.variables)} (contract {c.contract_hash}), baseline `{c.baseline}`", "",
                  "| arm | runs | step ms | step time vs baseline (95% CI) | tokens/s/GPU vs baseline (95% CI) | MDE | "
                  "verdict |", "|---|---|---|---|---|---|---|"]
        base_ms = sum(r.window_mean for r in c.arms[c.baseline]) / len(c.arms[c.baseline])
        lines.append(f"| {c.baseline} | {len(c.arms[c.baseline])} | {base_ms:.2f} | baseline | baseline | | |")
        for name, e in c.effects.items():
            lines.append(f"| {name} | {len(c.arms[name])} | {e.mean_b_ms:.2f} | {_pct(e.rel_step_time)} "
                         f"[{_pct(e.ci_low)}, {_pct(e.ci_high)}] | {_pct(e.rel_tokens_per_s)} [{_pct(e.tokens_ci_low)}, "
                         f"{_pct(e.tokens_ci_high)}] | {e.mde:.2%} | {e.verdict} (unit: {e.unit}, p={e.p_value:.3g}) |")
        lines += [""] + [f"> {n}" for n in c.notes] + [""]
    if warnings:
        lines += ["## Skipped", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _plot(comps: list[Comparison], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(comps), figsize=(6 * len(comps), 4), squeeze=False)
    for ax, c in zip(axes[0], comps):
        names = list(c.arms)
        data = [[t for r in c.arms[n] for t in r.window_steps] for n in names]
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(names) + 1), [n if len(n) < 30 else n[:27] + "..." for n in names], rotation=15)
        ax.set_ylabel("steady-window step time (ms)")
        ax.set_title(f"{', '.join(c.variables)} [{c.contract_hash[:8]}]")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(comps: list[Comparison]):
    from rich.table import Table

    t = Table(title="A/B verdicts (steady-window step time; 95% CI, Welch)", title_justify="left")
    for col in ("variable", "baseline", "candidate", "unit", "step time", "95% CI", "tokens/s/GPU", "MDE", "verdict"):
        t.add_column(col)
    for c in comps:
        for name, e in c.effects.items():
            color = {"faster": "green", "slower": "red"}.get(e.verdict, "yellow")
            t.add_row(", ".join(c.variables), f"{c.baseline} ({e.mean_a_ms:.2f} ms, n={e.n_a})",
                      f"{name} ({e.mean_b_ms:.2f} ms, n={e.n_b})", e.unit, _pct(e.rel_step_time),
                      f"[{_pct(e.ci_low)}, {_pct(e.ci_high)}]", _pct(e.rel_tokens_per_s), f"{e.mde:.2%}",
                      f"[{color}]{e.verdict}")
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_hydra.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories")
    ap.add_argument("--variable", action="append", help="the variable under test (override key); repeatable")
    ap.add_argument("--baseline", help="the baseline arm, e.g. 'dispatcher=alltoall'")
    ap.add_argument("--noise-floor", type=float, help="run-to-run noise for one-run arms, relative "
                    "(default: hardware.run_to_run_noise of the runs)")
    ap.add_argument("--accept", action="store_true", help="the acceptance gate of the validate phase")
    ap.add_argument("--diff", action="store_true", help="regression diagnosis of two run directories")
    args = ap.parse_args(argv)
    from moe_hydra.core.io import console

    out = console()
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        print(f"moe_hydra.compare: warning: {message}", file=sys.stderr)

    runs = load(args.dirs, warn)
    try:
        if args.diff:
            if len(args.dirs) != 2 or len(runs) != 2:
                raise Refused(f"--diff takes two run directories with complete results ({len(runs)} found)")
            report = diagnose(*runs)
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
            return 0
        variables = args.variable or sorted({k for r in runs for k in r.results.get("swept", [])
                                             if k not in NOT_ARM_VARIABLES})
        if args.accept:
            refusals, report = accept(runs, variables)
            if not runs:
                raise Refused("no complete run to accept")
            if refusals:
                raise Refused("not accepted:\n  " + "\n  ".join(refusals))
            out.print("[bold green]accepted[/bold green] — evidence bundle:")
            for block in report:
                out.print(block, highlight=False, markup=False)
            return 0
        comps = compare(runs, variables, args.baseline, args.noise_floor)
    except Refused as e:
        print(f"moe_hydra.compare: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    out.print(_table(comps))
    for c in comps:
        for n in c.notes:
            out.print(f"note: {n}", highlight=False)
    first = args.dirs[0] if args.dirs[0].is_dir() else args.dirs[0].parent
    (first / "compare.md").write_text(_markdown(comps, warnings))
    _plot(comps, first / "compare.png")
    out.print(f"written: {first / 'compare.md'}, {first / 'compare.png'}", highlight=False)
    return 0

