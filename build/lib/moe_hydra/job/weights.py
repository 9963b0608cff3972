"""Layout-invariant initialisation: the same seed gives the same model whatever the layout.

Megatron-Core initialises each rank's shard from RNG streams that depend on TP/EP/PP, so two
layouts of one model start from different weights and their losses cannot be compared step by
step. Here every weight is drawn whole from a generator keyed by (seed, its canonical name), then
this rank keeps its shard, split the way Megatron splits it (``partition_dim``, ``partition_stride``;
experts by global index and expert-TP rank). Norm weights and biases keep Megatron's constant init.

Distribution: N(0, init_method_std); output projections (``linear_proj``, ``linear_fc2``) are scaled
by 1/sqrt(2 * num_layers), as Megatron's ``scaled_init_method_normal``.
"""

from __future__ import annotations

import math
import re
import zlib

import torch

_EXPERT = re.compile(r"(\.local_experts\.)(\d+)(\.)")
_LAYER = re.compile(r"^(.*?\.layers\.)(\d+)(\..*)$")


def _is_constant_init(name: str, module: torch.nn.Module) -> bool:
    return name.endswith("bias") or isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or "norm" in name


@torch.no_grad()
def layout_invariant_init(model: torch.nn.Module, config, seed: int, *, tp_rank: int, tp_size: int,
                          etp_rank: int, etp_size: int, ep_rank: int) -> int:
    """Re-draw every random weight of ``model`` (one model chunk); returns how many were re-drawn."""
    layer_numbers = {}
    for name, module in model.named_modules():
        if hasattr(module, "layer_number") and _LAYER.match(name + "."):
            m = _LAYER.match(name + ".")
            layer_numbers[m.group(1) + m.group(2)] = module.layer_number - 1
    owners = {n: m for n, m in model.named_modules()}
    redrawn = 0
    for name, param in model.named_parameters():
        owner = owners.get(name.rsplit(".", 1)[0])
        if _is_constant_init(name, owner):
            continue
        canonical = name
        m = _LAYER.match(name)
        if m and m.group(1) + m.group(2) in layer_numbers:
            canonical = f"{m.group(1)}{layer_numbers[m.group(1) + m.group(2)]}{m.group(3)}"
        expert = getattr(param, "allreduce", True) is False
        if expert:
            num_local = config.num_moe_experts // config.expert_model_parallel_size
            canonical = _EXPERT.sub(lambda x: f"{x.group(1)}{int(x.group(2)) + ep_rank * num_local}{x.group(3)}",
                                    canonical)
        shards, rank = (etp_size, etp_rank) if expert else (tp_size, tp_rank)
        sharded = getattr(param, "tensor_model_parallel", False) and shards > 1
        dim, stride = getattr(param, "partition_dim", 0), getattr(param, "partition_stride", 1)
        shape = list(param.shape)
        if sharded:
            shape[dim] *= shards
        std = config.init_method_std
        if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
            std /= math.sqrt(2.0 * config.num_layers)
        g = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + zlib.crc32(canonical.encode()))
        full = torch.randn(shape, generator=g, device=param.device, dtype=torch.float32) * std
        if sharded:
            chunks = torch.chunk(full, shards * stride, dim=dim)
            full = torch.cat(chunks[rank::shards], dim=dim)
        param.copy_(full.to(param.dtype))
        redrawn += 1
    return redrawn
