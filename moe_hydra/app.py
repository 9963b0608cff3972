"""``python -m moe_hydra``: compose -> validate -> plan -> (stage=run) launch the job.

Bad input ends here with one message that names the override to change, exit code 2, no
traceback, and nothing launched. In a multirun, invalid points are reported and skipped, the valid
ones proceed, and the command exits 2 at the end if any point was invalid.
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

EXIT_INVALID = 2


@dataclass
class _Session:
    """Outcomes of the points this process ran (one, or every point of a local multirun)."""

    invalid: list[str] = field(default_factory=list)
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
        _report_invalid(e.report())
        return None
    plan.write_json(p, out_dir / "plan.json")
    from rich.console import Console

    Console().print(plan.render(p))
    log.info("plan written to %s", out_dir / "plan.json")
    if obj.stage is Stage.run:
        _report_invalid(
            "stage=run: the Megatron-Core training job is not built yet; use stage=plan "
            "(the plan above is valid)."
        )
    return p


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
    if _session.invalid:
        if _session.points > 1:
            print(f"moe_hydra: {len(_session.invalid)} of {_session.points} points were not run:\n  "
                  + "\n  ".join(_session.invalid), file=sys.stderr)
        sys.exit(EXIT_INVALID)
