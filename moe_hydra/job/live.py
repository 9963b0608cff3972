"""What a running job shows while it runs: its steps in W&B as they happen, and its routers' health.

- :class:`LiveLog`: rank 0's W&B run, started on a thread of its own while the model is built and fed from a
  queue by the training loop, so that neither ``wandb.init`` nor a ``run.log`` ever runs on the training thread;
  the same thread rewrites ``live.json`` with the last logged step (:func:`running` reads it: ``sweep status``).
  One history row per logged step (every ``logger.log_interval`` steps: :func:`log_interval`), under Megatron-LM's
  keys where it has one (``training_log``: ``iteration-time`` in seconds, ``lm loss``, ``grad-norm``,
  ``learning-rate``, ``throughput`` in TFLOP/s/GPU, ``mem-max-allocated-bytes``) and moe_hydra's for the rest
  (:func:`row`); the step axis is the iteration. Rank 0 holds every figure of a step: the step's time, loss and
  gradient norm are reduced to every rank by the step itself (``Job._step``), so the row costs no collective.
- :class:`RouterStats`: tokens per expert of every MoE layer, counted on the device by a forward hook on each
  Megatron-Core router (``TopKRouter.forward`` returns its ``routing_map``, tokens x experts, after any
  capacity's dropping), zeroed before each step; on a logged step one all-reduce over all ranks gives each layer's
  counts (:meth:`RouterStats.collect`), and from them the imbalance — max over mean tokens per expert, and per
  expert-parallel rank — the share of routed slots dropped where a capacity factor applies, and the layer's
  load-balancing loss from Megatron-Core's tracker. Every rank of a stage sees its own tokens (a TP rank without
  sequence parallelism the same tokens as its peers): the sum over ranks counts each token once or TP times alike,
  which leaves the ratios as they are.

Imports torch and wandb inside the functions, as the rest of the job.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from moe_hydra.core import io

log = logging.getLogger("moe_hydra")

# the losses Megatron-Core's routers save to its per-layer tracker (router.py), by their names there
AUX_LOSSES = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss")
LIVE_FILE = "live.json"  # rank 0's last logged step, rewritten on each
SHORT_RUN = 100  # steps: runs shorter than this log every step by default, longer ones every 10th


def log_interval(logger_cfg: Any, train_iters: int) -> int:
    """Steps between two logged steps: ``logger.log_interval``, else 1 for a run under :data:`SHORT_RUN` steps and
    10 for a longer one."""
    return logger_cfg.log_interval or (1 if train_iters < SHORT_RUN else 10)


def logged(logger_cfg: Any, train_iters: int, step: int, open_ended: bool = False) -> bool:
    """Whether ``step`` is logged (:func:`log_interval`); ``open_ended``: a ``contract.window=auto`` run, whose
    ``train_iters`` is only its cap: without ``logger.log_interval`` every step under :data:`SHORT_RUN`, then every
    10th, as a run of its length would."""
    if open_ended and not logger_cfg.log_interval and step < SHORT_RUN:
        return True
    return step % log_interval(logger_cfg, train_iters) == 0


def row(rec: Any, tokens_per_step: int, world: int, flops_per_token: float, peak: float | None,
        lr: float | None, window: tuple[int, int]) -> dict[str, Any]:
    """A logged step's history row: Megatron-LM's keys, moe_hydra's ``train/``, ``time/``, ``throughput/``,
    ``memory/`` and, inside the measured window, ``steady/`` (the summary's means)."""
    tps = tokens_per_step / (rec.time_ms / 1e3 * world)
    tflops = flops_per_token * tps / 1e12
    out = {"train/step": rec.step, "iteration-time": rec.time_ms / 1e3, "lm loss": rec.loss,
           "throughput": tflops, "train/loss": rec.loss, "time/step_ms": rec.time_ms,
           "throughput/tokens_per_s_per_gpu": tps, "throughput/tflops_per_gpu": tflops}
    if peak:
        out["throughput/mfu"] = tflops / peak
    if rec.grad_norm is not None:
        out["grad-norm"] = rec.grad_norm
    if lr is not None:
        out["learning-rate"] = lr
    if rec.host_ms is not None:
        out.update({"time/host_ms": rec.host_ms, "time/device_ms": rec.device_ms})
    if rec.memory_gib is not None:
        out["memory/peak_gib"] = rec.memory_gib
        out["mem-max-allocated-bytes"] = rec.memory_gib * 2**30
    if window[0] <= rec.step <= window[1]:
        out.update({"steady/step_ms": rec.time_ms, "steady/tokens_per_s_per_gpu": tps,
                    "steady/tflops_per_gpu": tflops})
    return out


class LiveLog:
    """Rank 0's live outputs, written on a thread of its own: :meth:`log` only puts a row on a queue.

    Each row rewrites :data:`LIVE_FILE` in the job directory (the last logged step: what ``sweep status`` shows
    of a running point) and goes to the W&B run when there is one: ``start`` is a callable that returns the
    started run (:func:`moe_hydra.job.tracking.start`) or None; rows logged before it returns wait in the queue.
    Any failure inside W&B is one warning, and the rows after it are not sent to W&B; the run itself is
    unaffected."""

    def __init__(self, start: Any, out_dir: Path, train_iters: int):
        self.run = None
        self.rows: queue.SimpleQueue = queue.SimpleQueue()
        self.file, self.train_iters = out_dir / LIVE_FILE, train_iters
        self.thread = threading.Thread(target=self._loop, args=(start,), name="moe_hydra-live", daemon=True)
        self.thread.start()

    def log(self, values: dict[str, Any], step: int) -> None:
        self.rows.put((values, step))

    def close(self, timeout_s: float = 120.0) -> Any:
        """Wait for every queued row to be logged; the run, or None if it did not start or is still busy after
        ``timeout_s`` (W&B unreachable: the run is left to W&B's own exit handling)."""
        self.rows.put(None)
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            log.warning("W&B logging did not finish in %.0f s: the rows still queued are dropped", timeout_s)
            return None
        return self.run

    def _loop(self, start: Any) -> None:
        try:
            self.run = start()
        except Exception as e:  # noqa: BLE001 - the tracker is a mirror; a failure in it never fails a run
            log.warning("W&B did not start (the run itself is unaffected): %s: %s", type(e).__name__, e)
        failed = self.run is None
        while (item := self.rows.get()) is not None:
            values, step = item
            self._write(values, step)
            if failed:
                continue
            try:
                self.run.log(values, step=step)
            except Exception as e:  # noqa: BLE001
                log.warning("W&B logging failed (the run itself is unaffected): %s: %s", type(e).__name__, e)
                failed = True

    def _write(self, values: dict[str, Any], step: int) -> None:
        record = {"step": step, "train_iters": self.train_iters, "step_time_ms": values["time/step_ms"],
                  "loss": values["lm loss"], "tokens_per_s_per_gpu": values["throughput/tokens_per_s_per_gpu"],
                  "pid": os.getpid(), "host": socket.gethostname(), "written_at": time.time()}
        try:
            io.write_json(record, self.file, indent=None)
        except OSError as e:
            log.warning("%s not written: %s", self.file, e)


def running(job_dir: Path) -> dict[str, Any] | None:
    """The last step a job still running logged (its :data:`LIVE_FILE`), or None: no file, or its process has
    ended (on this host: the process is gone; on another host it cannot be asked, and the file is taken as is)."""
    try:
        record = json.loads((job_dir / LIVE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if record.get("host") == socket.gethostname():
        try:
            os.kill(int(record["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return record


class RouterStats:
    """Tokens per expert of every MoE layer of this rank's model chunks, counted by a forward hook on each router;
    :meth:`reset` before a step, :meth:`collect` (every rank) after a logged one."""

    def __init__(self, chunks: list[Any], num_layers: int, experts: int, ep: int, device: Any):
        import torch
        from megatron.core.transformer.moe.router import TopKRouter

        self.experts, self.ep, self.num_layers = experts, ep, num_layers
        self.counts = torch.zeros(num_layers, experts, dtype=torch.float64, device=device)
        self.slots = torch.zeros(num_layers, dtype=torch.float64, device=device)  # tokens x top-k a layer routed
        self.handles = []
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter) and module.layer_number is not None:
                    self.handles.append(module.register_forward_hook(self._hook(module)))

    def _hook(self, router: Any):
        i, topk = router.layer_number - 1, router.topk
        if i >= self.num_layers:
            raise ValueError(f"a router of layer {router.layer_number}, beyond the {self.num_layers} layers counted")

        def count(_module: Any, _inputs: Any, output: Any) -> None:
            routing_map = output[1]
            self.counts[i] += routing_map.sum(dim=0)
            self.slots[i] += routing_map.shape[0] * topk

        return count

    @property
    def active(self) -> bool:
        return bool(self.handles)

    def reset(self) -> None:
        """Before a step: the counts and Megatron-Core's aux-loss tracker zeroed (the tracker as Megatron-LM clears
        it after each step)."""
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

        self.counts.zero_()
        self.slots.zero_()
        clear_aux_losses_tracker()

    def collect(self, microbatches: int, world: int, pp: int) -> list[dict[str, Any]]:
        """After a logged step, on every rank (one all-reduce): each MoE layer's ``layer`` (0-based, Megatron's
        ``moe/*_layer_{i}``), ``tokens_per_expert``, ``imbalance`` (max over mean tokens per expert),
        ``ep_imbalance`` (max over mean tokens per EP rank), ``dropped_share`` (routed slots dropped by a
        capacity) and ``load_balancing_loss`` (Megatron-Core's tracker, per micro-batch as Megatron-LM scales it,
        averaged over the stage's ranks) where the model has one."""
        import torch
        import torch.distributed as dist
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        tracker = get_moe_layer_wise_logging_tracker()
        aux = torch.zeros(self.num_layers, len(AUX_LOSSES), dtype=self.counts.dtype, device=self.counts.device)
        for j, name in enumerate(AUX_LOSSES):  # every rank packs every name: a stage without one packs zeros
            if name in tracker:
                values = tracker[name]["values"]
                n = min(values.numel(), self.num_layers)
                aux[:n, j] = values[:n].to(aux)
        packed = torch.cat([self.counts, self.slots[:, None], aux], dim=1)
        dist.all_reduce(packed)
        rows = packed.tolist()
        names = [name for j, name in enumerate(AUX_LOSSES) if any(r[self.experts + 1 + j] for r in rows)]
        stage_ranks = world // pp
        out = []
        for i, values in enumerate(rows):
            counts, slots = values[: self.experts], values[self.experts]
            if slots == 0:  # not a MoE layer
                continue
            mean = statistics.fmean(counts)
            per_rank = [sum(counts[e * self.experts // self.ep:(e + 1) * self.experts // self.ep])
                        for e in range(self.ep)]
            layer = {"layer": i, "tokens_per_expert": counts, "imbalance": max(counts) / mean if mean else None,
                     "ep_imbalance": max(per_rank) / statistics.fmean(per_rank) if mean else None,
                     "dropped_share": 1.0 - sum(counts) / slots}
            for name in names:
                layer[name] = values[self.experts + 1 + AUX_LOSSES.index(name)] / microbatches / stage_ranks
            out.append(layer)
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def router_row(layers: list[dict[str, Any]]) -> dict[str, float]:
    """A logged step's router keys: per layer ``moe/{name}_layer_{i}`` (Megatron-LM's per-layer form) and the
    worst layer's ``moe/imbalance_max``."""
    out = {}
    for x in layers:
        for name in ("imbalance", "ep_imbalance", "dropped_share", *AUX_LOSSES):
            if x.get(name) is not None:
                out[f"moe/{name}_layer_{x['layer']}"] = x[name]
    imbalances = [x["imbalance"] for x in layers if x["imbalance"] is not None]
    if imbalances:
        out["moe/imbalance_max"] = max(imbalances)
    return out


def router_summary(logged: list[tuple[int, list[dict[str, Any]]]], window: tuple[int, int]) -> dict[str, Any] | None:
    """``results.json``'s ``router``: per MoE layer the mean of each figure over the logged steps inside the
    measured window (all logged steps when none is), and what they were counted from."""
    inside = [(step, layers) for step, layers in logged if window[0] <= step <= window[1]] or logged
    if not inside:
        return None
    by_layer: dict[int, list[dict[str, Any]]] = {}
    for _, layers in inside:
        for x in layers:
            by_layer.setdefault(x["layer"], []).append(x)
    summary = []
    for layer, xs in sorted(by_layer.items()):
        entry: dict[str, Any] = {"layer": layer}
        for name in ("imbalance", "ep_imbalance", "dropped_share", *AUX_LOSSES):
            values = [x[name] for x in xs if x.get(name) is not None]
            if values or name not in AUX_LOSSES:
                entry[name] = statistics.fmean(values) if values else None
        entry["tokens_per_expert"] = [statistics.fmean(c) for c in zip(*(x["tokens_per_expert"] for x in xs))]
        summary.append(entry)
    return {"layers": summary, "steps": [step for step, _ in inside], "worst_layer": max(summary, key=lambda x: x["imbalance"] or 0)["layer"],
            "counter": "a forward hook on each Megatron-Core TopKRouter: its routing_map summed over tokens, all "
                       "ranks; imbalance = max / mean tokens per expert (ep_imbalance: per EP rank, experts split "
                       "evenly in order), each logged step's, averaged over the logged steps in the window"}
