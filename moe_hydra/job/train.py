"""The job: build the composed MoE with Megatron-Core, train it, and measure it.

Every rank runs :func:`worker` (the local launcher spawns them, or forks them from a warm server; on Slurm each
task is one). The job is the one place that imports torch and megatron. Rank 0 alone writes ``results.json``.

Per step: all ranks meet at a barrier, then the step (forward/backward through Megatron's
pipeline schedule, the optimizer step) is timed on each rank — monotonic clock on the CPU, CUDA
events plus the host clock on a GPU — and the step's time is the slowest rank's. Warmup steps are
run and recorded but never enter a statistic; the steady window is ``contract.window``.

**Every ending is recorded.** SIGINT, SIGTERM and SIGUSR2 (Slurm's timeout, cancel and preemption signals;
submitit's) are caught on every rank (:class:`Signals`): the step under way finishes, the ranks agree at its end
to stop (the flag rides on the step's all-reduce), rank 0 writes ``results.json`` with ``status``
``interrupted`` (SIGINT) or ``terminated`` and every step measured so far, and :class:`Stopped` ends the process
with the conventional code, 128 + the signal's number. A failure writes ``status: failed`` with the error.

``results.json`` (the job's part; the plan's fields are merged in):
    results_version        1 (moe_hydra.core.results)
    run_id                 unique per run: compare counts a run once
    status                 ok | failed (with error) | interrupted | terminated (with signal, stopped_at_step)
    steps, window, window_measured, warmup_steps, step_times_ms, step_time_ms, step_time_counter
    host_times_ms, device_times_ms, host_time_ms, device_time_ms
    tokens_per_s_per_gpu, tflops_per_gpu, flops_per_token, flops_counter, mfu, peak_tflops
    peak_memory_gib, memory_counter, memory_vs_estimate (GPU: the plan's estimate against max allocated),
    memory_phases_gib (GPU: the allocator's peak between steps, in forward/backward, in the optimizer step, and what
    is allocated after the first step)
    loss                   first, last, per_step, all_finite, nan_or_skipped
    evidence               facts read from the built model and optimizer, not from the config
    startup                seconds from the command's start to step 1 on rank 0, and how the ranks started
                           (moe_hydra.core.startup)
    machine_reference      contract.reference_every: the machine's reference read in the window (calibrate.Reference)
    step_time_carried      ... and the plan's calibrated step time carried to the machine as this run found it
"""

from __future__ import annotations

import copy
import dataclasses
import faulthandler
import logging
import os
import signal
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from moe_hydra.core import calibrated_step as cs
from moe_hydra.core import metrics, startup
from moe_hydra.core import results as results_schema
from moe_hydra.core.io import write_json
from moe_hydra.core.resolved import Resolved
from moe_hydra.core.schema import Stage
from moe_hydra.core.steady import AUTO
from moe_hydra.job.auto_window import AutoWindow
from moe_hydra.core.versions import mcore_facts
from moe_hydra.job import warm_server

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
STOP_SIGNALS = tuple(signal.Signals[name] for name in results_schema.SIGNALS)


def cpu_threads(local_world: int) -> int:
    """Intra-op threads for one CPU rank: ``OMP_NUM_THREADS`` when set; else the cores this process may run on
    (its affinity: a Slurm allocation, not the node), less one left to the launcher and the ranks' gloo and logging
    threads, shared among the node's ``local_world`` ranks; at least 1. On the 2-vCPU CI machine one thread ran the
    default job's step faster than two, and with half the run-to-run noise (docs/cpu.md)."""
    if (given := os.environ.get("OMP_NUM_THREADS", "").strip()).isdigit() and int(given) > 0:
        return int(given)
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS
    return max(1, (allowed - 1) // max(1, local_world))


class Stopped(Exception):
    """The job stopped on a signal after recording what it measured; ``code`` is the conventional exit code."""

    def __init__(self, signame: str, step: int):
        self.signame, self.step = signame, step
        self.code = 128 + signal.Signals[signame].value
        super().__init__(f"stopped by {signame} after step {step}")


class Signals:
    """Catches :data:`STOP_SIGNALS` for the life of the job: the first one is remembered (``received``), later
    ones too are absorbed (a terminal's Ctrl-C reaches every rank, and the launcher forwards its own SIGTERM),
    and the previous handlers come back on exit."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        self.received = self.received or signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def worker(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Entry point of every rank. ``spec``: ``resolved`` (the :class:`~moe_hydra.core.resolved.Resolved` plan
    this job builds), ``plan`` (plan.json's record), ``config`` (the composed config, plain, for W&B),
    ``out_dir``, ``env``.

    The distributed environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) comes from the launcher. Returns the results on rank 0, None elsewhere.

    Raises:
        Stopped: a signal stopped the job (its results were written first).
    """
    r: Resolved = spec["resolved"]
    out_dir = Path(spec["out_dir"])
    rank = int(os.environ.get("RANK", "0"))
    # a native crash (SIGSEGV, SIGBUS, SIGABRT in torch, gloo or a kernel) prints every thread's Python stack to the
    # rank's stderr before the process dies: what the launcher's "Segmentation fault" alone does not say
    faulthandler.enable(all_threads=True)
    _warnings_to_file(out_dir / "ranks" / f"warnings.rank{rank}.log")
    warm_server.replay_warnings()  # a rank forked from a warm server: the warnings its imports gave there
    if r.cfg.stage is Stage.calibrate:  # the same launch (local, warm, Slurm), another job: the machine's rates
        from moe_hydra.job import calibrate

        return calibrate.worker(spec, Job(r, spec["plan"]))
    origin = spec.get("startup") or startup.origin("in_process", first=True)
    stamp = {"results_version": results_schema.RESULTS_VERSION, "run_id": uuid.uuid4().hex}  # rank 0's is written
    results = None
    from moe_hydra.job import live, tracking

    live_log = None
    if rank == 0:  # W&B starts beside the model's build
        live_log = live.LiveLog(lambda: tracking.start(spec["config"], spec["plan"], out_dir, spec["plan"]["tracking"],
                                                       r.cfg.logger), out_dir, r.train_iters)
    with Signals() as signals:
        job = Job(r, spec["plan"], spec.get("env"), signals, stamp, origin, live_log)
        try:
            results = job.run(out_dir)
        except BaseException as e:
            if rank == 0:
                results = {**spec["plan"], **stamp, "stage": "run", "status": "failed",
                           "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
                write_json(results, out_dir / "results.json")
            raise
        finally:
            run = live_log.close() if live_log is not None else None
            if run is not None and results is not None:
                tracking.finish(run, results, out_dir, r.cfg.logger)
    if job.stopped_by:
        raise Stopped(job.stopped_by, job.stopped_at)
    return results


def _warnings_to_file(path: Path) -> None:
    """Python warnings (Megatron's fallbacks to non-fused kernels, deprecations) go to one file per
    rank instead of the console: kept, not muted, and out of the metric lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("py.warnings")
    logger.addHandler(handler)
    logger.propagate = False
    logging.captureWarnings(True)


class MemoryPhases:
    """The GPU allocator's peaks by phase of a step (``torch.cuda.max_memory_allocated`` between
    ``reset_peak_memory_stats`` calls): between steps, forward/backward, the optimizer step; what is allocated after
    the first step (weights, gradients, optimizer state); and the run's peaks, kept across the resets."""

    PHASES = ("between_steps", "forward_backward", "optimizer_step")

    def __init__(self):
        import torch

        self.cuda = torch.cuda
        self.peak = [self.cuda.max_memory_allocated(), self.cuda.max_memory_reserved()]  # model build included
        self.phases = dict.fromkeys(self.PHASES, 0)
        self.after_first_step: int | None = None
        self.cuda.reset_peak_memory_stats()

    def end(self, phase: str) -> None:
        """Close ``phase``: record its peak, start the next."""
        allocated, reserved = self.cuda.max_memory_allocated(), self.cuda.max_memory_reserved()
        self.phases[phase] = max(self.phases[phase], allocated)
        self.peak = [max(self.peak[0], allocated), max(self.peak[1], reserved)]
        self.cuda.reset_peak_memory_stats()
        if phase == "optimizer_step" and self.after_first_step is None:
            self.after_first_step = self.cuda.memory_allocated()

    def as_list(self) -> list[float]:
        return [*self.peak, *(self.phases[p] for p in self.PHASES), self.after_first_step or 0]


def live_transformer_config(kw: dict):
    """Megatron-Core's (MLA)TransformerConfig from ``mcore_args.transformer_config_kwargs``' plain values: dtype,
    activation and attention-backend names become the torch / Megatron objects. A field this megatron-core lacks is
    an error when the config sets it (a silent drop would run a different model)."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kw = dict(kw)
    for key in ("params_dtype", "pipeline_dtype"):
        kw[key] = getattr(torch, _DTYPES[kw[key]])
    if kw["activation_func"] == "quick_gelu":
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw["activation_func"] = quick_gelu
    else:
        kw["activation_func"] = getattr(torch.nn.functional, kw["activation_func"])
    if "attention_backend" in kw:
        from megatron.core.transformer.enums import AttnBackend

        kw["attention_backend"] = AttnBackend[kw["attention_backend"]]
    cls = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    known = {f.name for f in dataclasses.fields(cls)}
    dropped = {k: v for k, v in kw.items() if k not in known and v not in (None, False)}
    if dropped:
        raise ValueError(f"megatron-core {mcore_facts().version} has no field(s) {sorted(dropped)} "
                         f"that this config sets: {dropped}")
    return cls(**{k: v for k, v in kw.items() if k in known})


class Job:
    """One rank of the job: :meth:`run` trains and measures. ``stage=fit`` (moe_hydra.job.fit) reuses the setup
    steps — :meth:`init_model_parallel`, :meth:`transformer_config`, :meth:`build_model` — on a fake
    process group."""

    def __init__(self, r: Resolved, plan: dict[str, Any], env_snapshot: dict[str, Any] | None = None,
                 signals: Signals | None = None, stamp: dict[str, Any] | None = None,
                 origin: dict[str, Any] | None = None, live_log: Any = None):
        self.r, self.cfg, self.plan, self.env_snapshot = r, r.cfg, plan, env_snapshot
        self.live_log = live_log  # rank 0's W&B run, fed while the job trains (moe_hydra.job.live.LiveLog)
        self.router_logged: list[tuple[int, list[dict[str, Any]]]] = []  # (step, its routers' layers)
        self.signals, self.stamp = signals, stamp or {}
        self.origin = origin  # where the start-up is measured from (moe_hydra.core.startup.origin)
        self.startup: dict[str, Any] | None = None  # results.json startup, set at step 1
        self.stopped_by: str | None = None  # the signal the ranks agreed to stop on (:class:`Signals`)
        self.stopped_at = 0  # ... after this step
        self.reference: Any = None  # the machine's reference read in the window (contract.reference_every)
        self.auto = self.cfg.contract.window == AUTO  # contract.window=auto: the window is found as the run steps
        self.auto_window: AutoWindow | None = None
        self.measured: tuple[int, int] | None = None  # the window measured, once known
        self.judge_import_s = 0.0  # rank 0's import of the judgment's libraries (0 when a warm server had them)

    # ------------------------------------------------------------------ setup

    def init_distributed(self) -> None:
        """This rank's process group (gloo on the CPU, NCCL on GPUs), threads, CPU shims and both meshes' groups."""
        import torch
        import torch.distributed as dist

        from moe_hydra.job import compat

        self.shims = compat.apply()
        self.on_gpu = torch.cuda.is_available()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if self.on_gpu:
            torch.cuda.set_device(self.local_rank)
        else:
            torch.set_num_threads(cpu_threads(local_world))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if self.on_gpu else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", self.local_rank) if self.on_gpu else torch.device("cpu")
        self.init_model_parallel()

    def for_plan(self, r: Resolved) -> Job:
        """This rank's job for another plan of the same layout, its process groups kept (stage=calibrate's
        shrunken models)."""
        other = copy.copy(self)
        other.r, other.cfg = r, r.cfg
        return other

    def init_model_parallel(self, **extra) -> None:
        """Both meshes' process groups (``extra``: e.g. ``create_gloo_process_groups=False`` for stage=fit)."""
        from megatron.core import parallel_state as ps

        p, lo = self.cfg.parallel, self.r.layout
        ps.initialize_model_parallel(
            tensor_model_parallel_size=lo.tp,
            pipeline_model_parallel_size=lo.pp,
            virtual_pipeline_model_parallel_size=lo.vpp,
            context_parallel_size=lo.cp,
            hierarchical_context_parallel_sizes=p.hierarchical_context_parallel_sizes,
            expert_model_parallel_size=lo.ep,
            expert_tensor_parallel_size=lo.etp,
            num_distributed_optimizer_instances=self.cfg.optimizer.num_distributed_optimizer_instances,
            order="tp-cp-ep-pp-dp" if p.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp",
            **extra,
        )

    def transformer_config(self):
        from moe_hydra.job.mcore_args import transformer_config_kwargs

        return live_transformer_config(transformer_config_kwargs(self.r, mcore_facts(), on_gpu=self.on_gpu))

    def build_model(self, tcfg):
        import torch
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_decoder_block_spec,
            get_gpt_decoder_layer_specs,
            get_gpt_mtp_block_spec,
        )
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.module import Float16Module

        from moe_hydra.job.weights import layout_invariant_init

        m, seed = self.cfg.model, self.cfg.seed
        torch.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)
        use_te = self.r.impl.te
        vpp = self.r.layout.vpp or 1
        chunks, self.redrawn = [], 0
        last_layer = get_gpt_decoder_layer_specs(tcfg, use_te, normalization=m.normalization)[-1]
        for stage in range(vpp):
            vp = stage if vpp > 1 else None
            block = get_gpt_decoder_block_spec(tcfg, use_transformer_engine=use_te, normalization=m.normalization,
                                               vp_stage=vp)
            # MTP blocks take the last decoder layer's type, whichever chunk they sit in (it may hold no layer)
            mtp = get_gpt_mtp_block_spec(tcfg, last_layer, use_transformer_engine=use_te, vp_stage=vp) if m.mtp_num_layers else None
            model = GPTModel(
                config=tcfg,
                transformer_layer_spec=block,
                vocab_size=self.r.arch.padded_vocab(self.r.layout.tp),
                max_sequence_length=self.cfg.train.seq_length,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
                position_embedding_type=m.position_embedding_type,
                rotary_base=m.rotary_base,
                mtp_block_spec=mtp,
                vp_stage=vp,
            )
            if self.on_gpu:
                model.cuda(torch.cuda.current_device())
            if self.cfg.train.layout_invariant_init:
                self.redrawn += layout_invariant_init(
                    model, tcfg, seed,
                    tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
                    etp_rank=ps.get_expert_tensor_parallel_rank(), etp_size=ps.get_expert_tensor_parallel_world_size(),
                    ep_rank=ps.get_expert_model_parallel_rank(),
                )
            if tcfg.bf16 or tcfg.fp16:
                model = Float16Module(tcfg, model)
            chunks.append(model)
        return chunks

    def wrap_and_optimizer(self, tcfg, chunks):
        import torch
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o, ov = self.cfg.optimizer, self.cfg.overlap
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=o.grad_reduce_in_fp32,
            overlap_grad_reduce=ov.overlap_grad_reduce,
            bucket_size=ov.bucket_size,
            overlap_param_gather=ov.overlap_param_gather,
            use_distributed_optimizer=o.use_distributed_optimizer,
            num_distributed_optimizer_instances=o.num_distributed_optimizer_instances,
        )
        model = [
            DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=c, disable_bucketing=i > 0)
            for i, c in enumerate(chunks)
        ]
        dtype = {name: getattr(torch, _DTYPES[name]) for name in _DTYPES}
        opt_cfg = OptimizerConfig(
            optimizer=o.optimizer, lr=o.lr, min_lr=o.lr, weight_decay=o.weight_decay, clip_grad=o.clip_grad,
            bf16=tcfg.bf16, fp16=tcfg.fp16, params_dtype=tcfg.params_dtype,
            use_distributed_optimizer=o.use_distributed_optimizer,
            use_precision_aware_optimizer=o.use_precision_aware_optimizer,
            main_grads_dtype=dtype[o.main_grads_dtype], main_params_dtype=dtype[o.main_params_dtype],
            exp_avg_dtype=dtype[o.exp_avg_dtype], exp_avg_sq_dtype=dtype[o.exp_avg_sq_dtype],
            overlap_param_gather=ov.overlap_param_gather,
            optimizer_cpu_offload=self.cfg.offload.optimizer_cpu_offload,
            optimizer_offload_fraction=self.cfg.offload.optimizer_offload_fraction,
        )
        optimizer = get_megatron_optimizer(opt_cfg, model)
        self.built_configs = (tcfg, ddp_cfg, opt_cfg)  # as handed to Megatron-Core (megatron_configs.json)
        tcfg.finalize_model_grads_func = finalize_model_grads
        if tcfg.fp16:
            tcfg.grad_scale_func = optimizer.scale_loss
        if ov.overlap_grad_reduce:
            tcfg.no_sync_func = [m.no_sync for m in model] if len(model) > 1 else model[0].no_sync
            tcfg.grad_sync_func = [m.start_grad_sync for m in model] if len(model) > 1 else model[0].start_grad_sync
        if ov.overlap_param_gather and o.use_distributed_optimizer:
            tcfg.param_sync_func = [m.start_param_sync for m in model] if len(model) > 1 else model[0].start_param_sync
        return model, optimizer

    # ------------------------------------------------------------------ the loop

    def _forward_step(self, data, tcfg):
        import torch

        seq, mbs = self.r.batch.seq_length, self.r.batch.micro_batch_size
        position_ids = torch.arange(seq, device=self.device).unsqueeze(0).expand(mbs, seq)
        # The local (non-TE) attention needs an explicit causal mask; TE's causal kernels take none.
        mask = None if self.r.impl.te else torch.triu(
            torch.ones(1, 1, seq, seq, dtype=torch.bool, device=self.device), diagonal=1)

        def forward_step(data_iterator, model):
            tokens, labels = next(data_iterator)
            tokens, labels = tokens.to(self.device), labels.to(self.device)
            output = model(tokens, position_ids, mask, labels=labels)

            def loss_func(per_token_loss):
                loss = per_token_loss.float().mean()
                # clone: the schedule divides the returned loss in place by the number of micro-batches
                return loss, {"lm loss": loss.detach().clone()}

            return output, loss_func

        return forward_step

    def run(self, out_dir: Path) -> dict[str, Any] | None:
        """Build, train over the contract's steps, measure; rank 0 writes and returns ``results.json``."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        self.init_distributed()
        if self.rank == 0:
            from moe_hydra.core import env

            # the planner's snapshot (taken on this machine), plus what only a process with torch can see
            write_json({**(self.env_snapshot or env.snapshot()), "runtime": env.runtime()}, out_dir / "env.json")
        tcfg = self.transformer_config()
        model, optimizer = self.wrap_and_optimizer(tcfg, self.build_model(tcfg))
        if ps.get_data_parallel_world_size() != self.r.layout.dp:
            raise RuntimeError(f"Megatron-Core built DP {ps.get_data_parallel_world_size()}, the plan DP {self.r.layout.dp}")
        if self.rank == 0:
            from moe_hydra.job import built

            built.write(out_dir / built.FILE, *self.built_configs)
        records, samples, loop_ms = self._train(tcfg, model, optimizer, out_dir)
        memory = self._peak_memory()  # a collective: every rank
        evidence = self._evidence(tcfg, model, optimizer)
        profiled = self._profile(records, out_dir)  # a collective: every rank
        results = None
        if self.rank == 0:
            results = self._results(records, samples, loop_ms, memory, evidence, profiled)
            write_json(results, out_dir / "results.json")
        dist.barrier()
        ps.destroy_model_parallel()
        dist.destroy_process_group()
        return results

    def _train(self, tcfg, model, optimizer, out_dir: Path) -> tuple[list[metrics.StepRecord], list[dict], float]:
        """Every step of the contract, and the profiled ones: (step records, GPU telemetry samples, wall ms per
        window step on rank 0)."""
        from megatron.core import parallel_state as ps

        from moe_hydra.job import live, telemetry
        from moe_hydra.job.data import make_data
        from moe_hydra.job.profile import Window

        cfg, batch, t = self.cfg, self.r.batch, self.cfg.train
        data = make_data(self.r, out_dir)  # data.kind: mock or Megatron's indexed datasets (every rank builds it)
        dp_rank = ps.get_data_parallel_rank()
        forward_step = self._forward_step(data, tcfg)
        gpu = telemetry.open_gpu(self.local_rank) if self.on_gpu else None
        if gpu is not None:
            gpu.start()  # NVML read on its own thread; the loop takes its latest sample
        self.memory_phases = MemoryPhases() if self.on_gpu else None
        peak, _ = metrics.peak_tflops(cfg.hardware, cfg.precision)
        self.window = Window(self.r.profile_steps, cfg.profile.tool, self.on_gpu, out_dir, self.rank, cfg.profile.top)
        records: list[metrics.StepRecord] = []
        samples = []
        iters = self.r.train_iters
        router = self._router_stats(model)
        from moe_hydra.core import steady

        self.judge_import_s = steady.load() if self.rank == 0 else 0.0  # before the steps: the judgment's imports
        auto = AutoWindow(cfg.contract, t.train_iters, self.rank, self.device) if self.auto else None
        self.auto_window = auto
        self.measured = None if auto else tuple(cfg.contract.window)  # the window, once known
        progress = (_Progress(iters, self.measured[1] if self.measured else None, batch.tokens_per_step / self.world)
                    if self.rank == 0 else None)
        every_ref = cfg.contract.reference_every
        if every_ref:
            from moe_hydra.job.calibrate import Reference

            self.reference = Reference(self.device)
        starts, ends = {}, {}  # rank 0's clock at each step's start and end: the window's loop time
        for step in range(1, iters + 1):
            if step == 1 and self.origin is not None:
                self.startup = startup.record(self.origin, startup.now(self.origin["clock"]))
                if progress is not None:
                    progress.log(startup.describe(self.startup))
            starts[step] = time.perf_counter()
            batches = [data.batch(step - 1, dp_rank, mb) for mb in range(data.microbatches)]
            if step == t.fail_at_step:
                raise RuntimeError(f"train.fail_at_step={step}: failing on purpose")
            self.window.begin(step)
            if router is not None:
                router.reset()
            rec, stop = self._step(step, model, optimizer, forward_step, batches)
            self.window.end(step, last_step=bool(stop) or step == iters)
            records.append(rec)
            if gpu is not None:
                samples.append({"step": step, **gpu.latest()})
            if live.logged(cfg.logger, iters, step, self.auto) or step == iters or stop:  # the same steps, every rank
                self._log_live(rec, router, optimizer, peak, samples[-1] if gpu is not None else None)
            if progress is not None:
                progress.update(rec)
                if step % t.log_interval == 0 or step == iters:
                    progress.log(metrics.log_line(rec, batch.tokens_per_step, self.world, self.plan["flops_per_token"],
                                                  peak, rec.memory_gib))
            # the window's steps, or under auto every step after the warmup (its window is found as it goes)
            first, last = (cfg.contract.warmup_steps + 1, iters) if auto else self.measured
            if every_ref and first <= step <= last and (step - first) % every_ref == 0:
                self.reference.read()  # every rank, after the same steps
            ends[step] = time.perf_counter()
            if stop and step < iters:  # every rank saw the signal at the end of this step
                self.stopped_by, self.stopped_at = stop, step
                if progress is not None:
                    progress.log(f"{stop} received: stopping after step {step} of {iters}")
                break
            if auto is not None and self.measured is None:
                if auto.after([r.time_ms for r in records]):
                    self.measured = auto.found
                    if progress is not None:
                        progress.found(auto.found)
                    if cfg.profile.name == "none":
                        break
                    self.window.steps = (step + 1, step + cfg.profile.num_steps)  # then profiled, and the end
                elif step >= t.train_iters:  # the cap, and no steady segment: measured as the run's last steps
                    self.measured = tuple(auto.window(step))
                    if progress is not None:
                        progress.log(f"contract.window=auto: no steady segment of {cfg.contract.steady_steps} steps "
                                     f"in {step} steps (train.train_iters={t.train_iters})")
                    break
            if self.window.steps is not None and step >= self.window.steps[1] and auto is not None:
                break
        if progress is not None:
            progress.close()
        if router is not None:
            router.close()
        if gpu is not None:
            gpu.stop()
        first, last = self.measured or (1, 0)
        last = min(last, len(records))
        loop_ms = (ends[last] - starts[first]) * 1e3 / (last - first + 1) if first <= last and last in ends else 0.0
        return records, (samples if gpu is not None else None), loop_ms

    def _router_stats(self, model) -> Any:
        """A MoE model's router counters (every rank, hooks on its own stage's routers), or None for a dense one."""
        from moe_hydra.job import live

        a = self.r.arch
        if not a.experts:
            return None
        return live.RouterStats(model, self.cfg.model.num_layers + (self.cfg.model.mtp_num_layers or 0), a.experts,
                                self.r.layout.ep, self.device)

    def _log_live(self, rec: metrics.StepRecord, router: Any, optimizer, peak: float | None,
                  gpu_sample: dict[str, Any] | None) -> None:
        """A logged step: the routers' counts and the memory peak reduced (every rank: the peak and the allocator's
        retries as a max over the pipeline group, whose stages hold different layers), and on rank 0 its row
        queued for W&B (with the GPU's latest NVML sample under ``gpu/``)."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        from moe_hydra.job import live

        layers = router.collect(self.r.batch.micro_batches_per_step, self.world, self.r.layout.pp) if router else []
        retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0) if self.on_gpu else 0
        memory = torch.tensor([rec.memory_gib or 0.0, retries], dtype=torch.float64, device=self.device)
        if self.r.layout.pp > 1:
            dist.all_reduce(memory, op=dist.ReduceOp.MAX, group=ps.get_pipeline_model_parallel_group())
        if self.rank != 0:
            return
        if layers:
            self.router_logged.append((rec.step, layers))
        if self.live_log is not None:
            groups = getattr(optimizer, "param_groups", None) or [{}]
            pipeline = dataclasses.replace(rec, memory_gib=float(memory[0])) if rec.memory_gib is not None else rec
            values = live.row(pipeline, self.r.batch.tokens_per_step, self.world, self.plan["flops_per_token"], peak,
                              groups[0].get("lr"), self.measured or (0, -1))
            if self.on_gpu:
                values["memory/alloc_retries"] = int(memory[1])
            nvml = {f"gpu/{k}": v for k, v in (gpu_sample or {}).items() if k != "step"}
            self.live_log.log({**values, **live.router_row(layers), **nvml}, rec.step)

    def _step(self, step: int, model, optimizer, forward_step, batches) -> tuple[metrics.StepRecord, str | None]:
        """One timed step on every rank, after a barrier: forward/backward through Megatron's schedule and the
        optimizer step. Its time is the slowest rank's; its loss the global batch's. Also returns the stop signal
        any rank has received by the step's end (None: none), agreed on by the same all-reduce."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        dist.barrier()
        with self.window.annotate(step):  # the timed part is the step's span in a profile's trace
            wall_ms, host_ms, device_ms, losses, ok, grad_norm = self._timed(model, optimizer, forward_step, batches)
        last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        local_loss = (sum(float(x["lm loss"]) for x in losses) / len(losses)) if (last_stage and losses) else 0.0
        received = self.signals.received if self.signals else None
        signum = signal.Signals[received].value if received else 0
        stats = torch.tensor([wall_ms, host_ms or 0.0, device_ms or 0.0, signum], device=self.device,
                             dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        loss = torch.tensor([local_loss], device=self.device, dtype=torch.float64)
        dist.all_reduce(loss, group=ps.get_data_parallel_group(with_context_parallel=True))
        loss /= ps.get_data_parallel_world_size(with_context_parallel=True)
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.all_reduce(loss, group=ps.get_pipeline_model_parallel_group())
        return metrics.StepRecord(
            step=step, time_ms=float(stats[0]), loss=float(loss[0]),
            host_ms=float(stats[1]) if self.on_gpu else None, device_ms=float(stats[2]) if self.on_gpu else None,
            grad_norm=float(grad_norm) if grad_norm is not None else None, skipped=not ok,
            memory_gib=self._memory_gib(),
        ), signal.Signals(int(stats[3])).name if stats[3] else None

    def _timed(self, model, optimizer, forward_step, batches) -> tuple:
        """The timed part of a step: (wall ms, host ms, device ms, losses, optimizer ok, grad norm); host and
        device ms on a GPU only (CUDA events around the step, then a device sync)."""
        import torch
        from megatron.core.pipeline_parallel import get_forward_backward_func

        batch = self.r.batch
        iterators = [iter(batches) for _ in model]  # one pass over the step's micro-batches per model chunk
        if self.on_gpu:
            start_evt, end_evt = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_evt.record()
        t0 = time.perf_counter()
        phases = self.memory_phases
        if phases is not None:
            phases.end("between_steps")
        for m in model:
            m.zero_grad_buffer()
        optimizer.zero_grad()
        losses = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators if len(model) > 1 else iterators[0],
            model=model if len(model) > 1 else model[0],
            num_microbatches=batch.micro_batches_per_step,
            seq_length=batch.seq_length,
            micro_batch_size=batch.micro_batch_size,
            forward_only=False,
        )
        if phases is not None:
            phases.end("forward_backward")
        ok, grad_norm, _ = optimizer.step()
        if phases is not None:
            phases.end("optimizer_step")
        host_ms = device_ms = None
        if self.on_gpu:
            host_ms = (time.perf_counter() - t0) * 1e3
            end_evt.record()
            torch.cuda.synchronize()
            device_ms = start_evt.elapsed_time(end_evt)
        wall_ms = (time.perf_counter() - t0) * 1e3
        return wall_ms, host_ms, device_ms, losses, ok, grad_norm

    def _profile(self, records: list[metrics.StepRecord], out_dir: Path) -> dict[str, Any] | None:
        """profile=window: every rank's walls gathered on rank 0, which writes profile.json; its summary there."""
        import torch.distributed as dist

        if self.window.steps is None:
            return None
        gathered = [None] * self.world if self.rank == 0 else None
        dist.gather_object(self.window.analysed, gathered, dst=0)
        if self.rank != 0:
            return None
        return self.window.write(gathered, records, list(self.measured), out_dir)

    def _results(self, records, samples, loop_ms: float, memory: dict, evidence: dict,
                 profiled: dict | None) -> dict[str, Any]:
        """``results.json``: the plan's record, the steady window's figures and what produced each, and the judgment
        of the run's step times (``steady``)."""
        from moe_hydra.core import steady
        from moe_hydra.job import live

        cfg, contract = self.cfg, self.cfg.contract
        peak, peak_field = metrics.peak_tflops(cfg.hardware, cfg.precision)
        stopped = {"status": "interrupted" if self.stopped_by == "SIGINT" else "terminated",
                   "signal": self.stopped_by, "stopped_at_step": self.stopped_at} if self.stopped_by else {}
        window = list(self.measured or self.auto_window.window(len(records)))
        found = "the steady segment contract.window=auto found" if self.auto else "declared (contract.window)"
        results = {
            **self.plan,
            **self.stamp,
            "stage": "run",
            "status": "ok",
            "signal": None,
            **stopped,
            **metrics.summarize(records, window=window, warmup_steps=contract.warmup_steps,
                                tokens_per_step=self.r.batch.tokens_per_step, world_size=self.world,
                                flops_per_token=self.plan["flops_per_token"], peak=peak,
                                stopped=bool(self.stopped_by)),
            "window_declared": AUTO if self.auto else list(contract.window),
            "profile_steps": list(self.window.steps) if self.window.steps else None,
            "step_time_counter": ("CUDA events around each step (device) and the host clock, max over ranks"
                                  if self.on_gpu else "time.perf_counter around each step, max over ranks"),
            "window_counter": f"mean of steps {window[0]}..{window[1]} ({found}); "
                              f"steps 1..{contract.warmup_steps} are warmup",
            # wall time per window step on rank 0 including everything between steps (data, sync of the
            # measurements, logging): what the harness costs on top of the timed steps
            "window_loop_ms_per_step": loop_ms,
            "peak_tflops": peak,
            "peak_tflops_field": peak_field,
            **memory,
            "telemetry": samples,
            "evidence": evidence,
            "startup": self.startup,
            # profile=window: the profiled steps' walls on the slowest rank (profile.json has every rank's)
            "profile": profiled,
            # a MoE model's routers: per layer, tokens per expert and their imbalance over the window's logged steps
            "router": live.router_summary(self.router_logged, tuple(window)),
            **self._carried(),
        }
        start = time.perf_counter()
        judged = steady.of_results(results, contract.steady_steps).as_dict()
        judging = (time.perf_counter() - start + (self.auto_window.seconds if self.auto_window else 0.0)
                   + self.judge_import_s)
        results["steady"] = {**judged, "seconds": judging}
        return results

    def _carried(self) -> dict[str, Any]:
        """contract.reference_every: the machine's reference as this run read it (``machine_reference``) and, when
        the plan's step time came from a calibration that read it too, that prediction carried to the machine as
        this run found it (``step_time_carried``)."""
        if self.reference is None:
            return {}
        found = self.reference.summary()  # None: stopped before the window
        if found is not None:
            found["every"] = self.cfg.contract.reference_every
        predicted = self.plan.get("step_time") or {}
        carried = None
        if found and predicted.get("seconds") and predicted.get("interval_of") == "calibration":
            carried = cs.carried(predicted["seconds"], predicted["calibration"].get("reference"), found)
        return {"machine_reference": found, "step_time_carried": carried}

    # ------------------------------------------------------------------ measurements

    def _memory_gib(self) -> float | None:
        if self.on_gpu:
            return self.memory_phases.peak[0] / 2**30
        return warm_server.peak_rss_kib() / 2**20  # KiB on Linux

    def _peak_memory(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        if self.on_gpu:
            values = self.memory_phases.as_list()
            counter = "torch.cuda.max_memory_allocated / max_memory_reserved, max over ranks"
        else:
            values = [warm_server.peak_rss_kib() * 1024, 0]
            counter = ("peak resident set size (getrusage ru_maxrss; forked from a warm server: with the server's "
                       "peak while importing), max over ranks")
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        gib = [float(x) / 2**30 for x in t]
        peak = {"allocated": gib[0], "reserved": gib[1]} if self.on_gpu else {"rss": gib[0]}
        out = {"peak_memory_gib": peak, "memory_counter": counter, "memory_phases_gib": None}
        if self.on_gpu:  # where in a step the peak sits
            out["memory_phases_gib"] = {
                **dict(zip(MemoryPhases.PHASES, gib[2:5])), "after_first_step": gib[5],
                "counter": "torch.cuda.max_memory_allocated between reset_peak_memory_stats at each phase's end; "
                           "after_first_step: memory_allocated after the first optimizer step; max over steps, ranks"}
        if self.on_gpu:  # the estimate without its declared allowance is what the allocator sees
            est = self.plan["memory"]["total"] - self.plan["memory"]["allowance"]
            out["memory_vs_estimate"] = {"estimate_gib": est, "allocated_gib": gib[0],
                                         "error": (est - gib[0]) / gib[0] if gib[0] else None}
        return out

    def _evidence(self, tcfg, model, optimizer) -> dict[str, Any]:
        """What was actually built: read from the modules and the optimizer, not from the config."""
        import torch
        from megatron.core.transformer.moe.moe_layer import MoELayer

        moe = next((mod for m in model for mod in m.modules() if isinstance(mod, MoELayer)), None)
        param = next(p for m in model for p in m.parameters())
        inner = getattr(optimizer, "chained_optimizers", [optimizer])
        experts = getattr(moe, "experts", None)
        return {
            "dispatcher_class": type(moe.token_dispatcher).__name__ if moe else None,
            "experts_class": type(experts).__name__ if experts is not None else None,
            "grouped_gemm": type(experts).__name__ in ("GroupedMLP", "TEGroupedMLP") if experts is not None else None,
            "local_experts_per_rank": getattr(experts, "num_local_experts", None),
            "param_dtype": str(param.dtype).replace("torch.", ""),
            "precision_recipe": (f"fp8 {tcfg.fp8_recipe} via Transformer Engine" if tcfg.fp8 else
                                 f"fp4 {tcfg.fp4_recipe} via Transformer Engine" if tcfg.fp4 else
                                 str(param.dtype).replace("torch.", "")),
            "optimizer_class": " / ".join(type(o).__name__ for o in inner),
            "distributed_optimizer": any(type(o).__name__ == "DistributedOptimizer" for o in inner),
            "ddp_class": type(model[0]).__name__,
            "layer_spec": "transformer_engine" if self.r.impl.te else "local",
            "backend": "nccl" if self.on_gpu else "gloo",
            "device": torch.cuda.get_device_name() if self.on_gpu else "cpu",
            "torch_threads": torch.get_num_threads(),
            "compat_shims": self.shims,
            "layout_invariant_init": self.redrawn,
            "model_chunks": len(model),
            "batch_p2p_comm": tcfg.batch_p2p_comm,
        }


class _Progress:
    """Rank 0's view of the run: on a terminal a live line — the step, the last step's time, tokens/s/GPU and loss,
    and the time left to the end of the measured window at the steps' pace so far — with the metric lines printed
    above it; elsewhere (CI, Slurm logs) the metric lines alone, every ``train.log_interval`` steps.

    Refreshed once per step from the training loop, never by a background thread, so it takes no
    CPU time from the steps it measures.
    """

    def __init__(self, total: int, window_end: int | None, tokens_per_gpu: float):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console = Console(stderr=True)
        # None: contract.window=auto, still looking for its steady segment
        self.window_end, self.tokens_per_gpu = window_end, tokens_per_gpu
        self.spent_ms = 0.0  # the steps' time so far: the pace the window's end is told from
        self.bar = None
        if self.console.is_terminal:
            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[now]}"), console=self.console, transient=True,
                                auto_refresh=False)
            self.task = self.bar.add_task("train", total=total, now="")
            self.bar.start()

    @staticmethod
    def now(rec: metrics.StepRecord, tokens_per_gpu: float, window_end: int | None, pace_ms: float) -> str:
        """The live line's figures after step ``rec``; ``pace_ms`` the mean step so far."""
        left = max(window_end - rec.step, 0) * pace_ms / 1e3 if window_end is not None else None
        window = ("looking for a steady segment" if left is None else f"window ends in {left:.0f} s" if left
                  else "window measured")
        return (f"{rec.time_ms:.0f} ms/step  {tokens_per_gpu / (rec.time_ms / 1e3):,.0f} tokens/s/GPU  "
                f"loss {rec.loss:.3f}  {window}")

    def update(self, rec: metrics.StepRecord) -> None:
        self.spent_ms += rec.time_ms
        if self.bar is not None:
            now = self.now(rec, self.tokens_per_gpu, self.window_end, self.spent_ms / rec.step)
            self.bar.update(self.task, completed=rec.step, now=now, refresh=True)

    def found(self, segment: tuple[int, int]) -> None:
        """contract.window=auto found its steady segment: it is the window measured."""
        self.window_end = segment[1]
        self.log(f"contract.window=auto: steady from step {segment[0]}; window [{segment[0]}, {segment[1]}] measured")

    def log(self, line: str) -> None:
        self.console.print(line, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
