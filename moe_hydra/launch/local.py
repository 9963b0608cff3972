"""The local launcher: check this machine, then start one process per rank on it.

:func:`implementation` detects what the job will build here (Transformer Engine or not, ...) for the
resolved plan of ``stage=run``; :func:`machine` is the job's own check of the machine that runs it (plans
are made anywhere): GPUs present, cores enough, DeepEP/HybridEP/Transformer Engine installed when the
config needs them, Nsight Systems when ``profile.tool=nsys``, torch and Megatron-Core themselves (a planner-only
install has neither), each refusal a violation with an id (H01..H09).
Both run before any process starts.
:func:`launch_local` starts ``world_size`` ranks with torch's elastic launcher (c10d rendezvous on localhost,
:func:`run_ranks`), rank 0's output on the console and the other ranks' output in ``<job dir>/ranks/``: forked
from a warm server that has imported torch and Megatron-Core already (:mod:`moe_hydra.job.warm`; on by default
for CPU jobs, ``launcher.warm``, ``MOE_HYDRA_WARM``), else spawned. With ``profile.tool=nsys`` each rank is a
program of its own (``python -m moe_hydra.job.rank``) run under ``nsys profile`` (:func:`nsys_command`), whose
capture range is the profiled steps.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import shutil
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from moe_hydra.core import startup
from moe_hydra.core.errors import Failed, Refused
from moe_hydra.core.resolved import Implementation, Resolved
from moe_hydra.core.violations import V, Violation
from moe_hydra.job import warm


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no driver or library: no GPU
        return 0


def _has(module: str) -> bool:
    """Whether ``module`` is installed, looked up without importing anything (``find_spec`` of a dotted name would
    import its parents: ``megatron`` of ``megatron.core``)."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None or not rest:
        return spec is not None
    paths = [Path(loc, *rest.split(".")) for loc in spec.submodule_search_locations or []]
    return any(p.is_dir() or p.with_suffix(".py").is_file() for p in paths)


# What a job needs on the machine that builds it, beyond a planner-only install (pyproject's train extra)
JOB_PACKAGES = ("torch", "megatron.core")
TRAIN_EXTRA = ("pip install torch==2.13.0 'moe_hydra[train]' for a CPU; in an NGC container its torch and "
               "Megatron-Core stay: pip install --no-deps moe_hydra")


def packages(stage: str = "run") -> list[Violation]:
    """H09: the job's packages (:data:`JOB_PACKAGES`) are not installed here: a planner-only install (looked up,
    not imported: the command stays fast; :func:`importable` imports them where the job starts cold)."""
    missing = [name for name in JOB_PACKAGES if not _has(name)]
    if not missing:
        return []
    return [V("H09", f"this install has no {' and no '.join(missing)}: it plans, searches, launches on Slurm and "
                     f"compares, but builds no model here ({TRAIN_EXTRA})", "stage=plan", stage=stage)]


def importable(who: str = "the job", instead: str = "; stage=plan plans without them") -> None:
    """Import the job's packages in this process (one that starts the ranks cold imports them anyway; so does
    ``data prepare``).

    Raises:
        Refused: one of them fails to import (not installed, broken or shadowed): one line, what to install.
    """
    for name in JOB_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise Refused(f"{name} cannot be imported here ({str(e).strip() or type(e).__name__}): {who} needs torch "
                          f"and Megatron-Core ({TRAIN_EXTRA}){instead}") from None


def _has_hybrid_ep() -> bool:
    if not _has("deep_ep"):
        return False
    try:
        from deep_ep import HybridEPBuffer  # noqa: F401
    except Exception:  # noqa: BLE001 - an import failure is the same answer: not usable here
        return False
    return True


def implementation(cfg: Any) -> Implementation:
    """What the job will build on this machine: Transformer Engine, the grouped_gemm package and Apex are
    looked up (not imported), GPUs counted through NVML."""
    gpu = cfg.hardware.arch != "cpu" and _gpu_count() > 0
    return Implementation.of(cfg, gpu=gpu, te=_has("transformer_engine"), grouped_gemm=_has("grouped_gemm"),
                             apex=_has("apex"), source=f"detected on {socket.gethostname()}")


def machine(r: Resolved, inside_allocation: bool = False) -> list[Violation]:
    """What stops the plan from running on this machine (empty when nothing does): the job's own check of the
    machine that runs it (plans are made anywhere).

    ``inside_allocation``: checked by a task of a cluster job, whose cores the scheduler sized.
    """
    cfg, out = r.cfg, packages(r.cfg.stage.value)
    hw = cfg.hardware
    if cfg.launcher.name == "local" and hw.nodes > 1:
        out.append(V("H01", f"launcher=local runs on this one machine; hardware.nodes={hw.nodes} needs a cluster",
                     "launcher=slurm, or hardware.nodes=1", launcher__name="local", hardware__nodes=hw.nodes))
    if hw.arch == "cpu" and not inside_allocation:
        cores = os.cpu_count() or 1
        if hw.devices_per_node > cores:
            out.append(V("H02", f"hardware.devices_per_node={hw.devices_per_node} processes need as many cores; this "
                         f"machine has {cores}", f"hardware.devices_per_node<={cores}",
                         hardware__devices_per_node=hw.devices_per_node))
    elif hw.arch != "cpu":
        gpus = _gpu_count()
        if gpus < hw.devices_per_node:
            out.append(V("H03", f"hardware={hw.name} runs {hw.devices_per_node} GPUs per node; this machine has {gpus}",
                         "stage=plan to plan it, or hardware=local_cpu to run here",
                         hardware__devices_per_node=hw.devices_per_node))
    d = cfg.dispatcher
    if d.moe_token_dispatcher_type == "flex" and d.moe_flex_dispatcher_backend == "deepep" and not _has("deep_ep"):
        out.append(V("H04", "dispatcher=deepep needs DeepEP (the deep_ep package), which is not installed on this "
                     "machine; an ImportError is an environment limit, not performance data",
                     "dispatcher=alltoall, or stage=plan (to plan it here; the job's machine is checked where it runs)",
                     dispatcher__name=d.name))
    if d.moe_token_dispatcher_type == "flex" and d.moe_flex_dispatcher_backend == "hybridep" and not _has_hybrid_ep():
        out.append(V("H05", "dispatcher=hybridep needs HybridEP (deep_ep.HybridEPBuffer), which is not installed on "
                     "this machine", "dispatcher=alltoall, or stage=plan (to plan it here; the job's machine is "
                     "checked where it runs)", dispatcher__name=d.name))
    te = _has("transformer_engine")
    if (cfg.precision.fp8 or cfg.precision.fp4) and not te:
        out.append(V("H06", f"precision={cfg.precision.name} needs Transformer Engine, which is not installed here",
                     "precision=bf16", precision__name=cfg.precision.name))
    if cfg.kernels.cuda_graph_impl == "transformer_engine" and not te:
        out.append(V("H06", "CUDA graphs through Transformer Engine need Transformer Engine, which is not installed here",
                     "kernels.cuda_graph_impl=none", kernels__cuda_graph_impl="transformer_engine"))
    if cfg.kernels.moe_grouped_gemm and hw.arch != "cpu" and not (te or _has("grouped_gemm")):
        out.append(V("H07", "grouped-GEMM experts need Transformer Engine or the grouped_gemm package",
                     "kernels.moe_grouped_gemm=false", kernels__moe_grouped_gemm=True))
    if uses_nsys(cfg) and shutil.which("nsys") is None:
        out.append(V("H08", "profile.tool=nsys needs Nsight Systems (nsys) on PATH; it is not on this machine",
                     "profile.tool=torch", profile__tool="nsys"))
    return out


NSYS_DIR = "profile"  # <job dir>/profile/nsys.rank<N>.nsys-rep


def uses_nsys(cfg: Any) -> bool:
    """The job profiles with Nsight Systems: each rank runs under ``nsys profile`` (:func:`nsys_command`)."""
    return cfg.profile.name != "none" and cfg.profile.tool == "nsys"


def nsys_command(out_dir: Path, rank_var: str = "RANK") -> list[str]:
    """The ``nsys profile`` argv that a rank's command follows: nothing is collected until the job calls
    ``cudaProfilerStart`` at the first profiled step, and collection stops at its ``cudaProfilerStop`` after the
    last one while the run goes on (moe_hydra.job.profile); one report per rank,
    ``<out_dir>/profile/nsys.rank<N>.nsys-rep``.

    ``rank_var``: the environment variable that holds the rank when nsys starts, which nsys expands in the
    report's name (``%q{VAR}``): ``RANK`` under torch's elastic launcher, ``SLURM_PROCID`` in a Slurm task
    (torch's variables are exported later, by the job itself).

    Options as the Nsight Systems User Guide spells them ("CLI Profile Command Switch Options",
    https://docs.nvidia.com/nsight-systems/UserGuide/index.html#cli-profile-command-switch-options), the
    capture range as NVIDIA's Megatron recipe uses it (``--capture-range=cudaProfilerApi
    --capture-range-end=stop``, https://docs.nvidia.com/nemo/megatron-bridge/latest/training/profiling.html):

    - ``--capture-range=cudaProfilerApi``: collect only between cudaProfilerStart and cudaProfilerStop;
    - ``--capture-range-end=stop``: at the end of the range stop collecting and let the run continue (the
      default, ``stop-shutdown``, would end the application there: the steps after the window and the
      results would be lost);
    - ``--trace=cuda,nvtx,osrt``: CUDA API and kernels, NVTX ranges, OS runtime calls;
    - ``--sample=none``: no CPU IP/backtrace sampling; ``--cuda-memory-usage=false``: no per-allocation
      tracking (both add overhead to the steps measured);
    - ``--force-overwrite=true``: a rerun into the same directory replaces its reports;
    - ``--output=...%q{VAR}``: ``%q{VAR}`` is replaced with the value of the environment variable VAR.
    """
    return ["nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace=cuda,nvtx,osrt", "--sample=none", "--cuda-memory-usage=false", "--force-overwrite=true",
            f"--output={Path(out_dir) / NSYS_DIR}/nsys.rank%q{{{rank_var}}}"]


def rank_wrapper(cfg: Any, out_dir: Path) -> list[str]:
    """The command each local rank runs under (an argv prefix): :func:`nsys_command` for ``profile.tool=nsys``;
    empty otherwise (the ranks run :func:`moe_hydra.job.train.worker` in-process)."""
    return nsys_command(out_dir) if uses_nsys(cfg) else []


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (the OS picks it), for a rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobFailed(Failed):
    """A rank of the job failed; ``rank``, ``error`` and ``logs`` say which, what and where."""

    def __init__(self, rank: int | None, error: str, logs: Path):
        self.rank, self.error, self.logs = rank, error, logs
        where = "" if rank is None else f" on rank {rank}"  # None: no rank's failure is known (a warm start's end)
        super().__init__(f"the job failed{where}: {error}\n  per-rank logs: {logs}")


class JobStopped(RuntimeError):
    """A signal stopped the job; its ranks recorded what they measured. ``code``: 128 + the signal's number."""

    def __init__(self, signame: str, logs: Path):
        self.signame, self.code = signame, 128 + signal.Signals[signame].value
        super().__init__(f"the job was stopped by {signame}\n  per-rank logs: {logs}")


def launch_local(spec: dict[str, Any], world_size: int, out_dir: Path, *,
                 wrapper: list[str] | None = None, warm_start: bool | None = None) -> dict[str, Any]:
    """Run ``moe_hydra.job.train.worker(spec)`` on ``world_size`` local processes; rank 0's results.

    The ranks start warm where they may (:func:`start_warm`): forked from a warm server that has imported torch
    and Megatron-Core already (:mod:`moe_hydra.job.warm`), without this process importing torch; else spawned
    here (:func:`run_ranks`). ``spec["startup"]`` tells rank 0 when this command started and how its ranks did
    (:mod:`moe_hydra.core.startup`), for ``results.json`` ``startup``.

    A signal to this process (SIGINT, SIGTERM, SIGUSR2) reaches the ranks through torch's elastic agent, which
    forwards it before it ends them; the ranks finish their step and record it (:mod:`moe_hydra.job.train`).
    Warm, this process forwards it to the agent (SIGHUP too), which runs in the warm server's process.

    ``wrapper``: an argv prefix each rank runs under; None takes the config's (:func:`rank_wrapper`: ``nsys
    profile ...`` for ``profile.tool=nsys``). With one, each rank is the program ``<wrapper> python -m
    moe_hydra.job.rank <job dir>/ranks/spec.pkl`` (torch's elastic launcher runs binaries too), started cold,
    and rank 0's results are read back from ``<job dir>/results.json``; without one (the default), ``worker``
    runs in the ranks and returns them. ``warm_start``: True or False decides; None asks :func:`start_warm`.

    Raises:
        JobFailed: a rank failed.
        JobStopped: a signal stopped the job, here or in a rank.
    """
    cfg = spec["resolved"].cfg
    origin = startup.origin("spawn")
    if wrapper is None:
        wrapper = rank_wrapper(cfg, out_dir)
    if wrapper:
        importable()
        return run_ranks({**spec, "startup": {**origin, "start": "program"}}, world_size, out_dir, wrapper=wrapper)
    if start_warm(cfg) if warm_start is None else warm_start:
        def call(how: str) -> warm.Call:
            return (__name__, "run_ranks", ({**spec, "startup": {**origin, "start": how}}, world_size, out_dir),
                    {"start_method": "fork"})

        try:
            remote = warm.submit(call)
        except warm.Unavailable as e:
            importable()  # a server that could not import them: the refusal, not its log
            print(f"moe_hydra: starting the ranks cold: {e}", file=sys.stderr, flush=True)
        else:
            try:
                return remote.wait()
            except (warm.Ended, warm.RemoteError) as e:
                raise JobFailed(None, str(e), out_dir / "ranks") from None
    importable()
    return run_ranks({**spec, "startup": origin}, world_size, out_dir)


def start_warm(cfg: Any) -> bool:
    """Whether a local job's ranks start warm: ``MOE_HYDRA_WARM`` (0 or 1) when set, else ``launcher.warm``, else
    on for a CPU job on a machine without GPUs (:func:`moe_hydra.job.warm.wanted`). Never under a wrapper (each rank is
    a program of its own)."""
    return not uses_nsys(cfg) and warm.wanted(cfg.launcher.warm, gpu=cfg.hardware.arch != "cpu")


def run_ranks(spec: dict[str, Any], world_size: int, out_dir: Path, *, wrapper: list[str] | None = None,
              start_method: str = "spawn") -> dict[str, Any]:
    """Start the ranks with torch's elastic launcher (c10d rendezvous on localhost) and wait for them: the part
    of :func:`launch_local` that a cold start runs in the launching process and a warm one in the warm server's
    process (``start_method="fork"``: the ranks are forked from that already-warm process). Rank 0 writes to this
    process's stdout and stderr, the others to ``<job dir>/ranks/``.

    Raises:
        JobFailed: a rank failed.
        JobStopped: a signal stopped the job, here or in a rank.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from moe_hydra.job.train import worker

    logs = out_dir / "ranks"
    if wrapper:  # each rank a program of its own, under the wrapper
        logs.mkdir(parents=True, exist_ok=True)
        (out_dir / NSYS_DIR).mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").unlink(missing_ok=True)  # rank 0 writes it again: nothing stale is read back
        spec_file = logs / "spec.pkl"
        spec_file.write_bytes(pickle.dumps(spec))
        entrypoint: Any = shutil.which(wrapper[0]) or wrapper[0]
        args: tuple = (*wrapper[1:], sys.executable, "-m", "moe_hydra.job.rank", str(spec_file))
    else:
        entrypoint, args = worker, (spec,)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, start_method=start_method,
        # rank 0 writes to this console (progress bar, metric lines); the others to <job dir>/ranks/
        logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects={r: Std.ALL if r else Std.NONE for r in range(world_size)}),
    )

    def forward(signum: int, frame) -> None:  # as the agent's own SIGTERM/SIGINT handler: it forwards, then ends
        raise SignalException(f"got {signal.Signals(signum).name}", sigval=signal.Signals(signum))

    previous = signal.signal(signal.SIGUSR2, forward)  # Slurm's and submitit's warning; torch leaves it out
    try:
        returns = elastic_launch(config, entrypoint)(*args)
    except SignalException as e:
        raise JobStopped(signal.Signals(e.sigval).name, logs) from None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
        stopped = re.search(r"Stopped: stopped by (SIG\w+)", message)
        if stopped:
            raise JobStopped(stopped.group(1), logs) from None
        if wrapper and _stop_signal(failure.exitcode):  # moe_hydra.job.rank exits 128 + the signal's number
            raise JobStopped(_stop_signal(failure.exitcode), logs) from None
        raise JobFailed(rank, message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}",
                        logs) from None
    finally:
        signal.signal(signal.SIGUSR2, previous)
    if not wrapper:
        return returns[0]
    return _rank0_results(out_dir, logs)


def _stop_signal(exitcode: int) -> str | None:
    """The stop signal (:data:`moe_hydra.core.results.SIGNALS`) behind a rank's exit code 128 + N, else None."""
    from moe_hydra.core.results import SIGNALS

    names = {128 + signal.Signals[name].value: name for name in SIGNALS}
    return names.get(exitcode)


# what the caller reads of a complete run (moe_hydra.commands.run._run_job)
NEEDED = ("steps", "window", "step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "loss")


def _rank0_results(out_dir: Path, logs: Path) -> dict[str, Any]:
    """Rank 0's results, read back from ``results.json`` (a rank that is a program returns no Python value),
    through the file's schema (:mod:`moe_hydra.core.results`). A run the file tells failed or stopped raises
    as one the launcher saw: the wrapper need not pass the rank's exit code on."""
    from moe_hydra.core import results as schema

    res, warning = schema.read(out_dir / "results.json", need=NEEDED)
    if res is None:
        raise JobFailed(0, f"no usable results from rank 0: {warning}", logs)
    if res["status"] in schema.STOPPED:
        raise JobStopped(res.get("signal") or "SIGTERM", logs)
    if res["status"] != schema.OK:
        raise JobFailed(0, str(res.get("error") or f"status {res['status']}").strip().splitlines()[-1], logs)
    return res
