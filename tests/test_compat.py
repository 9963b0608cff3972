"""The CPU shims that change what runs, not only where (moe_hydra/job/compat.py): bf16 GEMMs on fp32 copies; and
how many intra-op threads a CPU rank takes."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from moe_hydra.job.compat import _Bf16GemmsInFp32
from moe_hydra.job.train import cpu_threads


class _Kernels(TorchDispatchMode):
    """The aten GEMMs that ran and their operands' dtypes."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, set[torch.dtype]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in ("mm", "bmm", "addmm", "baddbmm"):
            self.seen.append((name, {a.dtype for a in args if isinstance(a, torch.Tensor)}))
        return func(*args, **(kwargs or {}))


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_a_bf16_gemm_is_the_fp32_product_rounded_once_to_bf16():
    a, w, b = _bf16(64, 96, seed=0), _bf16(48, 96, seed=1), _bf16(4, 96, 32, seed=2)
    with _Bf16GemmsInFp32():
        out = {"matmul": a @ w.t(), "mm": torch.mm(a, w.t()), "linear": torch.nn.functional.linear(a, w),
               "bmm": torch.bmm(b.transpose(1, 2), b), "addmm": torch.addmm(_bf16(48, seed=3), a, w.t())}
    want = {"matmul": a.float() @ w.float().t(), "mm": a.float() @ w.float().t(),
            "linear": a.float() @ w.float().t(), "bmm": torch.bmm(b.float().transpose(1, 2), b.float()),
            "addmm": _bf16(48, seed=3).float() + a.float() @ w.float().t()}
    for name, got in out.items():
        assert got.dtype == torch.bfloat16, name
        assert torch.equal(got, want[name].bfloat16()), name


def test_the_gemm_kernels_run_in_fp32_forward_and_backward():
    """torch's own bf16 kernel gives the same numbers here (fp32 accumulation): what the mode changes is the
    kernel, 7-70x faster on a CPU without bf16 instructions."""
    a, w = _bf16(32, 64, seed=4).requires_grad_(), _bf16(16, 64, seed=5).requires_grad_()
    with _Kernels() as plain:
        (a @ w.t()).sum().backward()
    with _Bf16GemmsInFp32(), _Kernels() as shimmed:
        (a @ w.t()).sum().backward()
    assert plain.seen and all(dtypes == {torch.bfloat16} for _, dtypes in plain.seen)
    assert len(shimmed.seen) == len(plain.seen) and all(dtypes == {torch.float32} for _, dtypes in shimmed.seen)


def test_gradients_stay_bf16_and_match_a_float64_reference():
    a, w = _bf16(32, 64, seed=4).requires_grad_(), _bf16(16, 64, seed=5).requires_grad_()
    g = _bf16(32, 16, seed=6)
    with _Bf16GemmsInFp32():
        (a @ w.t()).backward(g)
    ref_a, ref_w = g.double() @ w.double(), g.double().t() @ a.double()
    assert a.grad.dtype == w.grad.dtype == torch.bfloat16
    for got, ref in ((a.grad, ref_a), (w.grad, ref_w)):
        assert torch.allclose(got.double(), ref, rtol=2 ** -7, atol=1e-2)  # one bf16 rounding of the fp32 sum


def test_other_dtypes_and_other_ops_pass_through_unchanged():
    a, w = torch.randn(8, 16, dtype=torch.float64), torch.randn(16, 4, dtype=torch.float64)
    x = _bf16(8, 16, seed=7)
    with _Bf16GemmsInFp32():
        assert torch.equal(a @ w, torch.matmul(a, w)) and (a @ w).dtype == torch.float64
        assert (x + x).dtype == torch.bfloat16 and torch.equal(x + x, x * 2)


@pytest.mark.parametrize("omp,cores,local_world,want", [
    (None, 2, 1, 1), (None, 16, 1, 15), (None, 16, 8, 1), (None, 17, 2, 8), (None, 1, 1, 1), (None, 2, 4, 1),
    ("4", 2, 1, 4), ("", 9, 2, 4), ("0", 9, 1, 8), ("x", 3, 1, 2)])
def test_a_cpu_rank_takes_its_share_of_the_allowed_cores_less_one(monkeypatch, omp, cores, local_world, want):
    """The cores are the process's affinity (a Slurm allocation), not the node's count; OMP_NUM_THREADS wins when it
    names a positive number."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(100, 100 + cores)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert cpu_threads(local_world) == want


def test_without_an_affinity_call_the_cores_are_the_machines(monkeypatch):
    """macOS has no sched_getaffinity."""
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_threads(2) == 3
