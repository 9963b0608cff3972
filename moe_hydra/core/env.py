"""The environment snapshot (``env.json``): what a run ran on, secrets removed.

Versions come from installed distributions' metadata (no imports: planning stays fast); the job adds
what only a running process can see (CUDA/NCCL of the torch build, GPU models, driver). Environment
variables are recorded only when they change performance (NCCL_*, NVTE_*, CUDA_*, TORCH_*, OMP_*,
HybridEP's NUM_OF_*, ...) and any variable whose name looks like a key, token, secret or password is
redacted — in env.json, in the contract and therefore in W&B.

The environment presets (``hardware.env``: what NVIDIA's performance recipes set per GPU kind) are applied to
this process for the life of a job (:func:`apply`, :func:`restore`) before the snapshot is taken, so env.json
and the contract record what the ranks ran with.

Pure apart from reading files, /proc and ``git``: standard library only.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

PERF_ENV = re.compile(
    r"^(NCCL_|NVTE_|CUDA_|CUBLAS_|CUDNN_|TORCH_|PYTORCH_|TORCHINDUCTOR_|OMP_|MKL_|KMP_|GOMP_|NUM_OF_|NVSHMEM_|"
    r"DEEP_EP_|UCX_|FI_|NVLINK_|USE_MNNVL|TRITON_|TILELANG_|MEGATRON_|NVIDIA_|OPENBLAS_|WANDB_MODE$)"
)
SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|PRIVATE)", re.IGNORECASE)
# performance settings whose names only look like secrets (HybridEP's chunk of tokens): recorded as they are
NOT_SECRET = frozenset({"NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", "NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API"})
REDACTED = "<redacted>"
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES",
              "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_PARTITION", "SLURM_CPUS_PER_TASK")
DISTRIBUTIONS = ("torch", "megatron-core", "transformer-engine", "transformer_engine", "deep_ep", "deep-ep",
                 "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-ml-py", "hydra-core", "omegaconf",
                 "hydra-submitit-launcher", "submitit", "wandb", "moe_hydra", "numpy")


def redact(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET.search(k) and k not in NOT_SECRET else v) for k, v in env.items()}


def perf_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The performance-relevant environment variables, secrets redacted."""
    environ = os.environ if environ is None else environ
    return redact({k: v for k, v in sorted(environ.items()) if PERF_ENV.match(k)})


def wandb_mode(logger: str, mode: str | None, environ: dict[str, str] | None = None) -> str:
    """The W&B mode of a run logged with ``logger`` (wandb | none): ``mode`` when set; else ``WANDB_MODE``; else
    offline without ``WANDB_API_KEY`` and online with one; ``logger=none``: disabled."""
    environ = os.environ if environ is None else environ
    if logger == "none":
        return "disabled"
    if mode:
        return mode
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _git(path: Path) -> dict[str, Any] | None:
    try:
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def snapshot() -> dict[str, Any]:
    """Everything knowable without importing torch."""
    return {
        "versions": versions(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": {"model": cpu_model(), "count": os.cpu_count()},
        "git": {
            "moe_hydra": _git(Path(__file__).resolve().parent),
            "working_directory": _git(Path.cwd()),
        },
        "env": perf_env(),
        "slurm": {k: os.environ[k] for k in SLURM_VARS if k in os.environ} or None,
    }


def runtime() -> dict[str, Any]:
    """What only a process with torch loaded can see (the job adds it to env.json)."""
    import torch

    info: dict[str, Any] = {"torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            import pynvml

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - the driver version is a nicety; torch already saw the GPUs
            info["driver"] = None
    return info


def apply(preset: dict[str, Any]) -> dict[str, str | None]:
    """Set the preset's variables in this process (every rank it starts inherits them); the values they replace,
    for :func:`restore` (None: the variable was not set)."""
    previous = {k: os.environ.get(k) for k in preset}
    os.environ.update({str(k): str(v) for k, v in preset.items()})
    return previous


def restore(previous: dict[str, str | None]) -> None:
    """Undo :func:`apply` (a local multirun runs its points in one process, each with its own preset)."""
    for k, v in previous.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
