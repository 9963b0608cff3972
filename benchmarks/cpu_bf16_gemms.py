"""bf16 GEMMs on a CPU: torch's own bf16 kernels against the job's shim (moe_hydra.job.compat, fp32 copies rounded
back to bf16), on the GEMM shapes of one step of the embedded tiny MoE (forward and backward).

Both are timed in this run, interleaved, as the median of ``--runs`` steps; fp32 is shown for reference. The ratio
is what the shim saves where the CPU has no bf16 instructions (compat.cpu_has_bf16() False); where it has them the
job does not install the shim.

    python benchmarks/cpu_bf16_gemms.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from moe_hydra.job.compat import _Bf16GemmsInFp32, cpu_has_bf16

TOKENS, H, FFN, EXPERTS, TOPK, MOE_FFN, VOCAB, LAYERS = 512, 128, 512, 8, 2, 256, 1024, 2  # conf/model/tiny_moe.yaml


def weights(dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    """(name, [out, in] weight) of every GEMM a step runs, as Megatron's linear layers hold them."""
    g = torch.Generator().manual_seed(0)
    w = lambda o, i: (torch.randn(o, i, generator=g) * i ** -0.5).to(dtype).requires_grad_()  # noqa: E731
    out = []
    for _ in range(LAYERS):
        out += [("qkv", w(3 * H, H)), ("proj", w(H, H))]
        out += [(f"fc1.{e}", w(2 * MOE_FFN, H)) for e in range(EXPERTS)] + [(f"fc2.{e}", w(H, MOE_FFN))
                                                                             for e in range(EXPERTS)]
    return out + [("logits", w(VOCAB, H))]


def step(ws: list[tuple[str, torch.Tensor]], x: torch.Tensor) -> float:
    """Forward and backward of each GEMM on its input rows (a sequential expert gets TOKENS x TOPK / EXPERTS)."""
    t0 = time.perf_counter()
    rows = TOKENS * TOPK // EXPERTS
    loss = 0
    for name, w in ws:
        inp = x[:rows, : w.shape[1]] if name.startswith(("fc1", "fc2")) else x[:, : w.shape[1]]
        loss = loss + torch.nn.functional.linear(inp, w).float().square().mean()
    loss.backward()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    arms = {"bf16, torch kernels": (torch.bfloat16, False), "bf16, the shim": (torch.bfloat16, True),
            "fp32": (torch.float32, False)}
    times: dict[str, list[float]] = {name: [] for name in arms}
    inputs = {dtype: torch.randn(TOKENS, 2 * MOE_FFN, generator=torch.Generator().manual_seed(1)).to(dtype)
              for dtype in (torch.bfloat16, torch.float32)}
    built = {name: weights(dtype) for name, (dtype, _) in arms.items()}
    for i in range(args.runs + 1):  # interleaved; the first round warms up
        for name, (dtype, shim) in arms.items():
            if shim:
                with _Bf16GemmsInFp32():
                    t = step(built[name], inputs[dtype])
            else:
                t = step(built[name], inputs[dtype])
            if i:
                times[name].append(t)
    print(f"CPU with bf16 instructions: {cpu_has_bf16()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name, ms in med.items():
        print(f"  {name:24s} {ms:8.1f} ms per step's GEMMs (median of {args.runs})")
    print(f"ratio torch's bf16 kernels / the shim: {med['bf16, torch kernels'] / med['bf16, the shim']:.1f}x")


if __name__ == "__main__":
    main()
