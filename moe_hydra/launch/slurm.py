"""``launcher=slurm``: each sweep point a Slurm job through hydra-submitit-launcher, one task per rank.

moe_hydra's launcher extends hydra-submitit-launcher's ``SlurmLauncher`` where that one falls short
(docs/slurm.md):

- every point is validated in the submitting process, so an invalid point is refused before it is
  queued and the valid ones still go;
- points of an earlier launch into the same sweep directory that left a complete ``results.json``
  are kept, and points an earlier launch queued that are still queued or running stay as they are: neither
  is launched again (re-run the same command with ``hydra.sweep.dir=<that dir>``);
- ``sweep.json`` is written as soon as the points are queued (their Slurm job ids, overrides, submission
  time): ``launcher.detach=true`` returns there, with the commands that follow the campaign
  (``python -m moe_hydra.sweep status|wait|cancel``); attached (the default) it waits for *every* job at
  submitit's pace, then reports each with its real Slurm state and the tail of its error (never "completed"
  for a job that raised, timed out or was cancelled) and exits non-zero when a point did not complete;
- a point that reaches its time limit (``launcher.max_num_timeout``) or is preempted is requeued through
  submitit's checkpoint; every attempt measures from scratch and ``attempts.json`` / ``results.json``
  record them;
- the environment of the hardware preset (``hardware.env``) is exported in the job script, containers
  go through pyxis (``launcher.container_*`` -> ``srun --container-*``), and the config schema adds
  ``srun_args``, missing from the 1.2.0 PyPI release;
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
import signal
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra.experimental.callback import Callback
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from moe_hydra.core import env
from moe_hydra.core.errors import signal_exit
from moe_hydra.core.io import utc_now
from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import Stage, typed
from moe_hydra.core.violations import LayoutError, V, Violation
from moe_hydra.launch import attempts, follow, ledger, local, outcome, progress

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


# The rendezvous ports a job may take: below Linux's default ephemeral range (32768-60999), which the kernel hands
# to outgoing connections
RENDEZVOUS_PORTS = (20000, 32768)


def rendezvous_port(job_id: str) -> int:
    """MASTER_PORT for a Slurm job: every task of the job derives the same one from its job id (an array task's
    ``<array id>_<index>``, so concurrent points differ), in :data:`RENDEZVOUS_PORTS`. submitit draws it from
    20000-60000, mostly the ephemeral range: on a busy node an outgoing connection may already hold it, and
    the job fails at the rendezvous with EADDRINUSE."""
    first, end = RENDEZVOUS_PORTS
    return first + zlib.crc32(job_id.encode()) % (end - first)


def task_environment() -> None:
    """Export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT from Slurm's (submitit's
    ``TorchDistributedEnvironment``); MASTER_PORT the job's :func:`rendezvous_port` unless the job's environment
    sets one (``launcher.setup``)."""
    import submitit

    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(rendezvous_port(submitit.JobEnvironment().job_id))
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def nsys_python(point_dir: Path, python: str | None = None) -> str:
    """submitit's ``python`` command for a point profiled with Nsight Systems: ``nsys profile <options>
    <python>`` (``python``: a shell command, ``launcher.python``; None: this Python), so the job script's
    ``srun ... <python> -u -m submitit.core._submit`` runs every task under nsys
    (:func:`moe_hydra.launch.local.nsys_command`; a task's rank is ``SLURM_PROCID`` when nsys starts, which names
    its report ``<point dir>/profile/nsys.rank<N>.nsys-rep``)."""
    nsys = " ".join(shlex.quote(a) for a in local.nsys_command(point_dir, rank_var="SLURM_PROCID"))
    return f"{nsys} {python or shlex.quote(sys.executable)}"


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


# pyxis's srun options (https://github.com/NVIDIA/pyxis): launcher field -> option; booleans take --no- (or the
# named opposite) when false
CONTAINER_VALUES = (("container_image", "--container-image"), ("container_workdir", "--container-workdir"),
                    ("container_name", "--container-name"))
CONTAINER_FLAGS = (("container_mount_home", "--container-mount-home", "--no-container-mount-home"),
                   ("container_remap_root", "--container-remap-root", "--no-container-remap-root"),
                   ("container_writable", "--container-writable", "--container-readonly"))


def container_args(lc: Any, sweep_dir: Path | None = None) -> list[str]:
    """The ``srun --container-*`` arguments of ``launcher.container_*`` (pyxis/enroot); none without an image. The
    sweep directory (submitit's folder, the points' outputs) is mounted at its own path unless a mount holds it."""
    if not lc.container_image:
        return []
    args = [f"{opt}={getattr(lc, key)}" for key, opt in CONTAINER_VALUES if getattr(lc, key)]
    mounts = list(lc.container_mounts)
    if sweep_dir is not None:
        here = Path(sweep_dir).resolve()
        sources = [Path(m.split(":")[0]).resolve() for m in mounts if m]
        if not any(here == src or src in here.parents for src in sources):
            mounts.append(f"{here}:{here}")
    if mounts:
        args.append(f"--container-mounts={','.join(mounts)}")
    if lc.container_env:
        args.append(f"--container-env={','.join(lc.container_env)}")
    args += [on if getattr(lc, key) else off for key, on, off in CONTAINER_FLAGS if getattr(lc, key) is not None]
    return args


def env_exports(env: Dict[str, str]) -> list[str]:
    """Job-script lines that export the hardware preset's environment (``hardware.env``) for every task."""
    return [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]


def launcher_violations(cfg: Any) -> list[Violation]:
    """S03: launcher settings that cannot go together: a container option without ``launcher.container_image``,
    a malformed container mount, an environment variable name that is not one."""
    lc, out = cfg.launcher, []
    if not lc.container_image:
        set_ = [k for k, _ in CONTAINER_VALUES[1:] if getattr(lc, k)] + [k for k in ("container_mounts",
                                                                                    "container_env") if getattr(lc, k)]
        set_ += [k for k, _, _ in CONTAINER_FLAGS if getattr(lc, k) is not None]
        out += [V("S03", f"launcher.{k} is set without launcher.container_image: there is no container to apply it to",
                  f"launcher.container_image=<image>, or ~launcher.{k}", **{f"launcher__{k}": getattr(lc, k)})
                for k in set_]
    for m in lc.container_mounts:
        parts = str(m).split(":")
        if not (2 <= len(parts) <= 3 and parts[0] and parts[1]):
            out.append(V("S03", f"launcher.container_mounts entry {m!r} is not SRC:DST[:FLAGS]",
                         "launcher.container_mounts=[/src:/dst]", launcher__container_mounts=list(lc.container_mounts)))
    bad = [k for k in cfg.hardware.env if not k.replace("_", "a").isalnum() or k[0].isdigit()]
    out += [V("S03", f"hardware.env key {k!r} is not an environment variable name", f"~hardware.env.{k}",
              hardware__env=dict(cfg.hardware.env)) for k in bad]
    return out


def env_notes(cfg: Any, layout: Any) -> list[str]:
    """Warnings about the preset environment against this point's layout (HybridEP's ranks per NVLink domain)."""
    preset, notes = cfg.hardware.env, []
    backend = getattr(cfg.dispatcher, "moe_flex_dispatcher_backend", None)
    if backend == "hybridep" and "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN" in preset:
        want = min(layout.ep, cfg.hardware.nvlink_domain_size)
        if str(preset["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"]) != str(want):
            notes.append(f"hardware.env.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN="
                         f"{preset['NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN']}, but EP {layout.ep} in an NVLink domain "
                         f"of {cfg.hardware.nvlink_domain_size} puts {want} EP ranks in a domain: set "
                         f"hardware.env.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN={want}")
    return notes


class PresetEnvironment(Callback):
    """Hydra callback (``hydra.callbacks.environment``, conf/launcher/*.yaml): the point's ``hardware.env`` is set in
    the process that runs it from the start of the job to its end, on this machine (launcher=local: the ranks it
    starts inherit it) and in every Slurm task, before moe_hydra's environment snapshot (env.json, the contract)."""

    def __init__(self) -> None:
        self._previous: list[dict[str, str | None]] = []

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        preset = OmegaConf.select(config, "hardware.env", default=None)
        values = OmegaConf.to_container(preset, resolve=True) if preset is not None else {}
        self._previous.append(env.apply(values or {}))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self._previous:
            env.restore(self._previous.pop())


def _validation_key(cfg: DictConfig) -> str | None:
    """What a point's validation depends on: its resolved config but for ``hydra`` and the ``repeat`` index (points
    that differ only there are validated once); None when it cannot be resolved here."""
    try:
        plain = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
                 for k in cfg if k not in ("hydra", "repeat")}
        return json.dumps(plain, sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 - validated on its own, which reports what does not resolve
        return None


STOP_USR2 = 128 + signal.SIGUSR2  # the job's exit code after a SIGUSR2 stopped it (moe_hydra.job.train.Stopped)


class SlurmLauncherImpl(_SubmititSlurmLauncher):
    """The launcher's logic; Hydra instantiates ``hydra_plugins.moe_hydra_launcher.SlurmLauncher``."""

    # ------------------------------------------------------------------ on the node

    def __call__(self, sweep_overrides: List[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: Dict[type, Singleton], point_dir: str | None = None) -> JobReturn:
        """One Slurm task of a point (submitit calls this on the node). Rank 0 records the attempt in
        ``attempts.json`` and, when it ends, in results.json. A run that SIGUSR2 stopped (Slurm's warning before
        the time limit, or a preemption) has recorded what it measured; then submitit's own handler decides, as it
        would have had the signal come outside the run: requeue through :meth:`checkpoint` (the next attempt
        measures from scratch), or end the point ("timed-out too many times": ``launcher.max_num_timeout``)."""
        rank = slurm_rank() or 0
        if rank == 0 and point_dir:
            attempts.attempt_started(Path(point_dir))
        try:
            ret = super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        except SystemExit as e:
            if e.code == STOP_USR2:
                self._after_usr2(rank, point_dir)
            elif rank == 0 and point_dir:
                attempts.attempt_ended(Path(point_dir), f"exit {e.code}")
                attempts.record_attempts_in_results(Path(point_dir))
            raise
        except BaseException as e:
            if rank == 0 and point_dir:
                attempts.attempt_ended(Path(point_dir), f"{type(e).__name__}: {e}", requeued=False)
                attempts.record_attempts_in_results(Path(point_dir))
            raise
        if rank == 0 and point_dir:
            attempts.attempt_ended(Path(point_dir), "completed", requeued=False)
            attempts.record_attempts_in_results(Path(point_dir))
        return ret

    @staticmethod
    def _after_usr2(rank: int, point_dir: str | None) -> None:
        """The run stopped on SIGUSR2 and wrote its results: hand the signal to submitit's handler (the job's own
        handler gave it back when the run ended). Rank 0 checkpoints and requeues (exits), or raises submitit's
        "not requeued" error, which becomes the point's TIMEOUT; the other ranks end quietly, so that srun's
        --kill-on-bad-exit does not take rank 0 down before it has requeued."""
        handler = signal.getsignal(signal.SIGUSR2)
        if not callable(handler):  # not under submitit's handler: nothing requeues the point
            if rank == 0 and point_dir:
                attempts.attempt_ended(Path(point_dir), "stopped by SIGUSR2", requeued=False)
                attempts.record_attempts_in_results(Path(point_dir))
            return
        if rank != 0:
            raise SystemExit(0)
        requeued = None
        try:
            handler(signal.SIGUSR2, None)
        except SystemExit:
            requeued = True
            raise
        except BaseException:
            requeued = False
            raise
        finally:
            if point_dir:
                attempts.attempt_ended(Path(point_dir), "stopped by SIGUSR2", requeued=requeued)
                attempts.record_attempts_in_results(Path(point_dir))

    # ------------------------------------------------------------------ in the submitting process

    def _point_config(self, overrides: list[str], num: int):
        from moe_hydra.launch import points

        cfg = points.composed(self.config, overrides)
        if cfg is None:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = num
        return cfg

    @staticmethod
    def point_params(cfg, job_cfg, point_dir: Path, sweep_dir: Path | None = None) -> dict[str, Any]:
        """A point's executor parameters (:meth:`_executor`): its own ``hydra.launcher`` (resources), its
        ``launcher.python`` and container (``srun --container-*``), the export of ``hardware.env``, and for
        ``profile.tool=nsys`` the command for python and the lines after ``launcher.setup`` (:func:`nsys_python`,
        :func:`nsys_setup`); the reports' directory is in them, so such a point is a job of its own."""
        params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        params.pop("_target_", None)
        lc = job_cfg.launcher
        if local.uses_nsys(job_cfg):
            params["python"], params["setup_after"] = nsys_python(point_dir, lc.python), nsys_setup(point_dir)
        elif lc.python:
            params["python"] = lc.python
        params["srun_args"] = [*(params.get("srun_args") or []), *container_args(lc, sweep_dir)]
        params["setup_env"] = env_exports(job_cfg.hardware.env)
        return params

    def _executor(self, params: dict[str, Any]):
        import submitit

        params = dict(params)
        lc = self.config.launcher
        # the point's own command for python and the lines after launcher.setup (profile.tool=nsys: nsys_python)
        python, setup_after = params.pop("python", None), params.pop("setup_after", None) or []
        setup_env = params.pop("setup_env", None) or []
        # a rank that dies takes the others down instead of leaving them waiting in a collective
        params["srun_args"] = ["--kill-on-bad-exit=1", *(params.get("srun_args") or []), *lc.srun_args]
        params["setup"] = [*(params.get("setup") or []), *lc.setup, *setup_env, *setup_after] or None
        # requeueable: submitit's requeue (time limit, preemption) and Slurm's own (node failure) need it, unless
        # the site says no-requeue
        extra = {**(params.get("additional_parameters") or {}), **OmegaConf.to_container(lc.additional_parameters)}
        requeue = {} if {"no-requeue", "no_requeue", "requeue"} & set(extra) else {"requeue": True}
        params["additional_parameters"] = {**requeue, **extra}
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

        t0 = time.monotonic()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        detach = bool(OmegaConf.select(self.config, "launcher.detach", default=False))
        points, configs, submit = [], [], []
        earlier = {e["num"]: e for e in (ledger.read_sweep(sweep_dir) or {"points": []})["points"]}
        live = self._still_out(earlier)
        validated: dict[str, tuple] = {}
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            cfg = self._point_config(list(overrides), num)
            point_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
            p = ledger.Point(num=num, overrides=list(filter_overrides(overrides)), dir=str(point_dir))
            configs.append(cfg)
            kept = outcome.complete_results(point_dir)
            if kept:
                p.state = "KEPT"
                ledger.fill_from_results(p, kept)
                p.slurm_job_id = earlier.get(num, {}).get("slurm_job_id")
                p.submitit_folder = earlier.get(num, {}).get("submitit_folder")
                p.logs = earlier.get(num, {}).get("logs", [])
                points.append(p)
                log.info("\t#%d : %s -> kept (complete results.json)", num, " ".join(p.overrides))
                continue
            if num in live and live[num].overrides == p.overrides:
                points.append(live[num])
                log.info("\t#%d : %s -> still %s from an earlier launch (job %s): not queued again", num,
                         " ".join(p.overrides), live[num].state, live[num].slurm_job_id)
                continue
            points.append(p)
            key = _validation_key(cfg)
            if key is None or key not in validated:
                job_cfg = typed(cfg)
                try:  # the node is not this machine: its own check runs in the job (moe_hydra.commands.run)
                    r = resolve(job_cfg)
                    violations = plan.run_violations(r) if job_cfg.stage is Stage.run else rules.check(r)
                except LayoutError as e:
                    r, violations = None, e.violations
                violations = [*violations, *launcher_violations(job_cfg)]
                if key is not None:
                    validated[key] = job_cfg, r, violations
            else:  # the same point but for its repeat index: the same verdict
                job_cfg, r, violations = validated[key]
            if violations:
                refusal = LayoutError(violations, " ".join(p.overrides))
                p.state, p.error = "INVALID", refusal.report()
                write_json(refusal.record(), point_dir / "violations.json")
                log.info("\t#%d : %s -> refused:\n%s", num, " ".join(p.overrides), p.error)
                continue
            for note in env_notes(job_cfg, r.layout):
                log.warning("#%d: %s", num, note)
            log.info("\t#%d : %s", num, " ".join(p.overrides))
            # Resources come from each point's own config: a sweep over hardware.devices_per_node or
            # launcher.timeout_min gives each point its own tasks and time (one job array per set).
            params = self.point_params(cfg, job_cfg, point_dir, sweep_dir)
            key = json.dumps(params, sort_keys=True)
            submit.append((key, p, (list(overrides), "hydra.sweep.dir", num, f"job_id_for_{num}",
                                    Singleton.get_state(), str(point_dir))))
        submitted_at = utc_now()
        for key in dict.fromkeys(k for k, _, _ in submit):
            group = [(p, args) for k, p, args in submit if k == key]
            for p, _ in group:  # attempts of an earlier launch are not this one's
                (Path(p.dir) / attempts.ATTEMPTS_FILE).unlink(missing_ok=True)
            params = json.loads(key)
            folder = params["submitit_folder"]
            log.info("Submitting %d point(s) to Slurm; sweep dir %s", len(group), sweep_dir)
            jobs = self._executor(params).map_array(self, *zip(*(args for _, args in group)))
            for (p, _), job in zip(group, jobs):
                p.slurm_job_id, p.submitit_folder, p.submitted_at = job.job_id, folder, submitted_at
                p.state, p.logs = "PENDING", [str(job.paths.stdout), str(job.paths.stderr)]
        commands = [f"python -m moe_hydra.sweep {c} {shlex.quote(str(sweep_dir))}" for c in ("status", "wait", "cancel")]
        ledger.write_sweep(sweep_dir, self._merge_earlier(sweep_dir, points), detached=detach, follow=commands,
                          **({"submitted_at": submitted_at} if submit else {}))
        queued = [p for p in points if p.active]
        if detach and not queued:
            print("moe_hydra: nothing was queued (every point is refused or kept)", flush=True)
        if detach:
            if queued:
                print(f"moe_hydra: {len(submit)} point(s) queued on Slurm in {time.monotonic() - t0:.1f} s"
                      + (f", {len(queued) - len(submit)} still out from an earlier launch"
                         if len(queued) > len(submit) else "")
                      + f"; sweep.json in {sweep_dir}. Follow the campaign with\n  " + "\n  ".join(commands), flush=True)
            returns = [outcome.job_return(p.overrides, outcome.SUBMITTED if p.active else p.state, p.error, p.dir)
                       for p in points]
        else:
            if queued:
                points = self._wait(sweep_dir, points, commands)
            progress.report(points, f"sweep {sweep_dir}")
            for p in points:
                if not p.ok and p.state != "INVALID":
                    log.error("#%d %s: %s\n%s", p.num, " ".join(p.overrides), p.state, p.error or "")
            returns = [outcome.job_return(p.overrides, p.state, p.error, p.dir) for p in points]
        for cfg, ret in zip(configs, returns):  # the app reads the outcomes as Hydra callbacks get them
            self.hydra_context.callbacks.on_job_end(config=cfg, job_return=ret)
        return returns

    @staticmethod
    def _still_out(earlier: dict[int, dict]) -> dict[int, ledger.Point]:
        """The points an earlier launch into this directory queued that Slurm still holds (one sacct for all)."""
        candidates = [ledger.Point.from_json(e) for e in earlier.values()
                      if e.get("slurm_job_id") and e.get("state") not in follow.FINAL_CACHED]
        if not candidates:
            return {}
        follow.refresh(candidates)
        return {p.num: p for p in candidates if p.active}

    @staticmethod
    def _wait(sweep_dir: Path, points: list[ledger.Point], commands: list[str]) -> list[ledger.Point]:
        """Attached: wait for every point of this launch (at submitit's pace; :func:`moe_hydra.launch.follow.wait`);
        this launch's points, settled. Ctrl-C leaves them to Slurm and says how to follow them."""
        def shown(all_points: list[ledger.Point]) -> None:
            counts: dict[str, int] = {}
            for p in all_points:
                counts[p.state] = counts.get(p.state, 0) + 1
            log.info("sweep %s: %s", sweep_dir, ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))

        try:
            settled = {p.num: p for p in follow.wait(sweep_dir, on_change=shown)}
        except KeyboardInterrupt:
            print("\nmoe_hydra: stopped waiting; the points go on in Slurm. Follow them with\n  " + "\n  ".join(commands),
                  file=sys.stderr, flush=True)
            raise SystemExit(signal_exit("SIGINT")) from None
        return [settled.get(p.num, p) for p in points]

    @staticmethod
    def _merge_earlier(sweep_dir: Path, points: list[ledger.Point]) -> list[ledger.Point]:
        """Keep the entries of earlier batches of this sweep directory that this launch did not touch."""
        earlier = ledger.read_sweep(sweep_dir) or {"points": []}
        mine = {p.num for p in points}
        return points + [ledger.Point.from_json(e) for e in earlier["points"] if e["num"] not in mine]
