"""The resolved plan: everything derived from a composed config, computed once, read by every stage.

:func:`resolve` turns a composed config into a frozen :class:`Resolved`: the layout with every derived size
(:class:`~moe_hydra.core.layout.Layout`), the model's facts (:class:`~moe_hydra.core.arch.Arch`), the
pipeline split (which layers, embedding, loss and MTP blocks each pipeline rank holds), the batch, and the
implementation that will run. The rules, the memory estimate, the step-time model, the layout search, the fit
and the job read it; none of them derives a layout, a batch or an implementation fact again. Its
:meth:`Resolved.as_dict` is the body of ``plan.json``'s ``parallel``, ``batch``, ``pipeline`` and
``implementation``.

The walk of one size, e.g. ``parallel.expert_model_parallel_size`` from ``expert_mesh=ep8``: Hydra composes
``conf/expert_mesh/ep8.yaml`` into the config -> :meth:`Layout.from_config` reads it once, as ``Layout.ep``
(with ``expert_tensor_parallel_size: null`` resolved to TP there too) -> ``Resolved.layout`` -> the rules
(``Ctx.layout``), the estimate, and the job's ``initialize_model_parallel`` and ``TransformerConfig`` (both
from ``Layout.to_megatron()``).

Numbers outside their domain (:mod:`moe_hydra.core.bounds`: a size below 1, a fraction above 1, NaN, a world of
more than a million GPUs) are refused here, when the plan is built, before any arithmetic, all at once (S02).
Whether the sizes fit together is the rules' business (:mod:`moe_hydra.planning.rules`): a resolved plan may be
illegal (DP 0 when the world does not divide, no pipeline split), and the rules say why.

Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from moe_hydra.core import bounds
from moe_hydra.core.arch import Arch, activation_fusable
from moe_hydra.core.layout import Layout
from moe_hydra.core.pipeline import RankLayers, assign
from moe_hydra.core.steady import AUTO, AUTO_HISTORY
from moe_hydra.core.violations import LayoutError

# Config nodes that no derived fact (layout, split, batch, implementation) reads.
SETTINGS = ("recompute", "offload", "dispatcher", "routing", "overlap", "optimizer", "memory", "step_model")


@dataclass(frozen=True, slots=True)
class Batch:
    """What one step trains. ``train.global_batch_size: null`` is micro batch x world size."""

    micro_batch_size: int
    global_batch_size: int
    # per data-parallel rank: GBS / (MBS x DP); 0 when the world does not divide into DP (rule L01)
    micro_batches_per_step: int
    seq_length: int

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length

    def as_dict(self) -> dict[str, int]:
        return {"micro_batch_size": self.micro_batch_size, "global_batch_size": self.global_batch_size,
                "micro_batches_per_step": self.micro_batches_per_step, "tokens_per_step": self.tokens_per_step}


# kernels.attention_backend: Megatron-Core's AttnBackend names; those that run a fused attention kernel under
# Transformer Engine (no score matrix kept)
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
FUSED_ATTENTION = ("auto", "flash", "fused")


@dataclass(frozen=True, slots=True)
class Implementation:
    """The modules that will run, which decide what memory and time a layout costs.

    Declared by the hardware preset for planning (``hardware.transformer_engine``: the software stack the
    plan assumes there), detected on the machine for ``stage=run`` (:func:`moe_hydra.launch.local.implementation`).
    """

    # Megatron-Core layer spec: transformer_engine (TE layers) | local (torch layers, the CPU path and GPUs without TE)
    layer_spec: str
    # core attention: flash (TE's fused kernels, no score matrix kept) | unfused (softmax over the full score matrix:
    # no TE, or kernels.attention_backend=unfused | local)
    attention: str
    # routed experts: grouped (one grouped GEMM per expert group) | sequential (a loop over the local experts)
    experts: str
    # Adam: fused (TE / Apex) | torch (Megatron's fallback, which holds an fp32 temporary of the shard it steps)
    optimizer: str
    # the MLPs' bias add and activation: fused (one kernel, bias_activation_fusion: kernels.bias_activation_fusion
    # with TE on a GPU, for an activation Megatron-Core fuses) | unfused (torch ops, each through HBM)
    activation: str
    # what CUDA graphs capture: kernels.cuda_graph_scope; ("full",) (whole layers) when graphs are on with no scope
    # listed; ("full_iteration",) for cuda_graph_impl=full_iteration; () when graphs are off
    cuda_graph_scope: tuple[str, ...]
    # where these facts come from
    source: str

    @classmethod
    def of(cls, cfg: Any, *, gpu: bool, te: bool, grouped_gemm: bool, apex: bool, source: str) -> Implementation:
        """What Megatron-Core builds for ``cfg`` with these packages on this kind of device."""
        te = te and gpu
        k = cfg.kernels
        return cls(
            layer_spec="transformer_engine" if te else "local",
            attention="flash" if te and k.attention_backend in FUSED_ATTENTION else "unfused",
            experts="grouped" if k.moe_grouped_gemm and gpu and (te or grouped_gemm) else "sequential",
            optimizer="fused" if gpu and (te or apex) else "torch",
            activation="fused" if te and k.bias_activation_fusion and activation_fusable(cfg.model) else "unfused",
            cuda_graph_scope=_graphed(k),
            source=source,
        )

    @classmethod
    def declared(cls, cfg: Any) -> Implementation:
        """The implementation the hardware preset declares (planning: the plan is made anywhere)."""
        hw = cfg.hardware
        return cls.of(cfg, gpu=hw.arch != "cpu", te=hw.transformer_engine, grouped_gemm=False,
                      apex=hw.transformer_engine,
                      source=f"declared by hardware={hw.name} (hardware.transformer_engine="
                             f"{str(hw.transformer_engine).lower()})")

    @property
    def te(self) -> bool:
        return self.layer_spec == "transformer_engine"


@dataclass(frozen=True, slots=True)
class Resolved:
    """A composed config and everything derived from it. Build it with :func:`resolve`."""

    cfg: Any  # the typed config (moe_hydra.core.schema.Config)
    layout: Layout
    arch: Arch | None  # None when model.moe_layer_freq cannot be read (rule L13 says why)
    split: tuple[RankLayers, ...] | None  # per pipeline rank; None when no split exists (the pipeline rules say why)
    batch: Batch
    impl: Implementation
    # the steps the job trains: train.train_iters, or through the profiled steps when they come later
    train_iters: int
    # [first, last] steps traced by profile=window (after contract.window unless profile.steps says otherwise);
    # None: profile=none, profile.steps is not [first, last] (rule C02 says why), or contract.window=auto (the job
    # traces the profile.num_steps steps after the window it finds)
    profile_steps: tuple[int, int] | None

    def with_settings(self, **nodes: Any) -> Resolved:
        """This plan with other values of config nodes that no derived fact reads (:data:`SETTINGS`): what
        :func:`resolve` gives for the config with those nodes, without deriving the same facts again (the layout
        search tries every recompute level and communication setting on each candidate)."""
        unknown = set(nodes) - set(SETTINGS)
        if unknown:
            raise ValueError(f"{sorted(unknown)} change what the plan derives; resolve the config instead")
        return replace(self, cfg=replace(self.cfg, **nodes))

    @property
    def window(self) -> tuple[int, int]:
        """The steady window the plan predicts: ``contract.window``, or for ``contract.window=auto`` the first the
        job can stop on (a series steady from its first judged step: the 2 x ``contract.steady_steps`` steps after
        the warmup, :func:`moe_hydra.core.steady.settled`; a warm-up moves it later)."""
        k = self.cfg.contract
        if k.window == AUTO:
            return k.warmup_steps + 1, k.warmup_steps + AUTO_HISTORY * k.steady_steps
        return int(k.window[0]), int(k.window[-1])

    @property
    def experts_per_rank(self) -> int:
        """Routed experts on each expert-parallel rank (Megatron's ``num_local_experts``)."""
        return self.arch.experts // self.layout.ep if self.arch and self.arch.experts else 0

    def as_dict(self) -> dict[str, Any]:
        """The plan's resolved facts, in Megatron-Core's names (the body of ``plan.json``)."""
        lo = self.layout
        return {
            "world_size": lo.world_size,
            "min_gpus": lo.min_gpus,
            "layout": lo.describe(),
            "parallel": lo.to_megatron(),
            "experts_per_rank": self.experts_per_rank,
            "pipeline": [{"pp_rank": r.pp_rank, "layers": len(r.layers), "first_layer": r.layers[0] if r.layers else None,
                          "embedding": r.embedding, "loss": r.loss, "mtp": r.mtp} for r in self.split or ()],
            "batch": self.batch.as_dict(),
            "seq_length": self.batch.seq_length,
            "train_iters": self.train_iters,
            "profile_steps": list(self.profile_steps) if self.profile_steps else None,
            "implementation": {**asdict(self.impl), "cuda_graph_scope": list(self.impl.cuda_graph_scope)},
        }


def rank_layers(arch: Arch, layout: Layout, parallel: Any) -> tuple[RankLayers, ...] | None:
    """What each pipeline rank holds (:func:`~moe_hydra.core.pipeline.assign`), or None when the config's split
    cannot be made."""
    try:
        return assign(arch.num_layers, arch.mtp, pp=layout.pp, vpp=layout.vpp,
                      layout=parallel.pipeline_model_parallel_layout,
                      first=parallel.num_layers_in_first_pipeline_stage, last=parallel.num_layers_in_last_pipeline_stage,
                      account_embedding=parallel.account_for_embedding_in_pipeline_split,
                      account_loss=parallel.account_for_loss_in_pipeline_split)
    except ValueError:
        return None


def resolve(cfg: Any, impl: Implementation | None = None, arch: Arch | None = None,
            varied: tuple[str, ...] | None = None) -> Resolved:
    """The resolved plan of a composed config (objects, e.g. ``OmegaConf.to_object(cfg)``).

    ``impl``: the implementation detected on this machine (stage=run); None takes the hardware's declared one.
    ``arch``: the model's facts when the caller has them for this very model (the layout search, whose
    candidates share one model).
    ``varied``: the config nodes in which ``cfg`` differs from a config already resolved (the layout search's
    candidates: ``parallel`` and ``train``): only their bounds are checked again.

    Raises:
        LayoutError: S02, listing every number outside its domain.
    """
    bad = bounds.check(cfg, varied)
    if bad:
        raise LayoutError(bad, f"{cfg.model.name} on {cfg.hardware.name}")
    if arch is None:
        try:
            arch = Arch.from_model(cfg.model)
        except ValueError:
            arch = None
    layout = Layout.from_config(cfg)
    t = cfg.train
    gbs = t.global_batch_size or t.micro_batch_size * layout.world_size
    batch = Batch(t.micro_batch_size, gbs, gbs // (t.micro_batch_size * layout.dp) if layout.dp else 0, t.seq_length)
    split = rank_layers(arch, layout, cfg.parallel) if arch else None
    profiled = profile_steps(cfg)
    iters = max(t.train_iters, profiled[1] if profiled else 0)
    if cfg.contract.window == AUTO and cfg.profile.name != "none":  # profiled after the window found, up to the cap
        iters = t.train_iters + cfg.profile.num_steps
    return Resolved(cfg, layout, arch, split, batch, impl or Implementation.declared(cfg), iters, profiled)


def profile_steps(cfg: Any) -> tuple[int, int] | None:
    """The steps ``profile=window`` traces: ``profile.steps``, or the ``profile.num_steps`` steps after
    ``contract.window``; None for ``profile=none`` or a ``profile.steps`` that is not two numbers."""
    p = cfg.profile
    if p.name == "none":
        return None
    if p.steps is None:
        if cfg.contract.window == AUTO:  # after the window the job finds (moe_hydra.job.train)
            return None
        last = cfg.contract.window[-1]
        return last + 1, last + p.num_steps
    return (p.steps[0], p.steps[1]) if len(p.steps) == 2 else None


def _graphed(kernels: Any) -> tuple[str, ...]:
    """What CUDA graphs capture (:attr:`Implementation.cuda_graph_scope`)."""
    if kernels.cuda_graph_impl == "none":
        return ()
    if kernels.cuda_graph_impl == "full_iteration":
        return ("full_iteration",)
    return tuple(kernels.cuda_graph_scope) or ("full",)
