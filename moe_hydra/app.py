"""``python -m moe_hydra``: compose -> validate -> plan -> (stage=run) launch the job.

Bad input ends here with one message that names the override to change, exit code 2, no
traceback, and nothing launched. A job that starts and fails exits 1. In a multirun, invalid
points are reported and skipped, the valid ones proceed, and the exit code at the end says whether
any point failed (1) or was refused (2).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from moe_hydra import cli, plan
from moe_hydra.rules import LayoutError
from moe_hydra.schema import Stage, register_configs

log = logging.getLogger("moe_hydra")

EXIT_FAILED = 1  # a job started and failed
EXIT_INVALID = 2  # refused before anything started


@dataclass
class _Session:
    """Outcomes of the points this process ran (one, or every point of a local multirun)."""

    invalid: list[str] = field(default_factory=list)  # refused before anything started
    failed: list[str] = field(default_factory=list)  # started, then failed
    points: int = 0


_session = _Session()


def _point_name() -> str:
    hc = HydraConfig.get()
    overrides = " ".join(hc.overrides.task) or "(defaults)"
    return f"#{hc.job.num} {overrides}" if hc.mode.name == "MULTIRUN" else overrides


def _report_invalid(message: str) -> None:
    _session.invalid.append(_point_name())
    print(f"moe_hydra: {message}", file=sys.stderr, flush=True)


def run_point(cfg: DictConfig) -> dict | None:
    """One point of a run or sweep. Returns the plan, or None when the config is invalid."""
    _session.points += 1
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    obj = OmegaConf.to_object(cfg)
    try:
        p = plan.make_plan(obj)
    except LayoutError as e:
        plan.write_json({"stage": "plan", "status": "invalid", "violations": [
            {"rule": v.rule, "message": v.message, "fields": dict(v.fields), "fix": v.fix} for v in e.violations
        ]}, out_dir / "violations.json")
        message = e.report()
        if obj.stage is Stage.run:
            from moe_hydra import launch

            machine = launch.preflight(obj)
            if machine:
                message += "\n  and on this machine:\n  " + "\n  ".join(machine)
        _report_invalid(message)
        return None
    plan.write_json(p, out_dir / "plan.json")
    if obj.stage is Stage.run:
        from moe_hydra import launch

        problems = launch.preflight(obj)
        if problems:
            _report_invalid("cannot run here; nothing was started:\n  " + "\n  ".join(problems))
            return None
    from rich.console import Console

    Console().print(plan.render(p))
    log.info("plan written to %s", out_dir / "plan.json")
    if obj.stage is Stage.run:
        return _run_job(cfg, p, out_dir)
    return p


def _run_job(cfg: DictConfig, p: dict, out_dir: Path) -> dict | None:
    """stage=run: start the ranks (the machine was checked), report the measured run."""
    from moe_hydra import launch

    spec = {"config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "out_dir": str(out_dir), "plan": p}
    try:
        results = launch.launch_local(spec, p["world_size"], out_dir)
    except launch.JobFailed as e:
        _session.failed.append(_point_name())
        print(f"moe_hydra: {e}", file=sys.stderr, flush=True)
        return None
    loss = results["loss"]
    print(f"moe_hydra: {results['steps']} steps, window {results['window']}: step {results['step_time_ms']:.1f} ms, "
          f"{results['tokens_per_s_per_gpu']:.1f} tokens/s/GPU, {results['tflops_per_gpu']:.4f} TFLOP/s/GPU, "
          f"loss {loss['first']:.3f} -> {loss['last']:.3f}  ({out_dir / 'results.json'})", flush=True)
    return results


@hydra.main(config_path=str(cli.CONF_DIR), config_name="config", version_base="1.3")
def _hydra_app(cfg: DictConfig) -> None:
    run_point(cfg)


def main() -> None:
    register_configs()
    sys.argv[1:] = cli.normalize(sys.argv[1:])
    problems = cli.check_overrides(sys.argv[1:])
    if problems:
        print("moe_hydra: " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(EXIT_INVALID)
    _hydra_app()
    bad = _session.invalid + _session.failed
    if bad and _session.points > 1:
        print(f"moe_hydra: {len(bad)} of {_session.points} points did not complete:\n  " + "\n  ".join(
            [f"{p} (refused)" for p in _session.invalid] + [f"{p} (failed)" for p in _session.failed]), file=sys.stderr)
    if _session.failed:
        sys.exit(EXIT_FAILED)
    if _session.invalid:
        sys.exit(EXIT_INVALID)
