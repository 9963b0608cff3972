"""How a sweep's points are shown: the table of ``moe-hydra sweep status|wait`` and the Slurm launcher's wait
(state, progress, measured figures), then each point that did not complete with its error and logs."""

from __future__ import annotations

from moe_hydra.core.io import console
from moe_hydra.launch.ledger import Point
from moe_hydra.launch.outcome import SUBMITTED


def varying(points: list[Point]) -> dict[int, str]:
    """Per point, the overrides that differ between the points (the swept ones); all when alone."""
    common = set.intersection(*(set(p.overrides) for p in points)) if len(points) > 1 else set()
    return {p.num: " ".join(o for o in p.overrides if o not in common) for p in points}


def _clock(seconds: int | None) -> str:
    if seconds is None:
        return ""
    h, rest = divmod(int(seconds), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress(p: Point) -> str:
    """Elapsed time, last step and attempt of a point, as the table shows them: "1:12 · step 17 · attempt 2"."""
    parts = []
    if p.elapsed_s is not None and p.state in ("RUNNING", "COMPLETING"):
        parts.append(_clock(p.elapsed_s))
    if p.last_step is not None and p.state in ("RUNNING", "COMPLETING"):
        parts.append(f"step {p.last_step}")
    if p.attempts and p.attempts > 1:
        parts.append(f"attempt {p.attempts}")
    return " · ".join(parts)


def render(points: list[Point], title: str):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("#", "swept", "state", "slurm job", "progress", "step ms", "tokens/s/GPU", "error / directory"):
        t.add_column(col, overflow="fold")
    style = {"COMPLETED": "green", "KEPT": "green", "INVALID": "yellow", "PENDING": "cyan", "RUNNING": "cyan",
             "REQUEUED": "cyan", "CONFIGURING": "cyan", "COMPLETING": "cyan", SUBMITTED: "cyan"}
    swept = varying(points)
    for p in sorted(points, key=lambda p: p.num):
        first_error = [line for line in (p.error or "").strip().splitlines() if line.strip()][:1] or [""]
        t.add_row(str(p.num), escape(swept[p.num]), f"[{style.get(p.state, 'red')}]{p.state}",
                  p.slurm_job_id or "", progress(p), f"{p.step_time_ms:.1f}" if p.step_time_ms else "",
                  f"{p.tokens_per_s_per_gpu:.1f}" if p.tokens_per_s_per_gpu else "",
                  escape(first_error[0] if not (p.ok or p.active) else p.dir))
    return t


def report(points: list[Point], title: str, out=None) -> None:
    """The table, then each point that did not complete with its error and logs, then the count."""
    from rich.markup import escape

    out = out or console()
    out.print(render(points, title))
    for p in points:
        if not (p.ok or p.active or p.state == SUBMITTED):
            out.print(f"[bold]#{p.num} {p.state}[/bold] {escape(' '.join(p.overrides))}", highlight=False)
            if p.error:
                out.print(p.error, highlight=False, markup=False)
            for log in p.logs:
                out.print(f"  log: {log}", highlight=False)
    done = sum(p.ok for p in points)
    out_now = sum(p.active for p in points)
    out.print(f"{done} of {len(points)} points complete" + (f", {out_now} still out" if out_now else ""))

