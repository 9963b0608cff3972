"""``python -m moe_hydra``: compose -> validate -> plan -> (stage=run) launch the job.

Bad input ends here with one message that names the override to change, exit code 2, no
traceback, and nothing launched. A job that starts and fails exits 1. In a multirun, invalid
points are reported and skipped, the valid ones proceed, and the exit code at the end says whether
any point failed (1) or was refused (2).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from moe_hydra import cli
from moe_hydra.core import env, io
from moe_hydra.core.schema import Stage, register_configs
from moe_hydra.launch import slurm
from moe_hydra.launch import state as sweep
from moe_hydra.planning import plan
from moe_hydra.planning.rules import LayoutError

log = logging.getLogger("moe_hydra")

EXIT_FAILED = 1  # a job started and failed
EXIT_INVALID = 2  # refused before anything started


@dataclass
class _Session:
    """Outcomes of the points this process ran or launched: (point, state) in sweep.py's vocabulary."""

    outcomes: list[tuple[str, str]] = field(default_factory=list)

    def of(self, *states: str) -> list[str]:
        return [name for name, state in self.outcomes if state in states]


_session = _Session()


def record_outcome(point: str, state: str) -> None:
    _session.outcomes.append((point, state))


def _sweep_context() -> tuple[list[str], str | None]:
    """(override keys swept by the current multirun, a name for the sweep); ([], None) for one run.

    Read from the sweep directory's multirun.yaml, which Hydra writes before any point starts.
    """
    hc = HydraConfig.get()
    if hc.mode.name != "MULTIRUN":
        return [], None
    sweep_dir = Path(hc.sweep.dir)
    swept: list[str] = []
    multirun = sweep_dir / "multirun.yaml"
    if multirun.exists():
        from hydra.core.override_parser.overrides_parser import OverridesParser

        mr = OmegaConf.load(multirun)
        task = OmegaConf.to_container(mr.hydra.overrides.task)
        for o in OverridesParser.create().parse_overrides(task):
            if o.is_sweep_override():
                swept.append(o.key_or_group)
                if o.key_or_group == "experiment":  # what the swept experiments set varies too
                    hydra_overrides = OmegaConf.to_container(mr.hydra.overrides.hydra)
                    swept += _keys_set_by("experiment", [str(v) for v in o.sweep_string_iterator()],
                                          task + hydra_overrides)
        swept += [k for k in (OmegaConf.select(mr, "hydra.sweeper.params") or {}) if k not in swept]
    return swept, f"{sweep_dir.parent.name}_{sweep_dir.name}"


def _keys_set_by(group: str, options: list[str], overrides: list[str]) -> list[str]:
    """Dotted keys and groups that the options of ``group`` set (from their YAML files, found in
    ``conf/`` and any ``hydra.searchpath`` directory): e.g. the layout search's generated experiments."""
    keys: list[str] = []
    for option in options:
        for root in (cli.CONF_DIR, *cli.search_path(overrides)):
            path = Path(root) / group / f"{option}.yaml"
            if not path.exists():
                continue
            node = OmegaConf.to_container(OmegaConf.load(path))
            for entry in node.pop("defaults", None) or []:
                if isinstance(entry, dict):
                    keys += [k.split("/")[-1] for k in entry]
            stack = [("", node)]
            while stack:
                prefix, sub = stack.pop()
                for k, v in sub.items():
                    if k == "hydra":
                        continue
                    if isinstance(v, dict):
                        stack.append((f"{prefix}{k}.", v))
                    else:
                        keys.append(f"{prefix}{k}")
            break
    # a layout swept by any of its sizes is the layout swept (DP, EDP follow from them)
    return list(dict.fromkeys("parallel" if k.startswith("parallel.") else k for k in keys))


def _tracking(p: dict, swept: list[str], sweep_name: str | None, obj) -> dict:
    """W&B group (the comparison) and job_type (the arm)."""
    task = HydraConfig.get().overrides.task
    arm = " ".join(o.lstrip("+") for o in task if o.lstrip("+").split("=", 1)[0] in swept)
    group = obj.logger.group or (f"{sweep_name}-{p['contract_hash'][:8]}" if sweep_name else p["contract_hash"])
    return {"group": group, "job_type": arm or "run", "swept": swept}


def _point_name() -> str:
    hc = HydraConfig.get()
    overrides = " ".join(hc.overrides.task) or "(defaults)"
    return f"#{hc.job.num} {overrides}" if hc.mode.name == "MULTIRUN" else overrides


def _report_invalid(message: str) -> None:
    record_outcome(_point_name(), "INVALID")
    print(f"moe_hydra: {message}", file=sys.stderr, flush=True)


def run_point(cfg: DictConfig) -> dict | None:
    """One point of a run or sweep. Returns the plan or the results, or None when it did not complete."""
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    obj = OmegaConf.to_object(cfg)
    swept, sweep_name = _sweep_context()
    snapshot = env.snapshot()
    try:
        p = plan.make_plan(obj, swept, snapshot)
    except LayoutError as e:
        io.write_json(e.record(), out_dir / "violations.json")
        message = e.report()
        if obj.stage is Stage.run:
            from moe_hydra.launch import local as launch

            machine = launch.preflight(obj)
            if machine:
                message += "\n  and on this machine:\n  " + "\n  ".join(machine)
        _report_invalid(message)
        return None
    p["tracking"] = _tracking(p, swept, sweep_name, obj)
    rank = slurm.slurm_rank()
    if rank is not None:  # one task of a Slurm job: this process is one rank
        return _run_slurm_task(cfg, obj, p, out_dir, rank, snapshot)
    io.write_json(p, out_dir / "plan.json")
    io.write_json(snapshot, out_dir / "env.json")
    if obj.stage is Stage.run:
        from moe_hydra.launch import local as launch

        too_big = plan.unfit(obj, p)
        if too_big:
            refusal = LayoutError([too_big], _point_name())
            io.write_json(refusal.record(), out_dir / "violations.json")
            _report_invalid(refusal.report())
            return None
        problems = launch.preflight(obj)
        if problems:
            _report_invalid("cannot run here; nothing was started:\n  " + "\n  ".join(problems))
            return None
    from rich.console import Console

    Console().print(plan.render(p))
    log.info("plan written to %s", out_dir / "plan.json")
    if obj.stage is Stage.run:
        return _run_job(cfg, p, out_dir, snapshot)
    if obj.stage is Stage.fit:
        return _run_fit(cfg, obj, p, out_dir)
    record_outcome(_point_name(), "PLANNED")
    return p


def _run_fit(cfg: DictConfig, obj, p: dict, out_dir: Path) -> dict:
    """stage=fit: build the chosen ranks on the fake process group; the estimator must agree exactly."""
    from rich.console import Console

    from moe_hydra.job import fit

    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    report = fit.run(obj, config, p, out_dir)
    Console().print(fit.render(report))
    for note in report["notes"]:
        print(f"note: {note}")
    if report["refused"]:
        record_outcome(_point_name(), "INVALID")
        print("moe_hydra: Megatron-Core refuses this layout:\n  " + "\n  ".join(sorted(set(report["refused"])))
              + f"\n  (build logs in {out_dir / 'fit'})", file=sys.stderr, flush=True)
    elif not report["agree"]:
        record_outcome(_point_name(), "FAILED")
        bad = [r["rank"] for r in report["ranks"] if not r["agree"]]
        print(f"moe_hydra: MISMATCH between the estimator and the build on ranks {bad}: a bug in "
              f"moe_hydra.params; see {out_dir / 'fit.json'}", file=sys.stderr, flush=True)
    else:
        record_outcome(_point_name(), "COMPLETED")
        print(f"moe_hydra: the estimator and Megatron-Core's build agree exactly on {len(report['ranks'])} ranks "
              f"(pipeline ranks {', '.join(str(r['pp_rank']) for r in report['ranks'])})  ({out_dir / 'fit.json'})",
              flush=True)
    return report


def _run_slurm_task(cfg: DictConfig, obj, p: dict, out_dir: Path, rank: int, snapshot: dict) -> dict | None:
    """Inside a Slurm job: rank 0 owns the output directory; every rank trains. Failures raise, so
    Hydra and submitit record them for the launcher that waits on this job."""
    from moe_hydra.job.train import worker
    from moe_hydra.launch import local as launch

    if rank == 0:
        io.write_json(p, out_dir / "plan.json")
        io.write_json(snapshot, out_dir / "env.json")
    if obj.stage is Stage.fit and rank == 0:  # the fit builds its ranks as processes of its own
        return _run_fit(cfg, obj, p, out_dir)
    if obj.stage is not Stage.run:
        return p
    problems = launch.preflight(obj, inside_allocation=True)
    if problems:
        raise RuntimeError("cannot run on this node:\n  " + "\n  ".join(problems))
    slurm.task_environment()
    return worker({"config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "out_dir": str(out_dir),
                   "plan": p, "env": snapshot})


def _run_job(cfg: DictConfig, p: dict, out_dir: Path, snapshot: dict) -> dict | None:
    """stage=run: start the ranks (the machine was checked), report the measured run."""
    from moe_hydra.launch import local as launch

    spec = {"config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "out_dir": str(out_dir), "plan": p,
            "env": snapshot}
    try:
        results = launch.launch_local(spec, p["world_size"], out_dir)
    except launch.JobFailed as e:
        record_outcome(_point_name(), "FAILED")
        print(f"moe_hydra: {e}", file=sys.stderr, flush=True)
        return None
    record_outcome(_point_name(), "COMPLETED")
    loss = results["loss"]
    print(f"moe_hydra: {results['steps']} steps, window {results['window']}: step {results['step_time_ms']:.1f} ms, "
          f"{results['tokens_per_s_per_gpu']:.1f} tokens/s/GPU, {results['tflops_per_gpu']:.4f} TFLOP/s/GPU, "
          f"loss {loss['first']:.3f} -> {loss['last']:.3f}  ({out_dir / 'results.json'})", flush=True)
    return results


@hydra.main(config_path=str(cli.CONF_DIR), config_name="config", version_base="1.3")
def _hydra_app(cfg: DictConfig) -> None:
    run_point(cfg)


def main() -> None:
    from moe_hydra.launch import layout_sweeper

    register_configs()
    slurm.register()
    layout_sweeper.register()
    args = cli.normalize(sys.argv[1:])
    site = os.environ.get("MOE_HYDRA_SITE")
    if site:  # a site directory (holding site/default.yaml) joins Hydra's search path
        entry = f"file://{Path(site).resolve()}"
        given = next((i for i, a in enumerate(args) if a.startswith("hydra.searchpath=")), None)
        if given is not None:  # one search path override, holding both
            args[given] = f"hydra.searchpath=[{entry},{args[given].split('=', 1)[1].strip('[]')}]"
        else:
            at = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), len(args))
            args.insert(at, f"hydra.searchpath=[{entry}]")  # beside the other overrides
    sys.argv[1:] = args
    problems = cli.check_overrides(args)
    if problems:
        print("moe_hydra: " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(EXIT_INVALID)
    _hydra_app()
    failed = [name for name, state in _session.outcomes if state not in (*sweep.OK_STATES, "PLANNED", "INVALID")]
    invalid = _session.of("INVALID")
    if (failed or invalid) and len(_session.outcomes) > 1:
        print(f"moe_hydra: {len(failed) + len(invalid)} of {len(_session.outcomes)} points did not complete:\n  "
              + "\n  ".join([f"{p} (refused)" for p in invalid] + [f"{p} (failed)" for p in failed]), file=sys.stderr)
    if failed:
        sys.exit(EXIT_FAILED)
    if invalid:
        sys.exit(EXIT_INVALID)
