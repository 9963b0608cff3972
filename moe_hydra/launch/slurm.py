"""``launcher=slurm``: each sweep point a Slurm job through hydra-submitit-launcher, one task per rank.

moe_hydra's launcher extends hydra-submitit-launcher's ``SlurmLauncher`` where that one falls short
(docs/slurm.md):

- every point is validated in the submitting process, so an invalid point is refused before it is
  queued and the valid ones still go;
- points of an earlier launch into the same sweep directory that left a complete ``results.json``
  are kept, not launched again (re-run the same command with ``hydra.sweep.dir=<that dir>``);
- it waits for *every* job, then reports each with its real Slurm state and the tail of its error
  (never "completed" for a job that raised, timed out or was cancelled), writes ``sweep.json`` and
  prints a table; the command exits non-zero when a point did not complete;
- the config schema adds ``srun_args``, missing from the 1.2.0 PyPI release;
- a point with ``profile.tool=nsys`` runs each task under ``nsys profile`` (:func:`nsys_python`): submitit's
  ``python`` command, which the job script's ``srun`` line starts, becomes ``nsys profile <options> python``.

On the compute node each Slurm task runs the Hydra job once; :func:`task_environment` turns Slurm's
variables into torch.distributed's (submitit's ``TorchDistributedEnvironment``).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
from omegaconf import OmegaConf, open_dict

from moe_hydra.core import io
from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import Stage, typed
from moe_hydra.core.violations import LayoutError
from moe_hydra.launch import local
from moe_hydra.launch import state as sweep

log = logging.getLogger("moe_hydra")


@dataclass
class MoeSlurmQueueConf(SlurmQueueConf):
    """hydra-submitit-launcher's Slurm schema, with moe_hydra's launcher and ``srun_args``."""

    _target_: str = "hydra_plugins.moe_hydra_launcher.SlurmLauncher"
    # Extra srun arguments, e.g. [--container-image=...] (absent from hydra-submitit-launcher 1.2.0).
    srun_args: Optional[List[str]] = None


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="hydra/launcher", name="moe_hydra_slurm", node=MoeSlurmQueueConf,
                                 provider="moe_hydra")
    for name, fn in (("moe_hydra.rank0_only", _rank0_only), ("moe_hydra.rank_suffix", _rank_suffix)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def slurm_rank() -> int | None:
    """This process's Slurm task rank inside a submitit Slurm job, else None."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or "SLURM_PROCID" not in os.environ:
        return None
    return int(os.environ["SLURM_PROCID"])


def _rank0_only(value: Any) -> Any:
    """Resolver: ``value`` on rank 0 (and outside Slurm), null on the other ranks."""
    return value if not slurm_rank() else None


def _rank_suffix() -> str:
    """Resolver: '' on rank 0 (and outside Slurm), '.rank<N>' on the other ranks."""
    rank = slurm_rank()
    return f".rank{rank}" if rank else ""


def task_environment() -> None:
    """Export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT from Slurm's."""
    import submitit

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def nsys_python(point_dir: Path) -> str:
    """submitit's ``python`` command for a point profiled with Nsight Systems: ``nsys profile <options>
    <this python>``, so the job script's ``srun ... <python> -u -m submitit.core._submit`` runs every task
    under nsys (:func:`moe_hydra.launch.local.nsys_command`; a task's rank is ``SLURM_PROCID`` when nsys
    starts, which names its report ``<point dir>/profile/nsys.rank<N>.nsys-rep``)."""
    argv = [*local.nsys_command(point_dir, rank_var="SLURM_PROCID"), sys.executable]
    return " ".join(shlex.quote(a) for a in argv)


def nsys_setup(point_dir: Path) -> list[str]:
    """Job-script lines before ``srun`` for a point profiled with Nsight Systems (after ``launcher.setup``, which
    may load it): the node must have ``nsys`` on PATH, else the job ends at once with the machine check's
    message in the point's error (``H08``; srun would only say that it cannot execute ``nsys``); and the
    reports' directory exists."""
    return [
        ('command -v nsys >/dev/null || { echo "moe_hydra: [H08] profile.tool=nsys needs Nsight Systems (nsys) on '
         'PATH; it is not on $(hostname). fix: profile.tool=torch, or put nsys on PATH with launcher.setup" >&2; '
         'exit 2; }'),
        f"mkdir -p {shlex.quote(str(Path(point_dir) / local.NSYS_DIR))}",
    ]


class SlurmLauncherImpl(_SubmititSlurmLauncher):
    """The launcher's logic; Hydra instantiates ``hydra_plugins.moe_hydra_launcher.SlurmLauncher``."""

    def _point_config(self, overrides: list[str], num: int):
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = num
        return cfg

    @staticmethod
    def point_params(cfg, job_cfg, point_dir: Path) -> dict[str, Any]:
        """A point's executor parameters (:meth:`_executor`): its own ``hydra.launcher`` (resources), and for
        ``profile.tool=nsys`` the command for python and the lines after ``launcher.setup`` (:func:`nsys_python`,
        :func:`nsys_setup`); the reports' directory is in them, so such a point is a job of its own."""
        params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        params.pop("_target_", None)
        if local.uses_nsys(job_cfg):
            params["python"], params["setup_after"] = nsys_python(point_dir), nsys_setup(point_dir)
        return params

    def _executor(self, params: dict[str, Any]):
        import submitit

        params = dict(params)
        lc = self.config.launcher
        # the point's own command for python and the lines after launcher.setup (profile.tool=nsys: nsys_python)
        python, setup_after = params.pop("python", None), params.pop("setup_after", None) or []
        # a rank that dies takes the others down instead of leaving them waiting in a collective
        params["srun_args"] = ["--kill-on-bad-exit=1", *(params.get("srun_args") or []), *lc.srun_args]
        params["setup"] = [*(params.get("setup") or []), *lc.setup, *setup_after] or None
        params["additional_parameters"] = {**(params.get("additional_parameters") or {}),
                                           **OmegaConf.to_container(lc.additional_parameters)}
        executor = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                                         slurm_max_num_timeout=params.pop("max_num_timeout"),
                                         **({"slurm_python": python} if python else {}))
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                      if v is not None or k in base})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from moe_hydra.core.io import write_json
        from moe_hydra.planning import plan, rules

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        points, configs, submit = [], [], []
        earlier = {e["num"]: e for e in (io.read_json(sweep_dir / "sweep.json") or {"points": []})["points"]}
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            cfg = self._point_config(list(overrides), num)
            point_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
            p = sweep.Point(num=num, overrides=list(filter_overrides(overrides)), dir=str(point_dir))
            points.append(p)
            configs.append(cfg)
            kept = sweep.complete_results(point_dir)
            if kept:
                p.state = "KEPT"
                sweep.fill_from_results(p, kept)
                p.slurm_job_id = earlier.get(num, {}).get("slurm_job_id")
                p.logs = earlier.get(num, {}).get("logs", [])
                log.info("\t#%d : %s -> kept (complete results.json)", num, " ".join(p.overrides))
                continue
            job_cfg = typed(cfg)
            try:  # the node is not this machine: its own check runs in the job (moe_hydra.app)
                r = resolve(job_cfg)
                violations = plan.run_violations(r) if job_cfg.stage is Stage.run else rules.check(r)
            except LayoutError as e:
                violations = e.violations
            if violations:
                refusal = LayoutError(violations, " ".join(p.overrides))
                p.state, p.error = "INVALID", refusal.report()
                write_json(refusal.record(), point_dir / "violations.json")
                log.info("\t#%d : %s -> refused:\n%s", num, " ".join(p.overrides), p.error)
                continue
            log.info("\t#%d : %s", num, " ".join(p.overrides))
            # Resources come from each point's own config: a sweep over hardware.devices_per_node or
            # launcher.timeout_min gives each point its own tasks and time (one job array per set).
            params = self.point_params(cfg, job_cfg, point_dir)
            key = json.dumps(params, sort_keys=True)
            submit.append((key, p, (list(overrides), "hydra.sweep.dir", num, f"job_id_for_{num}",
                                    Singleton.get_state())))
        submitted = []
        for key in dict.fromkeys(k for k, _, _ in submit):
            group = [(p, args) for k, p, args in submit if k == key]
            log.info("Submitting %d point(s) to Slurm; sweep dir %s", len(group), sweep_dir)
            jobs = self._executor(json.loads(key)).map_array(self, *zip(*(args for _, args in group)))
            for (p, _), job in zip(group, jobs):
                p.slurm_job_id = job.job_id
                p.logs = [str(job.paths.stdout), str(job.paths.stderr)]
                submitted.append((p, job))
        self._wait([job for _, job in submitted])
        for p, job in submitted:
            self._settle(p, job)
        sweep.write_sweep(sweep_dir, self._merge_earlier(sweep_dir, points))
        self._report(points, sweep_dir)
        returns = [sweep.job_return(p.overrides, p.state, p.error, p.dir) for p in points]
        for cfg, ret in zip(configs, returns):  # the app reads the outcomes as Hydra callbacks get them
            self.hydra_context.callbacks.on_job_end(config=cfg, job_return=ret)
        return returns

    @staticmethod
    def _wait(jobs) -> None:
        """Wait for every job (not only until the first failure)."""
        while not all(job.done() for job in jobs):
            time.sleep(1.0)

    @staticmethod
    def _final_state(job, patience_s: float = 30.0) -> str:
        """Slurm's state once it has settled: accounting can lag a job that finished moments ago."""
        deadline = time.monotonic() + patience_s
        while True:
            state = (job.get_info(mode="force").get("State") or "UNKNOWN").split()[0]
            if state not in sweep.ACTIVE_STATES or time.monotonic() > deadline:
                return "UNKNOWN" if state in sweep.ACTIVE_STATES else state
            time.sleep(1.0)

    @staticmethod
    def _settle(p: sweep.Point, job) -> None:
        """The point's state from its results.json (read through its schema), submitit's report and Slurm's
        accounting. A run a signal stopped (SIGUSR2 before the time limit or a preemption, SIGTERM on scancel) is
        INTERRUPTED / TERMINATED with the steps it measured, unless Slurm has a word of its own for the ending
        (CANCELLED, TIMEOUT, PREEMPTED, ...), which stays."""
        read = sweep.point_results(Path(p.dir))
        res = sweep.complete(read[0])
        state = SlurmLauncherImpl._final_state(job)
        error = None
        try:
            outcome = job.results()[0]
            if outcome.status is JobStatus.FAILED:
                error = f"{type(outcome._return_value).__name__}: {outcome._return_value}"
        except Exception as e:  # noqa: BLE001 - submitit's own report of a job that did not return
            error = str(e)
        if res and not error:
            p.state = "COMPLETED"
            sweep.fill_from_results(p, res)
            return
        if "timed-out" in (error or ""):
            state = "TIMEOUT"  # submitit caught Slurm's USR2 near the limit and could not requeue
        p.state = state if state not in ("COMPLETED", "UNKNOWN") else "FAILED"
        told = sweep.results_outcome(read)  # what the run wrote of its ending
        if told:
            told_state, error = told
            if p.state == "FAILED":
                p.state = told_state
        p.error = (error or "") + ("\n--- stderr tail ---\n" + sweep.tail(Path(p.logs[1])) if p.logs else "")

    @staticmethod
    def _merge_earlier(sweep_dir: Path, points: list[sweep.Point]) -> list[sweep.Point]:
        """Keep the entries of earlier batches of this sweep directory that this launch did not touch."""
        earlier = io.read_json(sweep_dir / "sweep.json") or {"points": []}
        mine = {p.num for p in points}
        return points + [sweep.Point(**e) for e in earlier["points"] if e["num"] not in mine]

    @staticmethod
    def _report(points: list[sweep.Point], sweep_dir: Path) -> None:
        io.console().print(sweep.render(points, f"sweep {sweep_dir}"))
        for p in points:
            if not p.ok and p.state != "INVALID":
                log.error("#%d %s: %s\n%s", p.num, " ".join(p.overrides), p.state, p.error or "")
