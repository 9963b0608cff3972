"""``hydra/sweeper=layout``: the layout search as a Hydra sweeper, so it composes with any launcher.

    python -m moe_hydra stage=plan model=qwen3_235b_a22b hardware=h100_sxm hardware.nodes=32 hydra/sweeper=layout -m
    python -m moe_hydra model=tiny_moe hardware.devices_per_node=2 hydra/sweeper=layout hydra.sweeper.top_k=4 -m

1. Compose the command's overrides into one config (its own layout, if any, is replaced). Choose the
   communication settings to try with every layout (:meth:`LayoutSweeperImpl.communication`): on GPUs
   the configured dispatcher and the hardware's flex dispatcher, EP overlap off and on — unless the
   command sets them.
2. :class:`moe_hydra.planning.search.Search`: enumerate -> legality -> fit -> rank; print the top of the
   ranking with every step-time term; write ``layouts.json`` and a ready-to-run sweep of the top
   layouts (``search/experiment/layout_NN.yaml`` + ``run_top.sh``) into the sweep directory.
3. Unless ``stage=plan`` (or ``fit``), screen the layouts the step model cannot tell from the best (``tied``
   in ``layouts.json``: predicted within the ratio it orders with 95 % confidence, ``tie_width``), at most
   ``top_k`` of them, with short real runs through the configured launcher (local processes or Slurm): a short
   contract (``screen_window``: auto, each run stepping until its step times are steady, or a declared window; after
   ``screen_warmup`` steps), every arm with the same global batch and contract hash; a layout whose window is not
   steady is listed with its judgment, not ranked.
   Rank them by
   measured steady step time with a 95 % interval of the mean; a layout whose Welch comparison with
   the fastest (moe_hydra.core.stats, the hardware's run-to-run noise as the floor) finds no significant
   difference is a tie. Name the layout to validate with a >= 50-step run, and print its command.
   ``profile_top=N`` profiles the first N screened layouts (``profile=window``, after their screening window),
   and the table says where each one's step goes (compute, exposed communication, host, ...).

The screening's results land in ``layouts.json`` (``screening``) and ``screening.md``.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict

from moe_hydra.analysis.runs import Run
from moe_hydra.core import contract as contracts
from moe_hydra.core import io, overrides, stats, steady
from moe_hydra.core.steady import AUTO
from moe_hydra.core.errors import Refused
from moe_hydra.core.schema import Config, Stage, typed
from moe_hydra.core.violations import LayoutError
from moe_hydra.launch import outcome, points
from moe_hydra.planning import layouts_file, search
from moe_hydra.planning.step_model import TERMS

log = logging.getLogger(__name__)

# What screening arms differ in, left out of their contract hash (moe_hydra.core.contract).
SEARCHED = ["mesh", "recompute", "train.micro_batch_size"]
EP_OVERLAP = "overlap.overlap_moe_expert_parallel_comm"
LAYOUT_GROUPS = ("attention_mesh", "expert_mesh", "mesh")


@dataclass
class LayoutSweeperConf:
    _target_: str = "hydra_plugins.moe_hydra_sweeper.LayoutSweeper"
    # The most layouts to screen with real runs (not with stage=plan): the set tied with the best, cut at
    # this many; 0 = search only.
    top_k: int = 0
    # Micro-batch sizes to search as well; null = train.micro_batch_size only.
    micro_batch_sizes: Optional[List[int]] = None
    # Dispatcher presets to try with every layout (each layout keeps the fastest that is legal and fits);
    # null = the configured one and the hardware's flex dispatcher (hardware.flex_dispatcher), or only the
    # one the command sets with dispatcher=.
    dispatchers: Optional[List[str]] = None
    # EP overlap (overlap.overlap_moe_expert_parallel_comm) settings to try; null = both on GPUs (it needs
    # CUDA streams), or only the one the command sets.
    ep_overlap: Optional[List[bool]] = None
    # Rows of the printed ranking, and layouts written as a ready-to-run sweep.
    table_rows: int = 15
    # The screening contract: warmup steps, then the steady window: auto (each run steps until it is steady) or
    # [first, last]. A layout whose window is not steady is not ranked (its judgment is in the screening).
    screen_warmup: int = 3
    screen_window: Any = AUTO
    # Steady steps of the validation run the screening recommends.
    validate_steps: int = 50
    # Profile the first this many screened layouts (profile=window: the steps after the screening window, so
    # their measurement stays unprofiled); the screening table then says where each one's step goes.
    profile_top: int = 0
    # Filled at sweep time with the searched keys (what the arms differ in).
    params: Optional[dict] = None


def register() -> None:
    ConfigStore.instance().store(group="hydra/sweeper", name="layout", node=LayoutSweeperConf, provider="moe_hydra")


class LayoutSweeperImpl(Sweeper):
    def __init__(self, top_k: int = 0, micro_batch_sizes: list[int] | None = None, table_rows: int = 15,
                 screen_warmup: int = 3, screen_window: Any = AUTO, validate_steps: int = 50,
                 params: dict | None = None, dispatchers: list[str] | None = None, ep_overlap: list[bool] | None = None,
                 profile_top: int = 0):
        super().__init__()
        self.top_k, self.micro_batch_sizes, self.table_rows = top_k, micro_batch_sizes, table_rows
        self.dispatchers = list(dispatchers) if dispatchers else None
        self.ep_overlap = list(ep_overlap) if ep_overlap else None
        self.screen_warmup = screen_warmup
        self.screen_window = AUTO if screen_window in (None, AUTO) else list(screen_window)
        self.validate_steps = validate_steps
        self.profile_top = profile_top
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # ------------------------------------------------------------------ the search

    def sweep(self, arguments: list[str]) -> Any:
        parsed = overrides.parse(arguments)
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        if sweeps:
            return self._outcome("INVALID", f"hydra/sweeper=layout searches the layout; it does not also sweep "
                                             f"{', '.join(sweeps)} (run one search per value)")
        replaced = [o.input_line for o in parsed
                    if o.key_or_group in LAYOUT_GROUPS or o.key_or_group.startswith("parallel.")]
        if replaced:
            print(f"moe_hydra: the search chooses the layout; it replaces {' '.join(replaced)}", file=sys.stderr, flush=True)
        cfg = typed(self.hydra_context.config_loader.load_sweep_config(self.config, list(arguments)))
        dispatchers, ep_overlap = self.communication(cfg, {o.key_or_group for o in parsed})
        searched = SEARCHED + ["dispatcher"] * (len(dispatchers) > 1) + [EP_OVERLAP] * (len(ep_overlap) > 1)
        with open_dict(self.config):
            self.config.hydra.sweeper.params = {key: "searched" for key in searched}
        try:
            lock = points.claim(self.config)  # one sweep per directory, taken before multirun.yaml is written
        except Refused as e:
            return self._outcome("INVALID", str(e))
        with lock:
            OmegaConf.save(self.config, Path(str(self.config.hydra.sweep.dir)) / "multirun.yaml")
            return self._search(cfg, arguments, dispatchers, ep_overlap)

    def _search(self, cfg: Config, arguments: list[str], dispatchers: list[str], ep_overlap: list[bool]) -> list:
        """Run the search, write its reports, then screen the leading layouts (``stage=run``, ``top_k``)."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        t0 = time.perf_counter()
        try:
            s = search.Search(cfg, self.micro_batch_sizes, dispatchers=dispatchers, ep_overlap=ep_overlap)
        except LayoutError as e:  # sizes that cannot be sizes (S02): there is nothing to search
            return self._outcome("INVALID", e.report())
        results = s.run()
        seconds = time.perf_counter() - t0
        report = s.report(results, seconds)
        ranked = [r for r in report["candidates"] if r["rank"]]
        console = io.console()
        console.print(render_ranking(report, self.table_rows))
        base = [a for a in arguments if not a.startswith("hydra/sweeper") and not a.startswith("hydra.sweeper")]
        if ranked:
            report["ready_to_run"] = write_sweep(sweep_dir, ranked[: self.table_rows], base)
            console.print(f"ready-to-run sweep of the top {min(len(ranked), self.table_rows)}: "
                          f"{report['ready_to_run']['script']}", markup=False)
        layouts_file.write(report, sweep_dir / "layouts.json")
        log.info("layouts written to %s (%d candidates, %d ranked, search %.2f s)", sweep_dir / "layouts.json",
                 report["counts"]["candidates"], len(ranked), seconds)
        if not ranked:
            return self._outcome("INVALID", "no legal layout fits; see layouts.json for why (first_violation, "
                                             "memory_gib)")
        if cfg.stage is not Stage.run or self.top_k <= 0:
            return self._outcome("PLANNED")
        tied = [r for r in ranked if r["tied"]]  # what the step model cannot tell apart: screening measures it
        if len(tied) > self.top_k:
            log.info("%d layouts are tied with the best (within x%.2f the model cannot order them); screening "
                     "the first %d (hydra.sweeper.top_k)", len(tied), report["tie_width"], self.top_k)
        screening, returns = self._screen(cfg, s, tied[: self.top_k], base, sweep_dir)
        report["screening"] = screening
        layouts_file.write(report, sweep_dir / "layouts.json")
        return returns

    def _outcome(self, state: str, message: str | None = None) -> list:
        """The search's own outcome (refused, or planned without screening), handed to Hydra's callbacks as the
        JobReturn of a point named "layout search"."""
        if message:
            print(f"moe_hydra: {message}", file=sys.stderr, flush=True)
        ret = outcome.job_return(["layout search"], state, message)
        self.hydra_context.callbacks.on_job_end(config=self.config, job_return=ret)
        return [ret]

    def communication(self, cfg: Config, set_by_command: set[str]) -> tuple[list[str], list[bool]]:
        """The dispatchers and EP overlap settings to try with every layout: the sweeper's options, else the
        configured ones plus the hardware's flex dispatcher and both EP overlap settings on GPUs — unless the
        command sets them."""
        dispatchers = self.dispatchers or [cfg.dispatcher.name]
        flex = cfg.hardware.flex_dispatcher
        if self.dispatchers is None and "dispatcher" not in set_by_command and flex and cfg.model.num_moe_experts:
            dispatchers = list(dict.fromkeys([*dispatchers, flex]))
        configured = cfg.overlap.overlap_moe_expert_parallel_comm
        ep_overlap = self.ep_overlap if self.ep_overlap is not None else [configured]
        if (self.ep_overlap is None and EP_OVERLAP not in set_by_command and cfg.hardware.arch != "cpu"
                and cfg.model.num_moe_experts):
            ep_overlap = [configured, not configured]
        return dispatchers, ep_overlap

    # ------------------------------------------------------------------ screening

    def _screen(self, cfg: Config, s: search.Search, top: list[dict], base: list[str],
                sweep_dir: Path) -> tuple[dict, list]:
        window = self.screen_window if self.screen_window == AUTO else "[{},{}]".format(*self.screen_window)
        contract = [f"contract.warmup_steps={self.screen_warmup}", f"contract.window={window}"]
        jobs = [[*base, *c["overrides"], *contract, *(["profile=window"] if i < self.profile_top else [])]
                for i, c in enumerate(top)]
        log.info("screening %d layouts (the leading tied set) through %s", len(jobs), type(self.launcher).__name__)
        returns = self.launcher.launch(jobs, initial_job_idx=0)
        if any(outcome.state_of(ret) == outcome.SUBMITTED for ret in returns):  # launcher.detach=true: ranked later
            queued = {"detached": True, "noise_floor": cfg.hardware.run_to_run_noise, "base": base,
                      "screen_warmup": self.screen_warmup, "validate_steps": self.validate_steps,
                      "arms": [_arm(c, None, outcome.output_dir(ret)) | {"status": outcome.state_of(ret)}
                               for c, ret in zip(top, returns)]}
            io.console().print(f"screening of {len(top)} layouts queued; python -m moe_hydra.sweep wait {sweep_dir} "
                               "ranks them (layouts.json, screening.md) when they have run", markup=False)
            return queued, returns
        arms = []
        for c, ret in zip(top, returns):
            job_dir = outcome.output_dir(ret)
            arms.append(_arm(c, outcome.complete_results(job_dir) if job_dir else None, job_dir))
        table = rank_measured(arms, cfg.hardware.run_to_run_noise)
        conclude(table, base, self.validate_steps, sweep_dir)
        return table, returns


def conclude(table: dict, base: list[str], validate_steps: int, sweep_dir: Path) -> None:
    """Print the screening table and the command that validates the fastest layout; write screening.md."""
    console = io.console()
    console.print(render_screening(table))
    best = next((a for a in table["arms"] if a["measured_rank"] == 1), None)
    if best:
        validate = [*base, *best["overrides"], *steady.validation(validate_steps)]
        table["validate"] = {"layout": best["layout"], "command": _command(validate)}
        tie = [a["layout"] for a in table["arms"] if a["tie_with_best"] and a is not best]
        console.print(f"validate {best['layout']} with a run of at least {validate_steps} steps, its window steady"
                      + (f" (within the noise of {', '.join(tie)}: of the tied layouts, the one the analytic "
                         "ranking puts first)" if tie else "")
                      + f":\n  {table['validate']['command']}", markup=False)
    io.write_text(sweep_dir / "screening.md", screening_markdown(table))


def finish_screening(sweep_dir: Path) -> dict | None:
    """A screening that ``launcher.detach=true`` queued (``python -m moe_hydra.sweep wait`` calls this once its
    points have ended): rank the measured layouts as an attached screening does, and write them into layouts.json
    and screening.md. The table, or None when there was no such screening."""
    path = sweep_dir / "layouts.json"
    report = layouts_file.read(path) or {}
    queued = report.get("screening") or {}
    if not queued.get("detached"):
        return None
    arms = []
    for a in queued["arms"]:
        job_dir = Path(a["dir"]) if a.get("dir") not in (None, "None") else None
        candidate = {"layout": a["layout"], "rank": a["predicted_rank"], "overrides": a["overrides"],
                     "step_time_s": a["predicted_step_s"]}
        arms.append(_arm(candidate, outcome.complete_results(job_dir) if job_dir else None, job_dir))
    table = rank_measured(arms, queued["noise_floor"])
    conclude(table, queued["base"], queued["validate_steps"], sweep_dir)
    report["screening"] = table
    layouts_file.write(report, path)
    return table


def _arm(candidate: dict, res: dict | None, job_dir: Path | None) -> dict:
    arm = {"layout": candidate["layout"], "predicted_rank": candidate["rank"], "overrides": candidate["overrides"],
           "predicted_step_s": candidate["step_time_s"], "dir": str(job_dir), "status": "ok" if res else "failed"}
    judged = steady.of_results(res) if res else None
    if judged is not None and not judged.window_steady:  # not evidence: listed with why, never ranked
        arm.update(status="not steady", steady=judged.as_dict())
    elif res:
        arm["samples_ms"] = Run(job_dir, res).window_steps
        work = contracts.Work.of(res.get("contract") or {})
        arm["work"] = [work.tokens_per_step, work.gpus, work.batch_unit] if work else None
        arm["tokens_per_s_per_gpu"] = res.get("tokens_per_s_per_gpu")
        arm["profile"] = res.get("profile")  # profile_top: the slowest rank's walls over the profiled steps
    return arm


def _walls(arm: dict) -> str:
    """Where a profiled arm's step goes, per step: "compute 61 · exposed comm 22 · host 17 ms"."""
    p = arm.get("profile")
    if not p or not p.get("wall_ms"):
        return ""
    n = p["steps"][1] - p["steps"][0] + 1
    shown = (("compute_ms", "compute"), ("exposed_communication_ms", "exposed comm"), ("host_ms", "host"),
             ("memcpy_ms", "memcpy"), ("idle_ms", "idle"))
    return " · ".join(f"{label} {p[k] / n:.0f}" for k, label in shown if p.get(k)) + " ms"


def rank_measured(arms: list[dict], noise: float) -> dict:
    """Measured steady step time per arm, a 95 % t-interval of its mean, ranks, and ties with the fastest
    (Welch, with ``noise`` as the floor: one run per arm cannot tell differences below it)."""
    measured = [a for a in arms if len(a.get("samples_ms") or []) >= 2]
    # like with like: the layouts of one search train the same tokens a step on the same GPUs, so step time ranks
    # them; contract.measure refuses a screening where they do not (its variable is the layout, not the work)
    contracts.measure([contracts.Work(*a["work"]) if a.get("work") else None for a in measured], ["layout"],
                      [a["layout"] for a in measured])
    for a in measured:
        mean, low, high = stats.mean_interval(a["samples_ms"])
        a.update(step_ms=mean, ci_ms=[low, high])
    measured.sort(key=lambda a: (a["step_ms"], a["predicted_rank"]))
    best = measured[0] if measured else None
    for i, a in enumerate(measured, 1):
        a["measured_rank"] = i
        if a is best:
            a["tie_with_best"], a["vs_best"] = True, None
            continue
        eff = stats.welch(best["samples_ms"], a["samples_ms"], unit="steps", floor=noise)
        a["vs_best"] = {"rel_step_time": eff.rel_step_time, "ci": [eff.ci_low, eff.ci_high], "verdict": eff.verdict}
        a["tie_with_best"] = eff.verdict == stats.SAME
    if best:  # among the ties, the analytic ranking decides which to validate
        tied = [a for a in measured if a["tie_with_best"]]
        pick = min(tied, key=lambda a: a["predicted_rank"])
        if pick is not best:
            pick["measured_rank"], best["measured_rank"] = 1, pick["measured_rank"]
            measured.sort(key=lambda a: a["measured_rank"])
    failed = [a for a in arms if a not in measured]
    for a in failed:
        a["measured_rank"] = None
    return {"noise_floor": noise, "confidence": 0.95, "metric": contracts.STEP_TIME, "arms": measured + failed,
            "counter": "steady-window step times (results.json step_times_ms), mean and 95 % t-interval"}


def write_sweep(sweep_dir: Path, ranked: list[dict], base: list[str]) -> dict:
    """The top layouts as ``experiment`` options (``search/experiment/layout_NN.yaml``: an experiment may
    override other groups, such as recompute) and one multirun over them that runs them: the search's overrides
    less its ``stage`` (a search planned with ``stage=plan`` or ``fit`` writes a sweep that trains, the default
    stage); ``run_top.sh`` adds its own arguments to the command (``run_top.sh stage=plan`` plans them again)."""
    mesh_dir = sweep_dir / "search" / "experiment"
    mesh_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for c in ranked:
        name = f"layout_{c['rank']:02d}"
        lines = ["# @package _global_", f"# rank {c['rank']} of the layout search: {c['layout']}, "
                 f"{c['recompute']} recompute, {c['memory_gib']} GiB, predicted step {c['step_time_s']:.3f} s"]
        groups = [(o.key_or_group, o.value()) for o in overrides.parse(c["overrides"]) if "." not in o.key_or_group]
        if groups:
            lines.append("defaults:\n" + "\n".join(f"  - override /{g}: {v}" for g, v in groups))
        tree = overrides.tree(c["overrides"])
        io.write_text(mesh_dir / f"{name}.yaml", "\n".join(lines) + "\n" + OmegaConf.to_yaml(tree))
        names.append(name)
    runs = [a for a, o in zip(base, overrides.parse(base)) if o.key_or_group != "stage"]  # the default stage: run
    command = _command(["-m", *runs, f"hydra.searchpath=[file://{(sweep_dir / 'search').resolve()}]",
                        f"experiment={','.join(names)}"])
    script = sweep_dir / "run_top.sh"
    io.write_text(script, f"#!/usr/bin/env bash\n# The top {len(names)} layouts of this search as one sweep that trains "
                      f"and measures each; overrides given to it are added (run_top.sh stage=plan plans them only)."
                      f"\n{command} \"$@\"\n")
    mode = script.stat().st_mode
    script.chmod(mode | (mode & 0o444) >> 2)  # executable by whoever may read it (the umask decides who)
    from moe_hydra.handoff.layouts import write_exports  # the top layouts as Megatron-LM / Megatron-Bridge commands

    write_exports(sweep_dir, ranked, base)
    return {"script": str(script), "command": command, "experiment_dir": str(mesh_dir), "layouts": names}


def _command(args: list[str]) -> str:
    return "python -m moe_hydra " + " ".join(shlex.quote(a) for a in args)


# ----------------------------------------------------------------------------- tables

def _s(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def render_ranking(report: dict, rows: int):
    from rich.table import Table

    c = report["counts"]
    t = Table(title=f"layout search: {report['model']} on {report['world_size']} x {report['hardware']}, "
                    f"GBS {report['global_batch_size']}, seq {report['seq_length']} — {c['candidates']} candidates, "
                    f"{c['legal']} legal, {c['fit']} fit, {report['search_seconds']:.2f} s", title_justify="left")
    comm = len(report["communication_settings"]) > 1
    top = [x for x in report["candidates"] if x["rank"]][:rows]
    terms = [k for k in TERMS if any(r["terms_s"][k] for r in top)]  # the terms that are zero throughout: left out
    t.caption = (f"tie: predicted within x{report['tie_width']:.2f} of the best (the model orders two layouts that "
                 f"close right with less than 95 % confidence), indistinguishable before measuring: "
                 f"{report['tied']} layouts" + (f"; the step model alone tied {report['tied_uncalibrated']} "
                                                f"(x{report['tie_width_uncalibrated']:.2f})"
                                                if "tied_uncalibrated" in report else ""))
    t.caption_justify = "left"
    for col in ("#", "tie", "layout", "MBS", *(("dispatcher",) if comm else ()), "recompute", "GiB", "step s", *terms):
        t.add_column(col, justify="left" if col in ("layout", "dispatcher", "recompute") else "right")
    for r in top:
        setting = (r["dispatcher"] + (" +ovl" if r["overlap_moe_expert_parallel_comm"] else ""),) if comm else ()
        t.add_row(str(r["rank"]), "≈" if r["tied"] else "", r["layout"], str(r["micro_batch_size"]), *setting,
                  r["recompute"],
                  "?" if r["memory_gib"] is None else f"{r['memory_gib']:.1f}", _s(r["step_time_s"]),
                  *(_s(r["terms_s"][k]) for k in terms))
    return t


def render_screening(table: dict):
    from rich.table import Table

    t = Table(title=f"screening: measured steady step time (95 % interval), ties within the noise floor "
                    f"{table['noise_floor']:.0%}", title_justify="left")
    profiled = any(a.get("profile") for a in table["arms"])
    for col in ("measured", "predicted", "layout", "step ms", "95 % interval", "tokens/s/GPU", "vs fastest",
                *(("walls per profiled step",) if profiled else ())):
        t.add_column(col, justify="left" if col in ("layout", "walls per profiled step") else "right")
    for a in table["arms"]:
        if a.get("measured_rank") is None:
            t.add_row("-", str(a["predicted_rank"]), a["layout"], "[red]failed[/]", "", "", a["dir"])
            continue
        vs = "fastest" if a["vs_best"] is None else (
            f"{a['vs_best']['rel_step_time']:+.1%} " + ("(tie)" if a["tie_with_best"] else "(slower)"))
        t.add_row(str(a["measured_rank"]), str(a["predicted_rank"]), a["layout"], f"{a['step_ms']:.1f}",
                  f"{a['ci_ms'][0]:.1f} .. {a['ci_ms'][1]:.1f}", f"{a['tokens_per_s_per_gpu']:.1f}", vs,
                  *((_walls(a),) if profiled else ()))
    return t


def screening_markdown(table: dict) -> str:
    lines = ["| measured | predicted | layout | step ms | 95 % interval | vs fastest | walls per profiled step |",
             "|---|---|---|---|---|---|---|"]
    for a in table["arms"]:
        if a.get("measured_rank") is None:
            lines.append(f"| - | {a['predicted_rank']} | {a['layout']} | failed | | | |")
            continue
        vs = "fastest" if a["vs_best"] is None else f"{a['vs_best']['rel_step_time']:+.1%}" + (
            " (tie)" if a["tie_with_best"] else "")
        lines.append(f"| {a['measured_rank']} | {a['predicted_rank']} | {a['layout']} | {a['step_ms']:.1f} | "
                     f"{a['ci_ms'][0]:.1f} .. {a['ci_ms'][1]:.1f} | {vs} | {_walls(a)} |")
    if table.get("validate"):
        lines += ["", f"Validate: `{table['validate']['command']}`"]
    return "\n".join(lines) + "\n"
