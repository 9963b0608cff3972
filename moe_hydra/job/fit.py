"""``stage=fit``: build ranks of the target layout with Megatron-Core itself, on this machine.

Each chosen rank is one process (``python -m moe_hydra.job.fit SPEC RANK RESULT``, or the same :func:`main` in
a process forked from the warm server: :mod:`moe_hydra.job.warm`, ``launcher.warm``) that joins torch's
``fake`` process group (a ``FakeStore``, every collective a no-op) at the target world size, runs
``initialize_model_parallel`` for both meshes and builds that rank's ``GPTModel`` chunks on the meta
device: shapes and parameters without memory, so a rank of a 1024-GPU DeepSeek-V3 builds on a
laptop. The parameters the build holds (dense, and expert = the routed experts' ``mlp.experts``)
are compared with :func:`moe_hydra.core.params.params_per_rank` for the layer spec that was built; they
must agree exactly. What Megatron-Core refuses (``TransformerConfig`` checks, parallel-state
asserts, model construction) is reported as the refusal, with its message.

Ranks built: the first rank of the first and of the last pipeline stage, and of the stage the memory
estimate finds most loaded.

``fit.json``: ``ranks`` (per built rank: rank, pp_rank, built and estimated params, agree, seconds,
peak_rss_gib, chunks, refused), ``agree``, ``layer_spec`` (built), ``notes``. ``seconds`` runs from the rank's
first import of torch (a warm-started rank has it already) to the end of its build.

The parent side (:func:`run`) is pure Python; torch and megatron load only in the rank processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from moe_hydra.core import params
from moe_hydra.core.io import write_json
from moe_hydra.core.resolved import Resolved
from moe_hydra.job import warm, warm_server


def ranks_to_build(r: Resolved, most_loaded: int) -> dict[int, int]:
    """{pipeline rank: global rank} for the first, the most-loaded and the last stage.

    Megatron's default order ``tp-cp-ep-dp-pp`` puts PP outermost (stride world / PP);
    ``use_tp_pp_dp_mapping`` puts it right after TP x CP."""
    lo = r.layout
    stride = lo.tp * lo.cp if r.cfg.parallel.use_tp_pp_dp_mapping else lo.world_size // lo.pp
    return {pp: pp * stride for pp in sorted({0, most_loaded, lo.pp - 1})}


def run(r: Resolved, config: dict[str, Any], plan: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Build the chosen ranks (two processes at a time), compare with the estimator, write ``fit.json``."""
    lo = r.layout
    chosen = ranks_to_build(r, plan["memory"]["most_loaded_pp_rank"])
    work = out_dir / "fit"
    work.mkdir(parents=True, exist_ok=True)
    spec = {"config": config, "plan": plan}
    (work / "spec.json").write_text(json.dumps(spec, default=str))
    procs: dict[int, tuple[subprocess.Popen, Path, Any]] = {}
    pending = list(chosen.items())
    results: list[dict[str, Any]] = []
    parallel = max(1, min(2, os.cpu_count() or 1))
    start = _Starter(warm.wanted(r.cfg.launcher.warm, gpu=False))
    while pending or procs:
        while pending and len(procs) < parallel:
            pp_rank, rank = pending.pop(0)
            out, log = work / f"rank{rank}.json", open(work / f"rank{rank}.log", "w")
            procs[rank] = (start([str(work / "spec.json"), str(rank), str(out)], log), out, log)
        for rank, (proc, out, log) in list(procs.items()):
            if proc.poll() is None:
                continue
            log.close()
            del procs[rank]
            if out.exists():
                results.append(json.loads(out.read_text()))
            else:
                tail = (work / f"rank{rank}.log").read_text()[-2000:]
                results.append({"rank": rank, "refused": f"the build process exited {proc.returncode}:\n{tail}"})
        time.sleep(0.05)
    results.sort(key=lambda x: x["rank"])
    built_te = any(x.get("layer_spec") == "transformer_engine" for x in results)
    _compare(r, results, te_spec=built_te)
    report = {
        "stage": "fit",
        "world_size": lo.world_size,
        "layout": lo.describe(),
        "layer_spec": "transformer_engine" if built_te else "local",
        "ranks": results,
        "agree": all(x.get("agree") for x in results),
        "refused": [x["refused"] for x in results if x.get("refused")],
        "notes": _notes(r.cfg, plan, built_te),
    }
    write_json(report, out_dir / "fit.json")
    return report


class _Starter:
    """Starts one build: ``python -m moe_hydra.job.fit SPEC RANK OUT``, its output in ``log``; forked from the
    warm server (:mod:`moe_hydra.job.warm`) when ``warm_start``, whose process runs the same :func:`main`."""

    def __init__(self, warm_start: bool):
        self.warm = warm_start

    def __call__(self, argv: list[str], log) -> Any:
        if self.warm:
            try:
                return warm.submit(lambda how: (__name__, "main", (argv,), {}), stdio=(0, log.fileno(), log.fileno()),
                                   program=True)
            except warm.Unavailable as e:
                print(f"moe_hydra: starting the fit's builds cold: {e}", file=sys.stderr, flush=True)
                self.warm = False
        return subprocess.Popen([sys.executable, "-m", __name__, *argv], stdout=log, stderr=subprocess.STDOUT)


def _compare(r: Resolved, results: list[dict[str, Any]], te_spec: bool) -> None:
    est = params.params_per_rank(r.arch, r.layout, r.split, te_spec=te_spec)
    for x in results:
        if x.get("refused"):
            x["agree"] = False
            continue
        e = est[x["pp_rank"]]
        x["estimate"] = {"dense": e.dense, "expert": e.expert, "total": e.total}
        x["agree"] = x["built"] == x["estimate"]


def _notes(cfg: Any, plan: dict[str, Any], built_te: bool) -> list[str]:
    notes = []
    if cfg.dispatcher.moe_token_dispatcher_type == "flex":
        notes.append("the fake process group refuses the flex dispatcher (L74): built with alltoall, "
                     "which holds the same parameters")
    if not built_te and plan["layer_spec"] == "transformer_engine":
        notes.append("built with the local layer spec (the fit builds on the meta device, without a GPU) and compared "
                     "with the estimator for that spec; the plan counts the Transformer Engine spec the GPUs run, the "
                     "same but for MLA's q/kv down-projections, which it replicates over TP")
    return notes


def render(report: dict[str, Any]):
    from rich.table import Table

    t = Table(title=f"fit: {report['layout']} on {report['world_size']} ranks, fake process group, "
                    f"{report['layer_spec']} spec", title_justify="left")
    for col in ("rank", "PP", "params built", "estimated", "", "s", "RSS GiB"):
        t.add_column(col, justify="right", no_wrap=True, min_width=13 if col in ("params built", "estimated") else None)
    for r in report["ranks"]:
        if r.get("refused"):
            t.add_row(str(r["rank"]), str(r.get("pp_rank", "?")), "", "", "[red]refused[/]", "", "")
            continue
        t.add_row(str(r["rank"]), str(r["pp_rank"]), f"{r['built']['total']:,}",
                  f"{r['estimate']['total']:,}", "[green]agree[/]" if r["agree"] else "[bold red]MISMATCH[/]",
                  f"{r['seconds']:.1f}", f"{r['peak_rss_gib']:.2f}")
    return t


# ----------------------------------------------------------------------------- one rank (own process)

def _build_rank(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    import dataclasses

    from omegaconf import OmegaConf

    from moe_hydra.core.resolved import Implementation, resolve
    from moe_hydra.core.schema import Config
    from moe_hydra.job import compat

    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), spec["config"]))
    plan = spec["plan"]
    if cfg.dispatcher.moe_token_dispatcher_type == "flex":  # L74: not with the fake backend
        cfg = dataclasses.replace(cfg, dispatcher=dataclasses.replace(cfg.dispatcher, moe_token_dispatcher_type="alltoall"))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, layout_invariant_init=False))
    if cfg.kernels.moe_grouped_gemm and not compat.te_available():  # the legacy GroupedMLP needs grouped_gemm
        cfg = dataclasses.replace(cfg, kernels=dataclasses.replace(cfg.kernels, moe_grouped_gemm=False))
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from moe_hydra.job.train import Job

    warm_server.replay_warnings()  # forked from a warm server: the warnings its imports gave there, in this log
    # the local layer spec, on the meta device (no GPU in this process)
    impl = Implementation.of(cfg, gpu=False, te=False, grouped_gemm=False, apex=False,
                             source="stage=fit: the local spec on the meta device")
    r = resolve(cfg, impl)
    job = Job(r, plan)
    job.shims = compat.apply()
    job.on_gpu = False
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=r.layout.world_size)
    out: dict[str, Any] = {"rank": rank, "layer_spec": impl.layer_spec}
    try:
        from megatron.core import parallel_state as ps

        job.init_model_parallel(create_gloo_process_groups=False)
        out.update(pp_rank=ps.get_pipeline_model_parallel_rank(), tp_rank=ps.get_tensor_model_parallel_rank(),
                   ep_rank=ps.get_expert_model_parallel_rank())
        tcfg = job.transformer_config()
        tcfg.use_cpu_initialization, tcfg.perform_initialization = True, False
        if tcfg.multi_latent_attention and not compat.te_available():
            _mla_without_te()
        with torch.device("meta"):
            chunks = job.build_model(tcfg)
    except Exception as e:  # what Megatron-Core refuses for this layout
        traceback.print_exc()  # into this rank's log
        out["refused"] = f"{type(e).__name__}: {e}"
        return out
    seen, dense, expert = set(), 0, 0
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if ".mlp.experts." in f".{name}":  # routed experts (shared experts are mlp.shared_experts)
                expert += p.numel()
            else:
                dense += p.numel()
    out.update(built={"dense": dense, "expert": expert, "total": dense + expert}, chunks=len(chunks),
               seconds=time.perf_counter() - t0,
               peak_rss_gib=warm_server.peak_rss_kib() / 2**20)  # KiB on Linux
    return out


def _mla_without_te() -> None:
    """megatron-core 0.16 builds MLA only with Transformer Engine: without it, ``MLASelfAttention``
    sees ``HAVE_TE`` true (the TE extension module imports, with mock classes) and fails on
    ``isinstance(..., TELinear)``, and the local ``DotProductAttention`` rejects the
    ``k_channels``/``v_channels`` MLA passes. Core attention holds no parameters and the fit runs no
    forward pass, so this process (only) clears the flag and builds a variant that drops the two
    arguments."""
    from megatron.core.transformer import dot_product_attention as dpa
    from megatron.core.transformer import multi_latent_attention as mla

    mla.HAVE_TE = False

    class _MLACoreAttention(dpa.DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    from megatron.core.models.gpt import gpt_layer_specs

    original = gpt_layer_specs.get_gpt_layer_local_spec

    def local_spec(*args, **kwargs):
        spec = original(*args, **kwargs)
        attn = spec.submodules.self_attention
        if attn.module is mla.MLASelfAttention and attn.submodules.core_attention is dpa.DotProductAttention:
            attn.submodules.core_attention = _MLACoreAttention
        return spec

    gpt_layer_specs.get_gpt_layer_local_spec = local_spec


def main(argv: list[str]) -> None:
    spec_path, rank, out = argv
    write_json(_build_rank(json.loads(Path(spec_path).read_text()), int(rank)), Path(out))


if __name__ == "__main__":
    main(sys.argv[1:])
