"""The local launcher: check this machine, then start one process per rank on it.

:func:`implementation` detects what the job will build here (Transformer Engine or not, ...) for the
resolved plan of ``stage=run``; :func:`machine` is the job's own check of the machine that runs it (plans
are made anywhere): GPUs present, cores enough, DeepEP/HybridEP/Transformer Engine installed when the
config needs them, each refusal a violation with an id (H01..H07). Both run before any process starts.
:func:`launch_local` starts ``world_size`` ranks with torch's elastic launcher (c10d rendezvous on localhost,
spawn), rank 0's output on the console and the other ranks' output in ``<job dir>/ranks/``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import uuid
from pathlib import Path
from typing import Any

from moe_hydra.core.resolved import Implementation, Resolved
from moe_hydra.core.violations import V, Violation


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - no driver or library: no GPU
        return 0


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


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
    cfg, out = r.cfg, []
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
                     "machine; an ImportError is an environment limit, not performance data", "dispatcher=alltoall",
                     dispatcher__name=d.name))
    if d.moe_token_dispatcher_type == "flex" and d.moe_flex_dispatcher_backend == "hybridep" and not _has_hybrid_ep():
        out.append(V("H05", "dispatcher=hybridep needs HybridEP (deep_ep.HybridEPBuffer), which is not installed on "
                     "this machine", "dispatcher=alltoall", dispatcher__name=d.name))
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
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobFailed(RuntimeError):
    """A rank of the job failed; ``rank``, ``error`` and ``logs`` say which, what and where."""

    def __init__(self, rank: int | None, error: str, logs: Path):
        self.rank, self.error, self.logs = rank, error, logs
        super().__init__(f"the job failed on rank {rank}: {error}\n  per-rank logs: {logs}")


class JobStopped(RuntimeError):
    """A signal stopped the job; its ranks recorded what they measured. ``code``: 128 + the signal's number."""

    def __init__(self, signame: str, logs: Path):
        self.signame, self.code = signame, 128 + signal.Signals[signame].value
        super().__init__(f"the job was stopped by {signame}\n  per-rank logs: {logs}")


def launch_local(spec: dict[str, Any], world_size: int, out_dir: Path) -> dict[str, Any]:
    """Run ``moe_hydra.job.train.worker(spec)`` on ``world_size`` local processes; rank 0's results.

    A signal to this process (SIGINT, SIGTERM, SIGUSR2) reaches the ranks through torch's elastic agent, which
    forwards it before it ends them; the ranks finish their step and record it (:mod:`moe_hydra.job.train`).

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
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=0, start_method="spawn",
        # rank 0 writes to this console (progress bar, metric lines); the others to <job dir>/ranks/
        logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects={r: Std.ALL if r else Std.NONE for r in range(world_size)}),
    )

    def forward(signum: int, frame) -> None:  # as the agent's own SIGTERM/SIGINT handler: it forwards, then ends
        raise SignalException(f"got {signal.Signals(signum).name}", sigval=signal.Signals(signum))

    previous = signal.signal(signal.SIGUSR2, forward)  # Slurm's and submitit's warning; torch leaves it out
    try:
        returns = elastic_launch(config, worker)(spec)
    except SignalException as e:
        raise JobStopped(signal.Signals(e.sigval).name, logs) from None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
        stopped = re.search(r"Stopped: stopped by (SIG\w+)", message)
        if stopped:
            raise JobStopped(stopped.group(1), logs) from None
        raise JobFailed(rank, message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}",
                        logs) from None
    finally:
        signal.signal(signal.SIGUSR2, previous)
    return returns[0]
