"""Megatron-Core on a CPU build of torch (gloo), and without Transformer Engine.

Each shim names the failure it prevents (docs/cpu.md). :func:`apply` installs the CPU shims
only when CUDA is unavailable, and the no-TE fixes only when Transformer Engine is absent; on a GPU
node with TE it changes nothing. It returns the names of what it installed, which the job records in
its evidence.

Imported by the job only (it imports torch and megatron).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path

import torch


def _cpu_rng() -> None:
    """``CudaRNGStatesTracker.add`` -> ``torch.cuda.get_rng_state()``: "Torch not compiled with CUDA
    enabled". Route the CUDA RNG calls to the CPU generator, so ``tracker.fork()`` really switches
    streams (skipping the seed call instead fails later: "cuda rng state ... is not added")."""
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)


class _Stream:
    """Stand-in for ``torch.cuda.Stream``/``Event``: ``MoEAlltoAllTokenDispatcher.__init__`` creates
    a side stream ("torch.cuda.Stream requires CUDA support"). On the CPU all work is synchronous."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: self  # record_event() gives an event whose synchronize() is a no-op


def _cpu_streams_and_device() -> None:
    """``torch.cuda.current_device()`` (buffers, router, experts, rotary) and ``torch.cuda.synchronize``
    (pipeline p2p): "Torch not compiled with CUDA enabled". The current device is the CPU."""
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Stream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None


def _cpu_split_sizes() -> None:
    """All-to-all with EP>1: split sizes reach gloo as a tensor, since ``maybe_move_tensor_to_cpu``
    converts only CUDA tensors ("all_to_all_single(): incompatible function arguments")."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu

    def to_host(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy() if as_numpy else tensor
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = to_host
    token_dispatcher.maybe_move_tensor_to_cpu = to_host


class _HostTorch(types.ModuleType):
    """``torch`` as seen by one Megatron module, with ``device="cuda"`` factory calls on the CPU."""

    _FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange")

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in self._FACTORIES:
            def factory(*args, **kwargs):
                if str(kwargs.get("device", "")).startswith("cuda"):
                    kwargs["device"] = "cpu"
                return attr(*args, **kwargs)

            return factory
        return attr


# Megatron modules that allocate with device="cuda" on the paths the job uses.
_CUDA_ALLOCATING_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.utils",  # local_multi_tensor_l2_norm (gradient clipping without Apex)
)


def _cpu_allocations() -> None:
    """The pipeline schedules, Megatron's optimizers and gradient buffers allocate with
    ``device="cuda"`` (``torch.zeros(..., device="cuda")``, ``torch.tensor([0], device='cuda')``):
    "Torch not compiled with CUDA enabled". Inside those modules only, such allocations go to the CPU."""
    for name in _CUDA_ALLOCATING_MODULES:
        importlib.import_module(name).torch = _HostTorch()


def _cpu_tensor_cuda() -> None:
    """``LanguageModule.setup_embeddings_and_output_layer`` moves the embedding shared between the
    first and the last pipeline stage (tied embeddings, or MTP) with ``weight.data.cuda()``: "Torch
    not compiled with CUDA enabled". On a CPU build ``Tensor.cuda()`` keeps the tensor where it is."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


def _cpu_tensor_type_names() -> None:
    """Megatron's optimizers and gradient clipping check ``param.type() == 'torch.cuda.FloatTensor'``
    (a bare ``AssertionError``; "Wrapped parameters must be one of torch.cuda.FloatTensor, ...").
    During those calls only, ``Tensor.type()`` reports the ``torch.cuda.*`` name of a CPU tensor."""
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    plain_type = torch.Tensor.type

    def cuda_named_type(self, dtype=None, *args, **kwargs):
        name = plain_type(self, dtype, *args, **kwargs)
        if dtype is None and isinstance(name, str) and name.startswith("torch.") and not name.startswith("torch.cuda."):
            return "torch.cuda." + name[len("torch."):]
        return name

    depth = [0]  # these calls nest (DistributedOptimizer.__init__ -> _build_...): restore at the outermost

    def wrap(owner, attr):
        raw = inspect.getattr_static(owner, attr)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        fn = raw.__func__ if kind else raw

        def wrapped(*args, **kwargs):
            depth[0] += 1
            torch.Tensor.type = cuda_named_type
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    torch.Tensor.type = plain_type

        setattr(owner, attr, kind(wrapped) if kind else wrapped)

    wrap(distrib_optimizer.DistributedOptimizer, "_build_model_and_main_param_groups")
    wrap(distrib_optimizer.DistributedOptimizer, "__init__")
    wrap(optimizer.Float16OptimizerWithFloat16Params, "__init__")
    wrap(clip_grads, "clip_grad_by_total_norm_fp32")
    wrap(optimizer, "clip_grad_by_total_norm_fp32")  # imported by name there


def _te_general_gemm() -> None:
    """megatron-core 0.16.1 ``RouterGatingLinearFunction.forward``: "NameError: name
    'te_general_gemm' is not defined" without Transformer Engine (GPUs too; fixed in 0.19)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _sequence_parallel_torch_norm() -> None:
    """TP>1 with sequence parallelism on the local (non-TE, non-Apex) spec: ``WrappedTorchNorm``
    asserts "sequence parallel not supported by torch LayerNorm". Build the torch norm and tag its
    parameters ``sequence_parallel=True`` as TENorm/FusedLayerNorm do, so Megatron sums their grads
    over TP."""
    from megatron.core.transformer import torch_norm

    cls = torch_norm.WrappedTorchNorm
    if getattr(cls, "_moe_hydra_sp", False):
        return
    original_new = cls.__new__

    def new(klass, config, hidden_size, eps=1e-5, **kwargs):
        if not config.sequence_parallel:
            return original_new(klass, config, hidden_size, eps, **kwargs)
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(normalized_shape=hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = True
        return norm

    cls.__new__ = new
    cls._moe_hydra_sp = True


def _triton_stub() -> None:
    """megatron-core 0.19 hard-imports triton (``transformer/moe/ops/paged_stash.py``), absent on CPU
    installs. Stub that one module; stubbing ``triton`` itself breaks torch._dynamo."""
    name = "megatron.core.transformer.moe.ops.paged_stash"
    if importlib.util.find_spec("triton") is None and name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)


class _Bf16GemmsInFp32(torch.overrides.TorchFunctionMode):
    """bf16 GEMMs on a CPU without bf16 instructions (no AVX512-BF16 or AMX): torch's fallback kernel is 7-70x
    slower than its fp32 one (``grad @ weight``, the data gradient of every linear layer, the slowest). Inside this
    mode a bf16 matmul runs on fp32 copies of its operands and rounds its result to bf16, as a GPU's bf16 tensor
    cores do (bf16 products, fp32 accumulation): parameters, activations and gradients stay bf16."""

    GEMMS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
                       torch.bmm, torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm, torch.addmm,
                       torch.nn.functional.linear})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in self.GEMMS and "out" not in kwargs
                and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)):
            up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            return func(*up, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 GEMM instructions (AVX512-BF16 or AMX; /proc/cpuinfo's flags, False without it)."""
    flags = ""
    with contextlib.suppress(OSError):
        flags = Path("/proc/cpuinfo").read_text()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cpu_bf16_gemms() -> bool:
    """Enter :class:`_Bf16GemmsInFp32` for the rest of this process where the CPU has no bf16 GEMM (False where it
    has). The autograd engine runs a custom Function's backward outside the mode: Megatron's linear layers' backward
    (their data and weight gradients) enters it itself."""
    from megatron.core.tensor_parallel import layers

    if cpu_has_bf16():
        return False
    linear = layers.LinearWithGradAccumulationAndAsyncCommunication
    if getattr(linear, "_moe_hydra_fp32_gemms", False):  # installed already (stage=fit, then the job)
        return True
    linear._moe_hydra_fp32_gemms = True
    backward = linear.backward

    def backward_in_fp32(ctx, *grads):
        with _Bf16GemmsInFp32():
            return backward(ctx, *grads)

    linear.backward = staticmethod(backward_in_fp32)
    _Bf16GemmsInFp32().__enter__()
    return True


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def apply() -> list[str]:
    """Install what this machine needs; returns the names of the installed shims."""
    installed = []
    _triton_stub()
    if not torch.cuda.is_available():
        _cpu_rng()
        _cpu_streams_and_device()
        _cpu_split_sizes()
        _cpu_allocations()
        _cpu_tensor_type_names()
        _cpu_tensor_cuda()
        installed += ["cpu_rng", "cpu_streams_and_device", "cpu_split_sizes", "cpu_allocations", "cpu_tensor_type_names",
                      "cpu_tensor_cuda"]
        if os.environ.get("MOE_HYDRA_CPU_BF16_GEMMS") != "torch" and _cpu_bf16_gemms():  # opt-out: docs/cpu.md
            installed.append("cpu_bf16_gemms_in_fp32")
    if not te_available():
        _te_general_gemm()
        _sequence_parallel_torch_norm()
        installed += ["te_general_gemm", "sequence_parallel_torch_norm"]
    return installed
