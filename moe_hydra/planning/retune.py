"""The retune table: for the wall that dominates a profiled step, the one-variable changes worth an A/B, in the
order they are tried (docs/tune.md prints it, with its sources).

Each :class:`Candidate` proposes overrides against the incumbent's composed config, or nothing when it does not
apply there (already set, no room in the batch, a CPU). What it proposes is then planned like any command line
(the rules, the memory estimate): a candidate the rules refuse is recorded with their reason and never launched.
Changes that alter numerics (precision) or the label (routing, data) are proposed only when ``tune.allow`` names
them.

The walls are the profile's (moe_hydra.core.walls): ``compute`` (compute_ms), ``communication``
(exposed_communication_ms), ``host`` (host_ms + idle_ms: the device waiting on the host), and ``memory`` (capacity:
the plan's estimate near or over the device's memory, and memcpy_ms).

Pure: reads the schema's objects only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WALLS = ("compute", "communication", "host", "memory")
# profile.json parts -> the wall each counts toward
WALL_PARTS = {"compute_ms": "compute", "exposed_communication_ms": "communication", "host_ms": "host",
              "idle_ms": "host", "memcpy_ms": "memory"}


@dataclass(frozen=True)
class Candidate:
    wall: str
    name: str
    propose: Callable[[Any], list[str] | None]  # the incumbent's config (schema objects) -> overrides, or None
    why: str  # what it attacks, as docs/tune.md says it
    source: str  # where the advice comes from
    alters: str | None = None  # "precision", "routing", "data": tried only when tune.allow names it


def _gpu(cfg: Any) -> bool:
    return cfg.hardware.arch != "cpu"


def _recompute_off(cfg: Any) -> list[str] | None:
    return ["recompute=none"] if cfg.recompute.name != "none" else None


def _selective(cfg: Any) -> list[str] | None:
    return ["recompute=selective"] if cfg.recompute.name == "full" else None


def _micro_batches(cfg: Any) -> tuple[int, list[int]] | None:
    """(the micro batch, every larger one the global batch allows: the data-parallel size times it divides the
    global batch and at least PP micro-batches remain to fill the pipeline), or None without a fixed global batch
    (one left to follow the micro batch would change the work a step: never proposed)."""
    mbs, gbs = cfg.train.micro_batch_size, cfg.train.global_batch_size
    if gbs is None:
        return None
    dp = max(cfg.hardware.nodes * cfg.hardware.devices_per_node // _model_parallel(cfg), 1)
    pp = max(cfg.parallel.pipeline_model_parallel_size, 1)
    return mbs, [m for m in range(mbs + 1, gbs // dp + 1) if gbs % (m * dp) == 0 and gbs // (m * dp) >= pp]


def _fewest_micro_batches(cfg: Any) -> list[str] | None:
    """The largest micro batch at the same global batch: the fewest micro-batches a step (the largest change in
    host work, so the one an A/B finds first; a run that does not fit is dropped and the next candidate tried)."""
    room = _micro_batches(cfg)
    return [f"train.micro_batch_size={room[1][-1]}"] if room and room[1] else None


def _larger_micro_batch(cfg: Any) -> list[str] | None:
    """Twice the micro batch at the same global batch, when the global batch allows it."""
    room = _micro_batches(cfg)
    return [f"train.micro_batch_size={2 * room[0]}"] if room and 2 * room[0] in room[1] else None


def _smaller_micro_batch(cfg: Any) -> list[str] | None:
    """Half the micro batch at the same global batch: half the activations in flight (more micro-batches)."""
    mbs = cfg.train.micro_batch_size
    return [f"train.micro_batch_size={mbs // 2}"] if mbs > 1 and mbs % 2 == 0 else None


def _model_parallel(cfg: Any) -> int:
    p = cfg.parallel
    return max(p.tensor_model_parallel_size * p.context_parallel_size * p.pipeline_model_parallel_size, 1)


def _flag(section: str, key: str, gpu_only: bool = True) -> Callable[[Any], list[str] | None]:
    def propose(cfg: Any) -> list[str] | None:
        if gpu_only and not _gpu(cfg):
            return None
        return None if getattr(getattr(cfg, section), key) else [f"{section}.{key}=true"]
    return propose


def _flex(cfg: Any) -> list[str] | None:
    flex = cfg.hardware.flex_dispatcher
    return [f"dispatcher={flex}"] if _gpu(cfg) and flex and cfg.dispatcher.name != flex else None


def _ep_in_nvlink(cfg: Any) -> list[str] | None:
    """EP and ETP inside one node's NVLink domain, when the experts span nodes."""
    p, per_node = cfg.parallel, cfg.hardware.devices_per_node
    ep = p.expert_model_parallel_size
    if not _gpu(cfg) or ep * p.expert_tensor_parallel_size <= per_node or per_node % p.expert_tensor_parallel_size:
        return None
    return [f"parallel.expert_model_parallel_size={per_node // p.expert_tensor_parallel_size}"]


def _cuda_graphs(cfg: Any) -> list[str] | None:
    if not _gpu(cfg) or cfg.kernels.cuda_graph_impl != "none":
        return None
    return ["kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[attn,moe_router,moe_preprocess]"]


def _offload(cfg: Any) -> list[str] | None:
    return ["offload=optimizer"] if _gpu(cfg) and cfg.offload.name == "none" else None


def _fp8(cfg: Any) -> list[str] | None:
    return ["precision=fp8_blockwise"] if _gpu(cfg) and cfg.precision.name == "bf16" else None


MCORE = "Megatron-Core MoE performance guide (docs/source/api-guide/moe.rst)"
WORKFLOW = "NVIDIA's MoE workflow skill (workflow.md: retune one variable at a time)"

TABLE: tuple[Candidate, ...] = (
    # compute: work the step does that it need not
    Candidate("compute", "recompute off", _recompute_off, "recomputing the forward costs about a third more "
              "compute; drop it when the memory estimate allows", WORKFLOW),
    Candidate("compute", "selective recompute", _selective, "recompute only the cheap, memory-heavy modules "
              "instead of whole layers", MCORE),
    Candidate("compute", "MoE permute fusion", _flag("kernels", "moe_permute_fusion"), "fused token permutation",
              MCORE),
    Candidate("compute", "lower precision (FP8)", _fp8, "FP8 GEMMs; changes numerics", MCORE, alters="precision"),
    # host: the device waiting on Python, launches and the schedule
    Candidate("host", "fewest micro-batches", _fewest_micro_batches, "the largest micro batch the global batch "
              "allows: the least per-micro-batch host work (launches, the schedule) at the same global batch",
              WORKFLOW),
    Candidate("host", "fewer, larger micro-batches", _larger_micro_batch, "half the per-micro-batch host work "
              "(launches, the schedule) at the same global batch", WORKFLOW),
    Candidate("host", "CUDA graphs", _cuda_graphs, "replay the step's launches instead of issuing them", MCORE),
    Candidate("host", "grouped GEMM", _flag("kernels", "moe_grouped_gemm"), "one grouped GEMM for the local "
              "experts instead of one per expert", MCORE),
    Candidate("host", "MoE router fusion", _flag("kernels", "moe_router_fusion"), "fused router top-k and scores",
              MCORE),
    # communication: exposed all-to-all, all-gather and p2p
    Candidate("communication", "flex dispatcher", _flex, "DeepEP / HybridEP kernels for the token exchange", MCORE),
    Candidate("communication", "EP communication overlap", _flag("overlap", "overlap_moe_expert_parallel_comm"),
              "hide the dispatch and combine under another micro-batch's compute", MCORE),
    Candidate("communication", "EP inside NVLink", _ep_in_nvlink, "keep the all-to-all inside a node", MCORE),
    Candidate("communication", "TP communication overlap", _flag("overlap", "tp_comm_overlap"), "overlap TP's "
              "all-gather and reduce-scatter with the GEMMs", MCORE),
    Candidate("communication", "gradient reduce overlap", _flag("overlap", "overlap_grad_reduce", gpu_only=False),
              "overlap the data-parallel gradient reduction with the backward", MCORE),
    # memory: what fits, and the copies that moving it costs
    Candidate("memory", "selective recompute", lambda cfg: ["recompute=selective"] if cfg.recompute.name == "none"
              else None, "recompute the memory-heavy modules to fit", MCORE),
    Candidate("memory", "smaller micro-batch", _smaller_micro_batch, "half the activations held at once, at the "
              "same global batch", WORKFLOW),
    Candidate("memory", "optimizer offload", _offload, "the optimizer's states to host memory", MCORE),
)


def candidates(cfg: Any, wall: str, allow: list[str] | tuple[str, ...] = ()) -> list[tuple[Candidate, list[str]]]:
    """The table's candidates for ``wall`` that apply to ``cfg``, in order, each with its overrides; those that
    alter numerics or the label only when ``allow`` names what they alter."""
    out = []
    for c in TABLE:
        if c.wall != wall or (c.alters and c.alters not in allow):
            continue
        proposed = c.propose(cfg)
        if proposed:
            out.append((c, proposed))
    return out


def wall_ms(profile: dict[str, Any]) -> dict[str, float]:
    """Each wall's ms a step on the slowest rank of a profiled step (profile.json), and the step's (``wall``)."""
    slowest = (profile.get("summary") or profile).get("slowest_rank") or {}
    out = {w: 0.0 for w in WALLS}
    for part, wall in WALL_PARTS.items():
        out[wall] += float(slowest.get(part) or 0.0)
    return {**{w: round(ms, 3) for w, ms in out.items()}, "wall": round(float(slowest.get("wall_ms") or 0.0), 3)}


def walls_of(profile: dict[str, Any], fits_margin: float | None = None) -> dict[str, float]:
    """Each wall's share of the slowest rank's profiled step (profile.json), largest first. ``fits_margin``: the
    plan's memory margin as a share of the device (memory.margin / capacity); under 10 % makes memory the wall."""
    slowest = (profile.get("summary") or profile).get("slowest_rank") or {}
    wall_ms = float(slowest.get("wall_ms") or 0.0)
    shares = {w: 0.0 for w in WALLS}
    for part, wall in WALL_PARTS.items():
        shares[wall] += float(slowest.get(part) or 0.0) / wall_ms if wall_ms else 0.0
    if fits_margin is not None and fits_margin < 0.10:
        shares["memory"] = max(shares["memory"], 1.0)
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))
