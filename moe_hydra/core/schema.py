"""The typed schema of a moe_hydra run: one dataclass per config group, Megatron-Core field names.

Values live in ``conf/<group>/*.yaml``; this module says what may be set and what each field means.
Hydra validates every composed config against these classes, so a misspelt key or a wrong type fails
at compose time, before anything is planned or launched.

Where each node goes:

- ``model``      architecture (``conf/model``), read by :mod:`moe_hydra.core.arch`, :mod:`moe_hydra.core.flops`,
  :mod:`moe_hydra.core.params`.
- ``hardware``   topology and peaks (``conf/hardware``).
- ``precision``  compute precision recipe (``conf/precision``).
- ``parallel``   both meshes; written by the ``attention_mesh``, ``expert_mesh`` and ``mesh`` groups.
  DP and EDP are derived (:class:`moe_hydra.core.layout.Layout`), never set.
- ``recompute``, ``offload``, ``dispatcher``, ``routing``: one group each.
- ``kernels``, ``overlap``, ``optimizer``, ``train``, ``data``, ``contract``: plain nodes, overridden by key.
- ``launcher``, ``logger``: where and how a run is executed and recorded.

Pure module: imports only the standard library and omegaconf.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from omegaconf import II, MISSING

from moe_hydra.core import step_model_fit
from moe_hydra.core.stats import EQUIVALENCE
from moe_hydra.core.steady import AUTO, STEADY_STEPS

# contract.window=auto steps until it finds a steady segment, up to this many steps unless train.train_iters says
AUTO_MAX_STEPS = 200


def last_step(window: Any) -> int:
    """The steps a run trains unless ``train.train_iters`` says: the declared window's last step, or
    :data:`AUTO_MAX_STEPS` for ``contract.window=auto`` (the resolver ``moe_hydra.last_step``)."""
    if isinstance(window, str):
        return AUTO_MAX_STEPS if window == AUTO else 0  # another string: rule C01 names it
    try:
        return int(list(window)[-1])
    except (TypeError, ValueError, IndexError):
        return 0  # not [first, last]: rule C01 names it


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("moe_hydra.last_step"):
        OmegaConf.register_new_resolver("moe_hydra.last_step", last_step)


_register_resolvers()

# The configs: conf/ at the top of the repository, installed as this package (pyproject.toml maps it).
CONF_PACKAGE = "moe_hydra.conf"
# A cluster's own settings: <dir>/site/default.yaml joins the search path (hydra_plugins.moe_hydra_site).
SITE_ENV = "MOE_HYDRA_SITE"


def conf_dir() -> Path:
    """Where the configs are on this machine (the repository's conf/, or the installed package's)."""
    return Path(str(importlib.resources.files(CONF_PACKAGE)))


def site_dir() -> Path | None:
    """The site directory ``MOE_HYDRA_SITE`` names, or None when it is unset or empty.

    Raises:
        Refused: it names something that is not a directory (a named input is never silently ignored).
    """
    site = os.environ.get(SITE_ENV)
    if not site:
        return None
    path = Path(site).expanduser().resolve()
    if not path.is_dir():
        from moe_hydra.core.errors import Refused

        raise Refused(f"{SITE_ENV}={site}: {'not a directory' if path.exists() else 'no such directory'} (a site "
                      f"directory holds site/default.yaml); fix: export {SITE_ENV}=<a directory>, or unset {SITE_ENV}")
    return path


def site_settings() -> dict[str, Any]:
    """The site file ``$MOE_HYDRA_SITE/site/default.yaml`` as a mapping; {} without a site or a site file.

    Raises:
        Refused: the site directory is not one, or its file is unreadable, not YAML or not a mapping.
    """
    site = site_dir()
    path = site / "site" / "default.yaml" if site else None
    if path is None or not path.exists():
        return {}
    import yaml

    from moe_hydra.core.errors import Refused
    from moe_hydra.core.io import read_named

    try:
        data = yaml.safe_load(read_named(path, f"the site file ({SITE_ENV})"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise Refused(f"the site file {path}: not YAML{where} ({getattr(e, 'problem', None) or e}); fix the file, "
                      f"or unset {SITE_ENV}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Refused(f"the site file {path}: a {type(data).__name__}, not a mapping of config keys")
    return data


class Stage(str, Enum):
    """What ``python -m moe_hydra`` does with the composed config."""

    plan = "plan"  # validate, count, estimate; write plan.json; start nothing
    fit = "fit"  # plan, then build pipeline ranks of the layout with Megatron-Core on a fake process group
    run = "run"  # plan, then train and measure
    # plan, then measure this machine on the job's processes (the model's step at shrunken depths on each layout,
    # GEMMs at the model's shapes, memory bandwidth, collectives): calibration.json (moe_hydra.job.calibrate)
    calibrate = "calibrate"


class CalibratedLayouts(str, Enum):
    """The layouts ``stage=calibrate`` measures the model's step on."""

    all = "all"  # every layout of the job's processes the rules let the job run (CP 1, no VPP)
    plan = "plan"  # the composed one


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """A decoder-only MoE transformer, in Megatron-Core ``TransformerConfig`` names."""

    name: str = MISSING
    num_layers: int = MISSING
    hidden_size: int = MISSING
    # Dense MLP width, used by the layers that ``moe_layer_freq`` marks dense.
    ffn_hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    # GQA groups; null means MHA (= num_attention_heads).
    num_query_groups: Optional[int] = None
    # Per-head dimension; null means hidden_size / num_attention_heads.
    kv_channels: Optional[int] = None
    # Vocabulary before padding. Megatron pads it to a multiple of make_vocab_size_divisible_by x TP.
    vocab_size: int = MISSING
    make_vocab_size_divisible_by: int = 128
    max_position_embeddings: int = 4096
    # The sequence length this preset is benchmarked at; train.seq_length defaults to it.
    seq_length: int = 4096
    # The global batch (sequences) of the model's published performance recipe; train.global_batch_size
    # defaults to it. null: none published (the batch is then micro batch x world size).
    global_batch_size: Optional[int] = None
    normalization: str = "RMSNorm"  # RMSNorm | LayerNorm
    # SwiGLU when true (activation silu): three h x f matrices per MLP instead of two.
    gated_linear_unit: bool = True
    # The MLPs' activation: silu | gelu | quick_gelu (GPT-OSS's x * sigmoid(1.702 x)); null: silu with a gated
    # linear unit, gelu without.
    activation_func: Optional[str] = None
    # A clamped GLU (GPT-OSS: 7.0 and 1.0): the gate clamped to at most this value and the linear half to +-it,
    # then activation(gate) * (linear + glu_linear_offset). null: no clamp.
    activation_func_clamp_value: Optional[float] = None
    glu_linear_offset: float = 0.0
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    untie_embeddings_and_output_weights: bool = True
    position_embedding_type: str = "rope"
    rotary_base: int = 10000
    # Sliding-window attention (window_size=[left,right]) on every window_attn_skip_freq-th layer.
    window_size: Optional[List[int]] = None
    window_attn_skip_freq: Optional[int] = None

    # --- MoE -------------------------------------------------------------------------------
    num_moe_experts: Optional[int] = None
    # Per-expert FFN width; null means ffn_hidden_size.
    moe_ffn_hidden_size: Optional[int] = None
    moe_router_topk: int = 2
    # Total width of the shared experts (count x per-expert width); null = none.
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_shared_expert_gate: bool = False
    # Which layers are MoE: an int N (every N-th layer, layer 0 included), a 0/1 list of length
    # num_layers, or Megatron's compact string such as "[0]*3+[1]*58".
    moe_layer_freq: Any = 1
    moe_router_score_function: str = "softmax"  # softmax | sigmoid
    moe_router_pre_softmax: bool = False
    moe_router_num_groups: Optional[int] = None
    moe_router_group_topk: Optional[int] = None
    moe_router_topk_scaling_factor: Optional[float] = None
    moe_router_enable_expert_bias: bool = False
    moe_router_load_balancing_type: str = "aux_loss"  # aux_loss | seq_aux_loss | none | ...
    moe_aux_loss_coeff: float = 0.0

    # --- Multi-latent attention (DeepSeek) -------------------------------------------------
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128

    # Multi-token prediction blocks (DeepSeek-V3: 1); null = none.
    mtp_num_layers: Optional[int] = None


@dataclass(kw_only=True, slots=True)
class HardwareConfig:
    """Where the ranks run. World size = nodes x devices_per_node."""

    name: str = MISSING
    # Device family; decides which precisions and kernels exist: cpu | ampere | hopper | blackwell.
    arch: str = MISSING
    device: str = MISSING
    nodes: int = 1
    # GPUs per node (processes per node for local_cpu).
    devices_per_node: int = MISSING
    # GPUs Slurm allocates per node: devices_per_node on GPU presets, null on CPU.
    gpus_per_node: Optional[int] = None
    # Devices that share one NVLink domain (8 on HGX, 72 on NVL72). EP x TP should stay inside it.
    nvlink_domain_size: int = 1
    # Device memory per rank in GiB; null = unknown (CPU).
    memory_gib: Optional[float] = None
    hbm_bandwidth_tb_s: Optional[float] = None
    # Dense (no 2:4 sparsity) peak TFLOP/s per device by compute precision; null = unknown.
    peak_tflops_bf16: Optional[float] = None
    peak_tflops_fp8: Optional[float] = None
    peak_tflops_fp4: Optional[float] = None
    # Maximum achievable matmul TFLOP/s per device: the best-shape bf16 / FP8 GEMM as measured (mamf-finder,
    # ml-engineering's comparison table). The step model's GEMM fractions are of this rate, so one fitted
    # fraction carries across GPUs whose GEMMs reach different fractions of their datasheet peak (A100 0.87,
    # H100 0.80, B200 0.78, GB200 0.73). null = not measured: 0.8 of the peak.
    matmul_tflops_bf16: Optional[float] = None
    matmul_tflops_fp8: Optional[float] = None
    # Bidirectional NVLink bandwidth per device, GB/s.
    nvlink_bandwidth_gb_s: Optional[float] = None
    # Scale-out (NIC) bandwidth per device, GB/s.
    scaleout_bandwidth_gb_s: Optional[float] = None
    # The software stack the planner assumes on this platform: Transformer Engine present (TE layers, flash
    # attention, grouped experts, fused Adam) or not (the local spec: unfused attention, sequential experts,
    # torch's Adam). stage=run detects it on the machine instead (moe_hydra.core.resolved.Implementation).
    transformer_engine: bool = False
    # The flex dispatcher preset (conf/dispatcher) the workflow tries first on this platform: deepep on
    # NVL8, hybridep on NVL72 (docs/workflow.md). The layout search tries it with every layout; null: none.
    flex_dispatcher: Optional[str] = None
    # Run-to-run noise of the mean step time, relative: what two runs of one config may differ by. compare
    # calls a one-run-per-arm difference only beyond it (repeated arms measure it instead). Calibrate with
    # benchmarks/decision_quality.py.
    run_to_run_noise: float = 0.02
    # A calibration.json of this machine (python -m moe_hydra stage=calibrate): stage=plan, the search and tune predict
    # the step time from what it measured instead of the fitted priors (docs/calibrate.md); null: the priors.
    calibration: Optional[str] = None
    # The environment every rank of a run gets (NCCL_*, NVTE_*, CUDA_DEVICE_MAX_CONNECTIONS, HybridEP's NUM_OF_*, ...),
    # as NVIDIA's performance recipes set it for this GPU kind; set per key (hardware.env.NCCL_NVLS_ENABLE=1), add
    # one (+hardware.env.NCCL_IB_HCA=mlx5), drop one (~hardware.env.NVTE_FWD_LAYERNORM_SM_MARGIN). It wins over the
    # variable in the launching shell; env.json and the contract record what the ranks ran with.
    env: Dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    """Compute precision. fp8/fp4 recipes run through Transformer Engine on top of bf16 params."""

    name: str = MISSING
    params_dtype: str = "bf16"  # bf16 | fp16 | fp32
    fp8: Optional[str] = None  # e4m3 | hybrid
    fp8_recipe: Optional[str] = None  # tensorwise | delayed | blockwise | mxfp8
    fp4: Optional[str] = None  # e2m1
    fp4_recipe: Optional[str] = None  # nvfp4
    # Keep the weights in FP8 (Megatron-Core's fp8_param; the parameter all-gather moves FP8): 1 byte a weight, the
    # distributed optimizer's fp32 master copy unchanged. Needs an fp8 recipe.
    fp8_param_gather: bool = False
    # Core attention in FP8 too (Megatron-Core's fp8_dot_product_attention): Transformer Engine's fused attention on
    # the FP8 tensor cores. Needs an fp8 recipe and TE's fused attention.
    fp8_dot_product_attention: bool = False


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """Both meshes of Parallel Folding, sharing PP.

    attention mesh: world = TP x CP x DP x PP       expert mesh: world = ETP x EP x EDP x PP
    DP and EDP are derived by :class:`moe_hydra.core.layout.Layout`.
    """

    tensor_model_parallel_size: int = 1
    context_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    # Model chunks per pipeline rank (interleaved 1F1B); null = not interleaved.
    virtual_pipeline_model_parallel_size: Optional[int] = None
    # Stage string such as "Et|(tt|)*30mL" (E embedding, t layer, m MTP, L loss, | stage boundary).
    pipeline_model_parallel_layout: Optional[str] = None
    num_layers_in_first_pipeline_stage: Optional[int] = None
    num_layers_in_last_pipeline_stage: Optional[int] = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    sequence_parallel: bool = False
    cp_comm_type: str = "p2p"  # p2p | all_gather | a2a | a2a+p2p
    hierarchical_context_parallel_sizes: Optional[List[int]] = None
    expert_model_parallel_size: int = 1
    # null = tensor_model_parallel_size (Megatron's default); 1 is the usual choice.
    expert_tensor_parallel_size: Optional[int] = None
    # Rank order tp-cp-ep-pp-dp instead of the default tp-cp-ep-dp-pp.
    use_tp_pp_dp_mapping: bool = False


@dataclass(kw_only=True, slots=True)
class RecomputeConfig:
    name: str = MISSING
    recompute_granularity: Optional[str] = None  # null | selective | full
    recompute_method: Optional[str] = None  # uniform | block (full only)
    recompute_num_layers: Optional[int] = None  # full only
    # Selective only: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts.
    recompute_modules: Optional[List[str]] = None


@dataclass(kw_only=True, slots=True)
class OffloadConfig:
    name: str = MISSING
    fine_grained_activation_offloading: bool = False
    # attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act.
    offload_modules: List[str] = field(default_factory=list)
    optimizer_cpu_offload: bool = False
    # Fraction of the optimizer state kept on the CPU, 0..1.
    optimizer_offload_fraction: float = 0.0


@dataclass(kw_only=True, slots=True)
class DispatcherConfig:
    name: str = MISSING
    moe_token_dispatcher_type: str = MISSING  # allgather | alltoall | flex
    # flex only: deepep | hybridep.
    moe_flex_dispatcher_backend: Optional[str] = None
    # SMs given to the flex kernels; mapped to the installed megatron-core's field names by
    # moe_hydra.core.versions (moe_deepep_num_sms / moe_hybridep_num_sms / moe_flex_dispatcher_num_sms).
    num_sms: Optional[int] = None


@dataclass(kw_only=True, slots=True)
class RoutingConfig:
    """Routing semantics. Anything but natural dropless routing makes a run benchmark-only."""

    name: str = MISSING
    moe_router_force_load_balancing: bool = False
    # null = dropless; a value enables token drop at that capacity.
    moe_expert_capacity_factor: Optional[float] = None
    moe_pad_expert_input_to_capacity: bool = False
    moe_token_drop_policy: str = "probs"
    moe_router_dtype: Optional[str] = "fp32"
    moe_router_padding_for_quantization: bool = False


@dataclass(kw_only=True, slots=True)
class KernelsConfig:
    moe_grouped_gemm: bool = False
    moe_permute_fusion: bool = False
    moe_router_fusion: bool = False
    cuda_graph_impl: str = "none"  # none | local | transformer_engine | full_iteration
    cuda_graph_scope: List[str] = field(default_factory=list)
    # Megatron-Core's TransformerConfig.attention_backend: auto | flash | fused | unfused | local. With Transformer
    # Engine, auto / flash / fused run a fused kernel that keeps no score matrix; unfused (TE's) and local
    # (Megatron-Core's DotProductAttention) materialise the scores. Without TE every backend runs the local one.
    attention_backend: str = "auto"
    # Megatron-Core's TransformerConfig.bias_activation_fusion: the MLPs' bias add and (gated) activation in one
    # kernel. On, as Megatron-Bridge's performance recipes and Megatron-LM's command line run it (Megatron-Core's
    # own default is off); it runs with TE on a GPU, for an activation Megatron-Core fuses (Resolved.impl.activation)
    bias_activation_fusion: bool = True


@dataclass(kw_only=True, slots=True)
class OverlapConfig:
    overlap_grad_reduce: bool = False
    # Megatron-Core's DistributedDataParallelConfig.bucket_size: parameters (elements) per gradient bucket, each
    # bucket one reduce launched as soon as its gradients are ready. null: Megatron-Core's max(40M, 1M x DP). It
    # only applies with overlap_grad_reduce (without it Megatron-Core reduces everything as one bucket).
    bucket_size: Optional[int] = None
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    # Interleaved-PP send/recv overlap; batch_p2p_comm = not overlap_p2p_comm.
    overlap_p2p_comm: bool = True
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    moe_shared_expert_overlap: bool = False


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    optimizer: str = "adam"  # adam | sgd | muon (memory: Muon keeps one momentum buffer, as SGD)
    lr: float = 1.0e-4
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    use_distributed_optimizer: bool = True
    num_distributed_optimizer_instances: int = 1
    use_precision_aware_optimizer: bool = False
    # The DDP gradient buffer (accumulation and reduce-scatter) in fp32. Megatron-LM turns it on for bf16
    # training; Megatron-Core's DDP default and Megatron-Bridge's benchmark mode leave it off (bf16 buffer).
    grad_reduce_in_fp32: bool = True
    # Main grads / params and Adam moments of the precision-aware optimizer (fp32 without it).
    main_grads_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    micro_batch_size: int = 1
    # Defaults to the model preset's published batch. null = micro_batch_size x world size: the same
    # for every layout of one world size (so layouts compare), and TP x CP x PP micro-batches per
    # data-parallel rank, enough to fill any pipeline.
    global_batch_size: Optional[int] = II("model.global_batch_size")
    seq_length: int = II("model.seq_length")
    # Steps to run; defaults to the last step of the contract window, and for contract.window=auto to the most it
    # steps looking for a steady segment (AUTO_MAX_STEPS, 200).
    train_iters: int = II("moe_hydra.last_step:${contract.window}")
    # Print a metrics line every N steps (rank 0).
    log_interval: int = 1
    # Draw every weight from (seed, its global name), so any layout of the model starts from the same
    # weights and loss curves compare step by step across layouts (moe_hydra.job.weights).
    layout_invariant_init: bool = True
    # Raise inside the job at this step: exercises failure reporting end to end (tests, launchers).
    fail_at_step: Optional[int] = None


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """What the job trains on (docs/data.md). ``mock``: synthetic tokens, benchmark-only by definition.
    ``megatron``: Megatron's indexed ``.bin``/``.idx`` datasets read through Megatron-Core's
    BlendedMegatronDatasetBuilder and GPTDataset, as production runs read them."""

    kind: str = "mock"
    # Megatron's --data-path: prefixes ([A, B]), or weights and prefixes in turn ([0.3, A, 0.7, B]); strings, as
    # on Megatron's command line (a number typed here becomes its text). data.kind=megatron only.
    path: Optional[List[str]] = None
    # Megatron's --split: train,valid,test weights over each prefix's documents; the job trains on the train part.
    split: str = "969,30,1"
    # The samples' shuffle (GPTDatasetConfig.random_seed; mock: the tokens' generator).
    seed: int = 1234
    # Megatron's --data-cache-path: where the dataset's sample indices are cached; null: <run dir>/data_cache.
    # Not part of the contract (it changes where, not what).
    path_to_cache: Optional[str] = None
    # Megatron's mmap_bin_files (--no-mmap-bin-files sets false): read the .bin through mmap or file reads.
    mmap_bin_files: bool = True


@dataclass(kw_only=True, slots=True)
class MemoryConfig:
    """The memory estimate's declared allowances (moe_hydra.planning.memory) and what stage=run does with it."""

    # stage=run refuses a layout whose estimate exceeds hardware.memory_gib; false runs it anyway.
    refuse_unfit: bool = True
    # What no estimator sees, declared per rank (GiB): CUDA context and library workspaces,
    cuda_context_gib: float = 0.75
    # NCCL communicator buffers (more process groups, more buffers),
    nccl_gib: float = 1.5
    # DeepEP / HybridEP buffers (flex dispatcher only),
    flex_dispatcher_gib: float = 2.0
    # CUDA-graph pools (kernels.cuda_graph_impl != none; full-iteration graphs can need far more),
    cuda_graphs_gib: float = 4.0
    # and caching-allocator fragmentation, as a fraction of the estimate.
    fragmentation: float = 0.05


@dataclass(kw_only=True, slots=True)
class ContractConfig:
    """How a run is measured. Steps are 1-based; warmup steps never enter a statistic."""

    warmup_steps: int = 3
    # ``auto``: the job steps (up to train.train_iters) until its step times have a steady segment of steady_steps
    # after their last change of level (moe_hydra.core.steady), and measures that segment; the contract holds
    # ``auto``, not the window found. Or a steady window [first, last], inclusive, first > warmup_steps, judged
    # after the run (results.json: steady).
    window: Any = AUTO
    # The shortest last level of a run's step times that counts as steady (its judgment, results.json: steady),
    # and what contract.window=auto measures.
    steady_steps: int = STEADY_STEPS
    # Read the machine's reference (moe_hydra.job.calibrate.Reference: fixed work, outside the timed steps) after
    # every Nth step of the window, from its first: how fast the machine was while this run measured, which carries
    # a calibration's prediction to it (results.json: machine_reference, step_time_carried). 0 = never.
    reference_every: int = 0


@dataclass(kw_only=True, slots=True)
class LauncherConfig:
    """Where the ranks run. ``local``: processes on this machine. ``slurm``: one Slurm job per point,
    one task per rank; these fields feed ``hydra.launcher`` (conf/launcher/slurm.yaml)."""

    name: str = MISSING
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    # Wall-clock limit of each point's job, minutes.
    timeout_min: int = 60
    cpus_per_task: Optional[int] = None
    # Memory per node, GB; null = the partition's default.
    mem_gb: Optional[int] = None
    # Seconds before the limit that Slurm warns the job (USR2).
    signal_delay_s: int = 120
    # Shell lines run in the batch script before srun (modules, environment).
    setup: List[str] = field(default_factory=list)
    # Extra srun arguments, e.g. [--container-image=nvcr.io/nvidia/pytorch:25.09-py3, --container-mounts=...].
    srun_args: List[str] = field(default_factory=list)
    # Any other #SBATCH option, e.g. {exclusive: true}.
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    # How many points of one job array (the points of a sweep that share their resources) run at once.
    array_parallelism: int = 256
    # Queue the sweep and return (sweep.json holds the Slurm job ids); follow it with python -m moe_hydra.sweep
    # status|wait|cancel <sweep dir>. false: wait for every point, as before.
    detach: bool = False
    # Requeues of a point that reaches its time limit (Slurm's USR2, launcher.signal_delay_s before it), through
    # submitit's checkpoint; a preempted point is requeued whatever this says. Each attempt measures from scratch.
    max_num_timeout: int = 0
    # The command that starts Python on the nodes; null: the Python that submits (inside a container: e.g. python).
    python: Optional[str] = None
    # Containers through pyxis/enroot (srun --container-*); null / empty: not set. The sweep directory is mounted
    # at its own path unless a mount holds it already.
    container_image: Optional[str] = None
    # src:dst[:flags] each (srun --container-mounts).
    container_mounts: List[str] = field(default_factory=list)
    container_workdir: Optional[str] = None
    # A named container, kept on the node between jobs (--container-name).
    container_name: Optional[str] = None
    # Variables taken from the job's environment into the container (--container-env).
    container_env: List[str] = field(default_factory=list)
    # true/false: --container-mount-home / --no-container-mount-home; null: pyxis's default.
    container_mount_home: Optional[bool] = None
    # true/false: --container-remap-root / --no-container-remap-root; null: pyxis's default.
    container_remap_root: Optional[bool] = None
    # true/false: --container-writable / --container-readonly; null: pyxis's default.
    container_writable: Optional[bool] = None
    # launcher=local and stage=fit: start the ranks (the fit's builds) forked from a warm server that has imported
    # torch and Megatron-Core already (moe_hydra.job.warm), instead of fresh interpreters: seconds less per start,
    # the same losses. null = on for a CPU job on a machine without GPUs, else off (never run on a GPU machine:
    # docs/cpu.md); the environment variable MOE_HYDRA_WARM=0 or =1 overrides it. profile.tool=nsys starts cold.
    warm: Optional[bool] = None


@dataclass(kw_only=True, slots=True)
class LoggerConfig:
    name: str = MISSING
    project: str = "moe_hydra"
    # online | offline | disabled; null = WANDB_MODE, else offline without WANDB_API_KEY, online with one.
    mode: Optional[str] = None
    # The W&B group (the comparison); null = <sweep dir>-<contract_hash>.
    group: Optional[str] = None
    # A W&B history row (and the routers' counts) every N steps, logged while the run runs (moe_hydra.job.live);
    # null = every step for runs under 100 steps, else every 10th (contract.window=auto: every step up to step 100).
    log_interval: Optional[int] = None


@dataclass(kw_only=True, slots=True)
class CompareConfig:
    """How A/B verdicts read the noise between runs (``python -m moe_hydra.compare``) and how ``repeat=auto`` decides
    (moe_hydra.launch.sequential). Best set once per cluster in a site file. Not part of the contract."""

    # A noise.json from ``python -m moe_hydra.noise`` (the measured run-to-run noise): compare judges one-run arms
    # with it, repeat=auto pools it with its runs; relative paths are taken from $MOE_HYDRA_SITE when set. null: the
    # declared hardware.run_to_run_noise (a floor; repeated arms measure their own).
    noise_file: Optional[str] = None
    # The equivalence margin, relative (0.05: equivalent when the 90 % interval of the difference lies within
    # +-5 %, a TOST at alpha a side). Declared, never derived from the noise; a machine too noisy to show it within
    # the runs says undecided and how many runs per arm would.
    equivalence: float = EQUIVALENCE
    # repeat=auto: at most this many runs per arm.
    max_repeats: int = 8
    # The false-verdict rate of every verdict (two-sided for a difference; each one-sided test of equivalence).
    alpha: float = 0.05
    # repeat=auto for a loop that only wants "faster" (tune sets it): the smallest gain worth finding, relative. A
    # look that rules it out (B's gain at most this, one-sided 80 %) stops the arm: no verdict, fewer runs. The stop
    # is non-binding: the false-"faster" rate stays at alpha. null: every arm runs until decided or the cap.
    futility: Optional[float] = None
    # Set by repeat=auto on the command line (repeat is an integer): run the sweep's arms in rounds until decided.
    sequential: bool = False


# What tune.allow may name: the changes that alter numerics or the label, which the loop leaves alone otherwise.
TUNE_ALLOW = ("precision", "routing", "data")


@dataclass(kw_only=True, slots=True)
class TuneConfig:
    """``python -m moe_hydra.tune``: the evidence-gated loop run by itself (moe_hydra.launch.tune, docs/tune.md).
    Not part of the contract."""

    # The most A/B trials of the retune stage (each a repeat=auto sequential test against the incumbent).
    max_trials: int = 16
    # The most GPU-hours (processes x wall hours on the CPU) the whole loop may spend, every stage's runs counted.
    budget_gpu_hours: float = 8.0
    # Changes that alter numerics or the label, allowed to be tried: any of precision, routing, data.
    allow: List[str] = field(default_factory=list)
    # The layouts of the scale stage's tie set screened with real runs, at most.
    screen_top_k: int = 4
    # Runs per arm of each retune A/B, at most (compare.max_repeats of its repeat=auto).
    max_repeats: int = 4
    # The smallest gain a retune candidate is worth (relative): its A/B stops once a gain this large is ruled out
    # (compare.futility of its repeat=auto).
    min_gain: float = 0.05
    # The steady window of the screening, profile and retune runs: auto (each run steps until it is steady, up to
    # train.train_iters), or [first, last] after contract.warmup_steps (its first step - 1).
    window: Any = AUTO
    # Steps of the validation run (>= 50: the acceptance gate's), its steady window the last 10.
    validate_steps: int = 50


@dataclass(kw_only=True, slots=True)
class CalibrateConfig:
    """``stage=calibrate``: what it measures (moe_hydra.job.calibrate, docs/calibrate.md). Not part of the contract."""

    # The layouts whose steps it measures: all (every layout of the job's processes the job can run) | plan.
    layouts: CalibratedLayouts = CalibratedLayouts.all
    # Config groups whose other options it measures on each layout too (their cost on the layers' time, as a
    # factor): recompute (none, selective, full), dispatcher (alltoall, allgather; MoE models).
    variants: List[str] = field(default_factory=lambda: ["recompute", "dispatcher"])
    # Timed steps of each measured shape, after 3 discarded on a new model (1 on one already stepped).
    step_repeats: int = 6


@dataclass(kw_only=True, slots=True)
class BisectConfig:
    """``python -m moe_hydra.bisect``: which change made it slow, by delta debugging over the units that separate a
    good configuration from a bad one (moe_hydra.launch.bisect, docs/bisect.md). Not part of the contract."""

    # The most A/B trials of the search (each a repeat=auto sequential test against good), the reproduction not
    # counted.
    max_trials: int = 24
    # Runs per arm of each A/B, at most (compare.max_repeats of its repeat=auto).
    max_repeats: int = 8
    # The steady window of the trials' runs: auto (each run steps until it is steady, up to train.train_iters), or
    # [first, last] after contract.warmup_steps (its first step - 1).
    window: Any = AUTO
    # Profile good and the culprit (profile=window) and name the walls that moved.
    profile: bool = True


@dataclass(kw_only=True, slots=True)
class ProfileConfig:
    """The workflow's profile stage (``profile=window``): a declared window of steady steps traced on every rank
    (moe_hydra.job.profile), its wall time split into the Three Walls in ``profile.json`` (moe_hydra.core.walls).
    ``profile=none`` traces nothing."""

    name: str = MISSING  # none | window
    # torch: torch.profiler on every rank (CPU activities, and CUDA's on a GPU), a trace per rank and profile.json;
    # nsys: each rank under ``nsys profile`` with a capture range over the window (cudaProfilerStart/Stop); GPUs only.
    tool: str = "torch"
    # [first, last] profiled steps, 1-based, inclusive; null: the ``num_steps`` steps after contract.window, which
    # the run then also trains, so the measured window stays unprofiled.
    steps: Optional[List[int]] = None
    num_steps: int = 5
    # rows of each top list (kernels or ops, collectives) in profile.json
    top: int = 10


@dataclass(kw_only=True, slots=True)
class StepModelConfig:
    """The sustained fractions of the hardware's peaks the layout search's step-time model uses
    (moe_hydra.planning.step_model). Fitted to the measured runs of benchmarks/data/measured_runs.yaml, each
    source weighing the same, the hardware rates held near kernel and NCCL benchmarks' figures where the runs do
    not pin them (moe_hydra.planning.calibration: FREE, PRIOR; the fitted ones below), judged on the sources
    left out of the fit; refit them to your cluster's screening runs. The defaults are read from
    moe_hydra/core/step_model_fit.json (its ``fitted`` and ``priors``), which
    ``benchmarks/step_model_calibration.py --fit --write`` writes; they are written nowhere else."""

    # Fitted: dense GEMMs (attention projections, dense/shared MLPs, logits) in bf16, fraction of the best-shape
    # matmul rate (hardware.matmul_tflops_bf16; 0.8 of the peak where it is not declared);
    gemm_efficiency: float = step_model_fit.default("gemm_efficiency")
    # core (flash) attention, forward + backward, fraction of the bf16 peak;
    attention_efficiency: float = step_model_fit.default("attention_efficiency")
    # collectives and the all-to-all over the scale-out NIC, fraction of its bandwidth;
    scaleout_efficiency: float = step_model_fit.default("scaleout_efficiency")
    # rows per expert GEMM at which grouped expert GEMMs run at half the dense GEMM rate;
    expert_rows_half: float = step_model_fit.default("expert_rows_half")
    # collectives and the all-to-all inside the NVLink domain, fraction of half the bidirectional bandwidth;
    nvlink_efficiency: float = step_model_fit.default("nvlink_efficiency")
    # host time per MoE layer per micro-batch, forward + backward (launches, the dispatcher's syncs);
    host_ms_per_moe_layer: float = step_model_fit.default("host_ms_per_moe_layer")
    # the fraction of the all-to-all that EP overlap hides under another micro-batch's compute;
    ep_overlap_efficiency: float = step_model_fit.default("ep_overlap_efficiency")
    # GEMMs in FP8 / MXFP8 / NVFP4: fraction of that precision's best-shape matmul rate (hardware.matmul_tflops_fp8;
    # FP4 at its fraction of the peak), quantisation kernels included;
    low_precision_gemm_efficiency: float = step_model_fit.default("low_precision_gemm_efficiency")
    # host time CUDA graphs of a partial scope leave (kernels.cuda_graph_scope; a whole-iteration graph
    # leaves none), fraction of the above;
    cuda_graph_host_fraction: float = step_model_fit.default("cuda_graph_host_fraction")
    # GPU time per MoE layer per micro-batch, forward + backward, in its small kernels (router, top-k,
    # permutation indices and counts) that run at no GEMM or bandwidth rate;
    gpu_ms_per_moe_layer: float = step_model_fit.default("gpu_ms_per_moe_layer")
    # unfused core attention (no Transformer Engine, or attention_backend unfused / local): HBM bytes each score of
    # the full matrix moves through the kernels between its two GEMMs, forward + backward (prior 30: the scores
    # written, scaled, masked and softmaxed, dropped out with a 1-byte mask, read by the second GEMM; the same
    # backward); vTrain's A100 runs and the H200 slice.
    unfused_attention_bytes_per_score: float = step_model_fit.default("unfused_attention_bytes_per_score")
    # ms per model chunk and micro-batch at a pipeline stage boundary that overlap does not hide (the send /
    # receive pair posted and waited for, forward + backward; the runs barely pin it: within 0-1 ms it has moved
    # from 0.0105 to 0.0704 to 0.0029 as other terms changed, at about the same error);
    pipeline_ms_per_chunk: float = step_model_fit.default("pipeline_ms_per_chunk")
    # Priors (the dataset does not decide them): a dense layer launches about a quarter of a MoE layer's
    # kernels and has no dispatcher sync;
    host_ms_per_dense_layer: float = step_model_fit.default("host_ms_per_dense_layer")
    # sequential experts (no grouped GEMM): host time per local expert per MoE layer per micro-batch,
    # forward + backward (one H200 without TE: ~0.4 s per micro-batch for 128 experts x 4 layers).
    host_ms_per_local_expert: float = step_model_fit.default("host_ms_per_local_expert")
    # the kernels between the GEMMs (norms, residual adds, RoPE, activations, MoE permutation): fraction of
    # the HBM bandwidth such streaming kernels sustain (about STREAM's on these GPUs).
    hbm_efficiency: float = step_model_fit.default("hbm_efficiency")


@dataclass(kw_only=True, slots=True)
class Config:
    """The root: what ``python -m moe_hydra`` composes."""

    stage: Stage = Stage.run
    seed: int = 1234
    # Repeat index: sweep it (repeat=0,1,2) to run an arm several times; not part of the contract.
    repeat: int = 0
    tags: List[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    dispatcher: DispatcherConfig = field(default_factory=DispatcherConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    contract: ContractConfig = field(default_factory=ContractConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    step_model: StepModelConfig = field(default_factory=StepModelConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    bisect: BisectConfig = field(default_factory=BisectConfig)
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def leaves(cls: type = None, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, type) of every field under a schema dataclass (the root :class:`Config` by default)."""
    import dataclasses
    import typing

    cls = cls or Config
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            yield from leaves(t, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", t


def unwrapped(t: Any) -> Any:
    """A field's type without ``Optional``: ``Optional[int]`` -> ``int``; any other type as it is."""
    import typing

    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if typing.get_origin(t) is typing.Union and len(args) == 1 else t


@functools.lru_cache(maxsize=1)
def _structured() -> Any:
    """The schema as a structured config, made once per process: most of :func:`typed`'s cost (``OmegaConf.merge``
    leaves it as it was)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(Config)


def typed(cfg: Any) -> Config:
    """A composed config (a DictConfig, its ``hydra`` node left out) as these dataclasses."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(_structured(),
                                               OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])))


def register_configs() -> None:
    """Register the root schema as ``base_config``; ``conf/config.yaml`` extends it. Its ``--help`` template lists
    the exit codes through the resolver ``moe_hydra.exit_codes`` (:mod:`moe_hydra.core.errors`), registered here."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, MEANINGS, exit_code_lines

    ConfigStore.instance().store(name="base_config", node=Config)
    if not OmegaConf.has_resolver("moe_hydra.exit_codes"):
        run_exits = {code: MEANINGS[code] for code in (EXIT_OK, EXIT_FAILED, EXIT_REFUSED)}
        OmegaConf.register_new_resolver("moe_hydra.exit_codes", lambda: exit_code_lines(run_exits, True, indent=""))
