"""The domain of every number in the schema, checked when the resolved plan is built (rule S02).

Every ``int`` and ``float`` field of :class:`moe_hydra.core.schema.Config` (and every element of its integer
lists) has a closed range here; ``tests/test_bounds.py`` fails when a field has none. A value outside its range,
NaN included, is refused before any arithmetic reads it, all at once, each refusal naming its key. The upper
bounds are far above any real run (a million GPUs, a 16M-token sequence) and keep every size a user types from
driving the time or memory of planning: no algorithm below runs for longer because a value is larger.

A ``None`` in an optional field is unset, not a number, and passes; the rules say when it must be set.

Each refusal's fix is the value the key has from the config's presets (:func:`moe_hydra.core.presets.chosen`: the
chosen group options over the schema's defaults) when that value is inside the domain, else the nearest edge.

Pure: standard library only (a fix reads the presets' YAML through :mod:`moe_hydra.core.presets`).
"""

from __future__ import annotations

import functools
import math
import typing
from operator import attrgetter
from typing import Any

from moe_hydra.core import overrides, presets
from moe_hydra.core.schema import leaves, unwrapped
from moe_hydra.core.steady import AUTO
from moe_hydra.core.violations import V, Violation

K = 1024
M = K * K
MAX_WORLD = M  # GPUs: nodes x devices_per_node
MAX_STEPS = 10**7  # training iterations, steps of a measured window
SIZE = (1, M)  # a dimension, a group size, a count of experts or layers
WIDTH = (1, 16 * M)  # a hidden or FFN width
FRACTION = (0.0, 1.0)
EFFICIENCY = (1e-6, 1.0)  # a sustained fraction of a peak: 0 would make a term infinite
RATE = (1e-6, 1e9)  # a peak rate or bandwidth (TFLOP/s, GB/s, TB/s)
GIB = (0.0, 1e6)

# path -> (lowest, highest), both allowed
DOMAINS: dict[str, tuple[float, float]] = {
    "seed": (0, 2**32 - 1),
    "repeat": (0, M),
    "model.num_layers": (1, 10 * K),
    "model.hidden_size": WIDTH,
    "model.ffn_hidden_size": WIDTH,
    "model.num_attention_heads": (1, 64 * K),
    "model.num_query_groups": (1, 64 * K),
    "model.kv_channels": (1, 64 * K),
    "model.vocab_size": (1, 16 * M),
    "model.make_vocab_size_divisible_by": (1, 64 * K),
    "model.max_position_embeddings": (1, 16 * M),
    "model.seq_length": (1, 16 * M),
    "model.global_batch_size": (1, 16 * M),
    "model.rotary_base": (1, 2**40),
    "model.window_attn_skip_freq": (1, 10 * K),
    "model.num_moe_experts": (1, 64 * K),
    "model.moe_ffn_hidden_size": WIDTH,
    "model.moe_router_topk": (1, 64 * K),
    "model.moe_shared_expert_intermediate_size": WIDTH,
    "model.moe_router_num_groups": (1, 64 * K),
    "model.moe_router_group_topk": (1, 64 * K),
    "model.moe_router_topk_scaling_factor": (1e-6, 1e6),
    "model.activation_func_clamp_value": (1e-6, 1e6),
    "model.glu_linear_offset": (-1e6, 1e6),
    "model.moe_aux_loss_coeff": (0.0, 1e6),
    "model.q_lora_rank": WIDTH,
    "model.kv_lora_rank": WIDTH,
    "model.qk_head_dim": (1, 64 * K),
    "model.qk_pos_emb_head_dim": (0, 64 * K),
    "model.v_head_dim": (1, 64 * K),
    "model.mtp_num_layers": (0, K),
    "hardware.nodes": (1, MAX_WORLD),
    "hardware.devices_per_node": (1, 4 * K),
    "hardware.gpus_per_node": (0, 4 * K),
    "hardware.nvlink_domain_size": (1, MAX_WORLD),
    "hardware.memory_gib": (1e-3, 1e6),
    "hardware.hbm_bandwidth_tb_s": RATE,
    "hardware.peak_tflops_bf16": RATE,
    "hardware.peak_tflops_fp8": RATE,
    "hardware.peak_tflops_fp4": RATE,
    "hardware.matmul_tflops_bf16": RATE,
    "hardware.matmul_tflops_fp8": RATE,
    "hardware.nvlink_bandwidth_gb_s": RATE,
    "hardware.scaleout_bandwidth_gb_s": RATE,
    "hardware.run_to_run_noise": FRACTION,
    "parallel.tensor_model_parallel_size": SIZE,
    "parallel.context_parallel_size": SIZE,
    "parallel.pipeline_model_parallel_size": SIZE,
    "parallel.virtual_pipeline_model_parallel_size": SIZE,
    "parallel.num_layers_in_first_pipeline_stage": (0, 10 * K),
    "parallel.num_layers_in_last_pipeline_stage": (0, 10 * K),
    "parallel.expert_model_parallel_size": SIZE,
    "parallel.expert_tensor_parallel_size": SIZE,
    "recompute.recompute_num_layers": (1, 10 * K),
    "offload.optimizer_offload_fraction": FRACTION,
    "dispatcher.num_sms": (1, 4 * K),
    "routing.moe_expert_capacity_factor": (1e-6, 1e6),
    "optimizer.lr": (0.0, 1e3),
    "optimizer.weight_decay": (0.0, 1e3),
    "optimizer.clip_grad": (0.0, 1e9),
    "optimizer.num_distributed_optimizer_instances": SIZE,
    "train.micro_batch_size": (1, 16 * M),
    "train.global_batch_size": (1, 16 * M),
    "train.seq_length": (1, 16 * M),
    "train.train_iters": (1, MAX_STEPS),
    "train.log_interval": (1, MAX_STEPS),
    "logger.log_interval": (1, MAX_STEPS),
    "train.fail_at_step": (1, MAX_STEPS),
    "data.seed": (0, 2**32 - 1),
    "memory.cuda_context_gib": GIB,
    "memory.nccl_gib": GIB,
    "memory.flex_dispatcher_gib": GIB,
    "memory.cuda_graphs_gib": GIB,
    "memory.fragmentation": FRACTION,
    "contract.warmup_steps": (0, MAX_STEPS),
    "contract.reference_every": (0, MAX_STEPS),
    "contract.steady_steps": (3, MAX_STEPS),  # the steady segment's shortest, in steps (moe_hydra.core.steady)
    "profile.num_steps": (1, 1000),
    "overlap.bucket_size": (1, 10**15),
    "compare.equivalence": (1e-6, 0.999),
    "compare.max_repeats": (1, 1000),
    "compare.alpha": (1e-6, 0.5),
    "compare.futility": (1e-6, 0.999),
    "tune.min_gain": (1e-6, 0.999),
    "tune.max_trials": (1, 10**4),
    "tune.budget_gpu_hours": (1e-6, 1e9),
    "tune.screen_top_k": (1, 64),
    "tune.max_repeats": (1, 1000),
    "tune.validate_steps": (50, MAX_STEPS),
    "bisect.max_trials": (1, 10**4),
    "bisect.max_repeats": (2, 1000),
    "calibrate.step_repeats": (3, 1000),
    "profile.top": (1, 1000),
    "launcher.timeout_min": (1, 10**6),
    "launcher.cpus_per_task": (1, 64 * K),
    "launcher.mem_gb": (1, 10**6),
    "launcher.signal_delay_s": (0, 10**6),
    "launcher.array_parallelism": (1, 10**6),
    "launcher.max_num_timeout": (0, 1000),
    "step_model.gemm_efficiency": EFFICIENCY,
    "step_model.attention_efficiency": EFFICIENCY,
    "step_model.scaleout_efficiency": EFFICIENCY,
    "step_model.expert_rows_half": (0.0, 1e9),
    "step_model.nvlink_efficiency": EFFICIENCY,
    "step_model.host_ms_per_moe_layer": (0.0, 1e6),
    "step_model.ep_overlap_efficiency": FRACTION,
    "step_model.low_precision_gemm_efficiency": EFFICIENCY,
    "step_model.cuda_graph_host_fraction": FRACTION,
    "step_model.host_ms_per_dense_layer": (0.0, 1e6),
    "step_model.unfused_attention_bytes_per_score": (0.0, 1e6),
    "step_model.host_ms_per_local_expert": (0.0, 1e6),
    "step_model.hbm_efficiency": EFFICIENCY,
    "step_model.gpu_ms_per_moe_layer": (0.0, 1e6),
    "step_model.pipeline_ms_per_chunk": (0.0, 1e6),
}
# integer lists: path -> (lowest, highest) of each element, and how many elements (None: any number)
LIST_DOMAINS: dict[str, tuple[tuple[int, int], int | None]] = {
    "model.window_size": ((-1, 16 * M), 2),  # [left, right]; -1: unbounded
    "parallel.hierarchical_context_parallel_sizes": (SIZE, None),
    "contract.window": ((1, MAX_STEPS), 2),  # [first, last] measured step, 1-based (how they relate: C01)
    "profile.steps": ((1, MAX_STEPS), None),  # [first, last] profiled step (how they relate: C02)
    "tune.window": ((1, MAX_STEPS), 2),  # [first, last] steady step of tune's short runs
    "bisect.window": ((1, MAX_STEPS), 2),  # [first, last] steady step of bisect's runs
}
# windows that may also be ``auto`` (moe_hydra.core.steady.AUTO: found while the run steps)
AUTO_WINDOWS = ("contract.window", "tune.window", "bisect.window")


def _container(t: Any) -> type | None:
    """list or dict for a List[...] / Dict[...] field (optional or not), else None."""
    return {list: list, dict: dict}.get(typing.get_origin(unwrapped(t)))


# list and dict fields: an interpolation can hand them any value (OmegaConf checks scalars, not containers)
CONTAINERS = {path: kind for path, t in leaves() if (kind := _container(t))}


def _shown(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g}]" if isinstance(lo, float) or isinstance(hi, float) else f"[{lo}, {hi}]"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@functools.lru_cache(maxsize=None)
def _fields(nodes: tuple[str, ...] | None) -> tuple:
    """The numbers (paths, getter, lows, highs), containers (paths, getter) and integer lists under the config
    nodes ``nodes`` (None: all of them)."""
    def under(paths: Any) -> tuple[str, ...]:
        return tuple(p for p in paths if nodes is None or p.split(".", 1)[0] in nodes)

    numbers, containers = under(DOMAINS), under(CONTAINERS)
    return (numbers, _getter(numbers), tuple(DOMAINS[p][0] for p in numbers), tuple(DOMAINS[p][1] for p in numbers),
            containers, _getter(containers), under(LIST_DOMAINS))


def _getter(paths: tuple[str, ...]) -> Any:
    """The values at ``paths`` of a config, as a tuple."""
    if not paths:
        return lambda cfg: ()
    get = attrgetter(*paths)
    return get if len(paths) > 1 else (lambda cfg: (get(cfg),))


def check(cfg: Any, nodes: tuple[str, ...] | None = None) -> list[Violation]:
    """S02: every number outside its domain, a list or dict field holding something else (an interpolation can),
    a malformed integer list and a world beyond :data:`MAX_WORLD`; empty for a config inside its bounds (the
    common case, at the layout search's rate). How values relate (a window after the warmup, sizes that divide)
    is the rules' business.

    ``nodes``: only the fields under these config nodes (the layout search: a candidate is a config already
    checked with other ``parallel`` and ``train`` values)."""
    paths, values, lows, highs, container_paths, container_values, lists = _fields(nodes)
    out = [V("S02", f"{path} must be within {_shown(lo, hi)} (is {value})", _fix_number(cfg, path, value, lo, hi),
             **{path.replace(".", "__"): value})
           for path, value, lo, hi in zip(paths, values(cfg), lows, highs)
           if value is not None and not _within(value, lo, hi)]
    wrong = {path: value for path, value in zip(container_paths, container_values(cfg))
             if value is not None and not isinstance(value, CONTAINERS[path])}
    out += [V("S02", f"{path} must be a {CONTAINERS[path].__name__} (is {value!r})", _fix_container(cfg, path),
              **{path.replace(".", "__"): value})
            for path, value in wrong.items()]
    out += [v for path in lists if path not in wrong for v in _check_list(cfg, path)]
    if nodes is not None and "hardware" not in nodes:
        return out
    if not out and cfg.hardware.nodes * cfg.hardware.devices_per_node > MAX_WORLD:
        hw = cfg.hardware
        nodes = presets.chosen(cfg, "hardware.nodes")
        if not (_within(nodes, *DOMAINS["hardware.nodes"]) and nodes * hw.devices_per_node <= MAX_WORLD):
            nodes = MAX_WORLD // hw.devices_per_node
        out.append(V("S02", f"world size {hw.nodes} x {hw.devices_per_node} is above {MAX_WORLD} GPUs",
                     f"hardware.nodes={nodes}", hardware__nodes=hw.nodes,
                     hardware__devices_per_node=hw.devices_per_node))
    return out


def _within(value: Any, lo: float, hi: float) -> bool:
    return _number(value) and lo <= value <= hi


def _fix_number(cfg: Any, path: str, value: Any, lo: float, hi: float) -> str:
    """``path=<the presets' value>`` when it is inside ``[lo, hi]`` (or unset, in an optional field), else the edge
    nearest ``value``. An interpolated value (``train.train_iters`` is the window's last step) is tried as this
    config reads it, then as the presets do (a refused window gives its default's last step)."""
    for preset in (presets.chosen(cfg, path), presets.chosen(cfg, path, own=True)):
        if preset is None or _within(preset, lo, hi):
            return overrides.override(path, preset)
    return f"{path}={hi if _number(value) and value > hi else lo}"


def _fix_container(cfg: Any, path: str) -> str:
    """The presets' list (or null) when it is one, else an empty list or dict."""
    preset = presets.chosen(cfg, path)
    if CONTAINERS[path] is list and (preset is None or isinstance(preset, list)):
        return overrides.override(path, preset)
    return f"{path}={'[]' if CONTAINERS[path] is list else '{}'}"


def _integer_within(x: Any, lo: int, hi: int) -> bool:
    return _number(x) and math.isfinite(x) and x == int(x) and lo <= x <= hi


def _check_list(cfg: Any, path: str) -> list[Violation]:
    (lo, hi), length = LIST_DOMAINS[path]
    value = attrgetter(path)(cfg)
    if value is None or _legal_list(value, path) or (path in AUTO_WINDOWS and value == AUTO):
        return []
    what = f"{length} integers" if length else "integers"
    what += f" or {AUTO}" if path in AUTO_WINDOWS else ""
    return [V("S02", f"{path} must be a list of {what} within [{lo}, {hi}] (is {value})",
              _fix_list(cfg, path), **{path.replace(".", "__"): value})]


def _legal_list(value: Any, path: str) -> bool:
    (lo, hi), length = LIST_DOMAINS[path]
    return isinstance(value, (list, tuple)) and (length is None or len(value) == length) and all(
        _integer_within(x, lo, hi) for x in value)


def _fix_list(cfg: Any, path: str) -> str:
    """The presets' list (or null) when it is legal, else ``length`` times the lowest element (a pair without a
    length: ``[first, last]`` lists such as ``contract.window`` are read by index)."""
    preset = presets.chosen(cfg, path)
    if path in AUTO_WINDOWS and preset == AUTO:
        return f"{path}={AUTO}"
    if preset is None or _legal_list(preset, path):
        return overrides.override(path, None if preset is None else list(preset))
    (lo, _), length = LIST_DOMAINS[path]
    return f"{path}=[{','.join([str(max(lo, 1))] * (length or 2))}]"
