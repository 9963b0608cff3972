"""The local launcher: check this machine, then start one process per rank on it.

:func:`preflight` is the job's own check of the machine that runs it (plans are made anywhere):
GPUs present, cores enough, DeepEP/HybridEP/Transformer Engine installed when the config needs
them. It runs before any process starts. :func:`launch_local` starts ``world_size`` ranks with
torch's elastic launcher (c10d rendezvous on localhost, spawn), rank 0's output on the console and
the other ranks' output in ``<job dir>/ranks/``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import uuid
from pathlib import Path
from typing import Any


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


def preflight(cfg: Any, inside_allocation: bool = False) -> list[str]:
    """What stops this config from running on this machine (empty when nothing does).

    ``inside_allocation``: checked by a task of a cluster job, whose cores the scheduler sized.
    """
    problems = []
    hw = cfg.hardware
    if cfg.launcher.name == "local" and hw.nodes > 1:
        problems.append(f"launcher=local runs on this one machine; hardware.nodes={hw.nodes} needs a cluster launcher "
                        "(or hardware.nodes=1)")
    if hw.arch == "cpu" and not inside_allocation:
        cores = os.cpu_count() or 1
        if hw.devices_per_node > cores:
            problems.append(f"hardware.devices_per_node={hw.devices_per_node} processes need as many cores; this machine "
                            f"has {cores} (hardware.devices_per_node<={cores})")
    elif hw.arch != "cpu":
        gpus = _gpu_count()
        if gpus < hw.devices_per_node:
            problems.append(f"hardware={hw.name} runs {hw.devices_per_node} GPUs per node; this machine has {gpus} "
                            "(plan it with stage=plan, or run here with hardware=local_cpu)")
    d = cfg.dispatcher
    if d.moe_token_dispatcher_type == "flex" and d.moe_flex_dispatcher_backend == "deepep" and not _has("deep_ep"):
        problems.append("dispatcher=deepep needs DeepEP (the deep_ep package), which is not installed on this machine; "
                        "an ImportError is an environment limit, not performance data (dispatcher=alltoall runs here)")
    if d.moe_token_dispatcher_type == "flex" and d.moe_flex_dispatcher_backend == "hybridep" and not _has_hybrid_ep():
        problems.append("dispatcher=hybridep needs HybridEP (deep_ep.HybridEPBuffer), which is not installed on this "
                        "machine (dispatcher=alltoall runs here)")
    te = _has("transformer_engine")
    if (cfg.precision.fp8 or cfg.precision.fp4) and not te:
        problems.append(f"precision={cfg.precision.name} needs Transformer Engine, which is not installed here "
                        "(precision=bf16)")
    if cfg.kernels.cuda_graph_impl == "transformer_engine" and not te:
        problems.append("kernels.cuda_graph_impl=transformer_engine needs Transformer Engine (kernels.cuda_graph_impl=none)")
    if cfg.kernels.moe_grouped_gemm and hw.arch != "cpu" and not (te or _has("grouped_gemm")):
        problems.append("kernels.moe_grouped_gemm=true needs Transformer Engine or the grouped_gemm package "
                        "(kernels.moe_grouped_gemm=false)")
    if cfg.parallel.context_parallel_size > 1:
        problems.append("the job does not split sequences over context-parallel ranks yet "
                        "(parallel.context_parallel_size=1); stage=plan handles CP")
    return problems


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobFailed(RuntimeError):
    """A rank of the job failed; ``rank``, ``error`` and ``logs`` say which, what and where."""

    def __init__(self, rank: int | None, error: str, logs: Path):
        self.rank, self.error, self.logs = rank, error, logs
        super().__init__(f"the job failed on rank {rank}: {error}\n  per-rank logs: {logs}")


def launch_local(spec: dict[str, Any], world_size: int, out_dir: Path) -> dict[str, Any]:
    """Run ``moe_hydra.job.worker(spec)`` on ``world_size`` local processes; rank 0's results."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
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
    try:
        returns = elastic_launch(config, worker)(spec)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
        raise JobFailed(rank, message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}",
                        logs) from None
    return returns[0]
