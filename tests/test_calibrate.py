"""The machine's own rates (moe_hydra.job.calibrate, the parts stage=calibrate is built from): how each measurement
times and what its rate means, and the collectives on two real gloo processes."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from unittest import mock

import pytest
import torch

from moe_hydra.job import calibrate
from moe_hydra.launch.local import free_port


@pytest.mark.parametrize("op, n, factor", [("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
                                           ("reduce_scatter", 2, 0.5), ("all_to_all", 8, 0.875),
                                           ("send_recv", 2, 1.0), ("all_reduce", 1, 0.0)])
def test_bus_bandwidth_factors_are_nccl_tests(op, n, factor):
    assert calibrate.bus_factor(op, n) == pytest.approx(factor)


def test_an_unknown_collective_is_refused():
    with pytest.raises(ValueError, match="all_reduce"):
        calibrate.bus_factor("broadcast", 2)


def test_timed_discards_the_warmup_and_times_each_call():
    calls = []

    def call():
        calls.append(1)
        time.sleep(0.02 if len(calls) > 2 else 0.2)  # the warm-up calls are slow: they must not be in the samples

    seconds = calibrate.timed(call, warmup=2, repeats=3)
    assert len(calls) == 5 and len(seconds) == 3
    assert all(0.019 <= s < 0.15 for s in seconds), seconds


def test_gemm_counts_two_m_n_k_and_its_rate_is_the_medians():
    m = calibrate.gemm(64, 96, 128, torch.float32, torch.device("cpu"), repeats=5)
    d = m.as_dict()
    assert m.work == 2 * 64 * 96 * 128 and d["samples"] == 5 and d["min_s"] <= d["median_s"] <= d["max_s"]
    assert d["tflops"] == pytest.approx(m.work / d["median_s"] / 1e12) and d["tflops"] > 0
    assert (d["m"], d["n"], d["k"], d["dtype"]) == (64, 96, 128, "float32")


def test_memory_bandwidth_counts_a_read_and_a_write():
    m = calibrate.memory_bandwidth(1 << 16, torch.bfloat16, torch.device("cpu"), repeats=3)
    assert m.work == 2 * (1 << 16) * 2 and m.as_dict()["gb_per_s"] == pytest.approx(m.work / m.median_s / 1e9)


def _ranks(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = [calibrate.collective(op, 3004, repeats=3).as_dict() for op in calibrate.COLLECTIVES]
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(rows, f)


def test_collectives_on_two_gloo_processes(tmp_path):
    """Each collective over two real processes: the buffer rounded to whole elements a rank, the time the slowest
    rank's (the same on both), the bus bandwidth the algorithm bandwidth times nccl-tests' factor."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "rows")
    mp.spawn(_ranks, args=(2, free_port(), out), nprocs=2)
    a, b = (json.loads(open(f"{out}.{r}").read()) for r in (0, 1))
    assert [r["op"] for r in a] == list(calibrate.COLLECTIVES)
    for r0, r1 in zip(a, b):
        assert r0["median_s"] == r1["median_s"] > 0 and r0["samples"] == 3, (r0, r1)
        assert r0["group_size"] == 2 and r0["bytes"] == 3000  # 3004 B a rank: 375 floats for each of the 2
        assert r0["busbw_gb_per_s"] == pytest.approx(r0["algbw_gb_per_s"] * calibrate.bus_factor(r0["op"], 2))


def _gloo_threads(down_to: int = 0) -> int:
    """This process's threads that gloo's process groups own (each keeps two ``pt_gloo_runloop`` and a
    ``gloo_tcp_loop`` until it is destroyed and its last reference gone), waited for, up to 5 s, to come down to
    ``down_to``: a destroyed group's threads end as its last reference goes, and under load that can lag."""
    import gc

    def count() -> int:
        return sum(open(f"/proc/self/task/{t}/comm").read().strip() in ("pt_gloo_runloop", "gloo_tcp_loop")
                   for t in os.listdir("/proc/self/task"))

    gc.collect()
    deadline = time.monotonic() + 5
    while count() > down_to and time.monotonic() < deadline:
        time.sleep(0.1)
    return count()


def _one_layout_after_another(rank: int, port: int, out: str) -> None:
    import gc
    import weakref

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from moe_hydra.core.resolved import resolve
    from moe_hydra.job.data import MockData
    from moe_hydra.job.train import Job
    from tests.conftest import compose_config

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    r = resolve(compose_config("stage=calibrate"))
    job = Job(r, {})
    job.init_distributed()
    calibrate.release_model_parallel()
    found = {"threads_before": _gloo_threads(), "threads": [], "groups": [], "model_alive": [], "batches": [],
             "held": [], "routed": []}
    try:
        for _ in range(3):  # a layout: its groups, a model built and stepped (the step leaves its autograd graph in
            job.init_model_parallel()  # the model: the dispatcher's probabilities), freed, its groups released
            found["groups"].append(sum(g is not None for g in ps._global_process_group_list))
            shape = calibrate.shrunk(r, 1, 1, 64, 1)
            built = calibrate.Built(job, shape)
            before = [p.detach().clone() for p in built.model[0].parameters()]
            with mock.patch.object(MockData, "batch", autospec=True, side_effect=MockData.batch) as batch:
                timer = built.timer(shape)
                for _ in range(2):
                    timer.step()
                series = timer.routed(2)  # a model's warm-up: new batches, each expert's rows counted
            found["batches"].append([c.args[1:] for c in batch.call_args_list])
            found["routed"].append([series["tokens"], [sum(c) for c in series["counts"]], len(series["counts"][0])])
            found["held"].append(all(torch.equal(a, b) for a, b in zip(before, built.model[0].parameters())))
            param = weakref.ref(next(built.model[0].parameters()))
            built.free()
            gc.collect()
            found["model_alive"].append(param() is not None)
            calibrate.release_model_parallel()
            found["threads"].append(_gloo_threads(down_to=found["threads_before"]))
    finally:
        calibrate.release_model_parallel()
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(found, f)


def test_a_layout_leaves_nothing_behind_for_the_next(tmp_path):
    """What one layout's steps used is gone before the next layout's: a stepped model, once freed, is collected
    (Megatron-Core's DDP hooks and the last step's autograd graph made a cycle Python's collector cannot see, and
    every model lived until the process ended), and a layout's process groups are destroyed with their threads
    (Megatron-Core's destroy_model_parallel only forgets them, and its rotary embedding's cache kept a group of every
    model stepped: each layout added its groups' threads, and the layouts measured later ran slower). A shape's steps
    repeat one batch on weights held, so that each routes the same tokens to each expert (a new row count costs a
    CPU's bf16 GEMMs a kernel made afresh); the warm-up's steps are on new batches, every expert's rows counted."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "found.json")
    mp.spawn(_one_layout_after_another, args=(free_port(), out), nprocs=1)
    found = json.loads(open(out).read())
    assert found["model_alive"] == [False] * 3
    # each layout made its groups (three threads each); after it, the threads are what they were before the first
    # (the rotary cache left three a layout, destroy_model_parallel alone three a group)
    assert min(found["groups"]) > 0 and found["threads"] == [found["threads_before"]] * 3, found
    # a shape's steps repeat one batch on weights held: the same tokens to each expert every step
    assert found["batches"] == [[[0, 0, 0], [0, 0, 0], [1, 0, 0], [2, 0, 0]]] * 3, found
    assert found["held"] == [True] * 3, found
    # the warm-up's two steps: 64 tokens routed to 2 of 8 experts each, on the shrunken model's one MoE layer
    assert found["routed"] == [[64, [128, 128], 8]] * 3, found


def _resident_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_freed_models_heap_goes_back_to_the_system():
    """What a freed model leaves in the C library's heap is handed back, not kept for the next model: 192 MiB of
    small blocks (as a model's tensors and graph are) freed below one still in use stay resident until the trim."""
    import ctypes

    libc = ctypes.CDLL(None)
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("this C library has no malloc_trim (not glibc)")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 16 * 1024
    blocks = [libc.malloc(block) for _ in range(192 * 64)]
    for b in blocks:
        ctypes.memset(b, 1, block)
    pinned = libc.malloc(block)  # in use above the freed ones: free() alone cannot shrink the heap past it
    try:
        for b in blocks:
            libc.free(b)
        freed = _resident_mib()
        calibrate._trim_heap()
        assert freed - _resident_mib() > 150, (freed, _resident_mib())
    finally:
        libc.free(pinned)


def test_stage_calibrate_measures_this_machine_on_the_jobs_processes(cli, tmp_path):
    """python -m moe_hydra stage=calibrate on two processes (the plan's layout, the dispatcher's other option):
    calibration.json holds the machine; the model's step at every shape of step_shapes (Megatron-Core's training
    step on both, at depths 1 and 3) fitted with its held-out error; allgather at each variant shape right after
    the layout's own there, its factor held out; every GEMM of the model at three micro-batches' tokens, the memory
    bandwidth and each collective across sizes over both."""
    from moe_hydra.core.arch import Arch
    from tests.conftest import compose_config

    r = cli("stage=calibrate", "logger=none", "hardware.devices_per_node=2", "calibrate.layouts=plan",
            "calibrate.variants=[dispatcher]", "calibrate.step_repeats=3", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "measurements on 2 processes" in r.stdout and "calibrate: all_to_all over 2 processes" in r.stdout
    rec = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert rec["calibration_version"] == calibrate.CALIBRATION_VERSION and rec["model"] == "tiny_moe"
    assert rec["seconds"] > 0 and len(rec["launch_seconds"]) == 1 and 0 < rec["launch_seconds"][0] < rec["seconds"]
    assert rec["method"]["processes"] == calibrate.PER_LAYOUT  # one launch: the plan's layout only
    assert rec["machine"]["processes"] == 2 and rec["machine"]["device_type"] == "cpu" and rec["machine"]["torch"]
    by_kind: dict[str, list] = {}
    for m in rec["measurements"]:
        by_kind.setdefault(m["kind"], []).append(m)
    cfg = compose_config()
    seq, a = cfg.train.seq_length, Arch.from_model(cfg.model)

    def shape(m):
        return m["layers"], m["micro_batch_size"], m["seq_length"], m["microbatches"]

    steps = by_kind["step"]
    own = [m for m in steps if "option" not in m]
    assert [shape(m) for m in own] == calibrate.step_shapes(seq)
    # step_repeats=3 in 2 rounds: 2 timed steps a round, each round's median within the steps' range
    assert all(m["median_s"] > 0 and m["samples"] == calibrate.ROUNDS * -(-3 // calibrate.ROUNDS) == 4 for m in steps)
    assert all(len(m["round_medians_s"]) == calibrate.ROUNDS and m["min_s"] <= min(m["round_medians_s"])
               and m["steady_s"] == min(m["round_medians_s"]) and len(m["each_s"]) == m["samples"]
               and m["round_medians_s"][0] == statistics.median(m["each_s"][:2])
               and max(m["round_medians_s"]) <= m["max_s"] and m["between_rounds"] == pytest.approx(
                   math.log(max(m["round_medians_s"]) / min(m["round_medians_s"]))) for m in steps)
    # at each variant shape, allgather right after the layout's own step (its pair), in the measured order
    variant_at = [shape(steps[i - 1]) for i, m in enumerate(steps) if m.get("option") == "allgather"]
    assert variant_at == [s for s in calibrate.step_shapes(seq) if s in calibrate.variant_shapes(seq)]
    assert sorted(variant_at) == sorted(calibrate.variant_shapes(seq))
    rest = [m for m in steps if m not in own]
    assert [shape(m) for m in rest] == variant_at
    (lay,) = rec["step"]["layouts"]
    assert lay["layout"]["dp"] == 2 and rec["step"]["holds"]["processes"]["devices_per_node"] == 2
    assert len(lay["points"]) == len(own) and 0 <= lay["held_out"]["median"] <= lay["held_out"]["worst"]
    assert [p["seconds"] for p in lay["points"]] == [m["steady_s"] for m in own]  # each row's steadier round
    (v,) = lay["variants"]
    assert v["option"] == "allgather" and v["config"]["moe_token_dispatcher_type"] == "allgather"
    assert set(v["deltas"]) == {"per_layer", "per_layer_token", "per_layer_token_seq"} and len(v["points"]) == 4
    assert v["extra_per_layer_token_seq"] >= 0 and v["layers_factor"] >= -1  # the layers' work never below 0
    assert v["held_out"]["worst"] >= v["held_out"]["median"]
    assert [p["paired_seconds"] for p in v["points"]] == [steps[steps.index(m) - 1]["steady_s"] for m in rest]
    # the machine's reference read after each model's blocks, a round: the two depths' and allgather's; each step
    # row holds its model's reading of each round
    ref = rec["reference"]
    assert ref["readings"] == calibrate.ROUNDS * 3 == len(ref["each"])
    assert set(ref["probes"]) == set(calibrate.REFERENCE_PROBES)
    assert all(len(m["reference_index_s"]) == calibrate.ROUNDS for m in steps)
    each = sorted(calibrate.index_of(x) for x in ref["each"])
    assert sorted({x for m in steps for x in m["reference_index_s"]}) == pytest.approx(each)
    assert len({tuple(m["reference_index_s"]) for m in steps}) == 3  # one pair a model
    assert all(0 < p["min_s"] <= p["median_s"] <= p["max_s"] for p in ref["probes"].values())
    assert min(p["median_s"] for p in ref["probes"].values()) <= ref["index_s"] <= max(
        p["median_s"] for p in ref["probes"].values())
    gemms = {(g["gemm"], g["m"], g["n"], g["k"]) for g in by_kind["gemm"]}
    assert gemms == set(calibrate.gemm_shapes(a, seq)) and {m for _, m, _, _ in gemms} >= {seq, 2 * seq, 4 * seq}
    assert ("logits", seq, a.padded_vocab(), a.h) in gemms and all(g["tflops"] > 0 for g in by_kind["gemm"])
    # an expert's row count met the first time (the layout's ETP 1), beyond every count the steps routed; and how
    # the router spreads the rows, from the warm-up steps of each model built (both depths and allgather's, a round)
    (new,) = by_kind["new_rows"]
    assert new["etp"] == 1 and new["ffn"] == a.moe_ffn and new["hidden"] == a.h and new["glu"] == a.glu
    assert new["samples"] == calibrate.NEW_ROW_COUNTS and new["rows"][0] > 2 * 4 * seq
    if new["dtype"] == "bfloat16":  # oneDNN makes a kernel for each shape; in fp32 (MKL) nothing is made
        assert new["median_s"] > 0
    rows = rec["step"]["expert_rows"]
    capacity = rec["machine"]["onednn_primitive_cache_capacity"]  # 1024 unless ONEDNN_PRIMITIVE_CACHE_CAPACITY
    assert rows["cost_s"] == {"1": new["median_s"]} and rows["cache_row_counts"] == capacity // 6 and capacity > 0
    assert rows["routing"]["series"] == 3 * calibrate.ROUNDS and rows["routing"]["overdispersion"] > 0
    assert by_kind["memory_bandwidth"] and all(m["gb_per_s"] > 0 for m in by_kind["memory_bandwidth"])
    ops = {(c["op"], c["bytes"]) for c in by_kind["collective"]}
    assert {op for op, _ in ops} == set(calibrate.COLLECTIVES)
    assert all(c["group_size"] == 2 for c in by_kind["collective"])
    assert len(ops) == len(calibrate.COLLECTIVES) * len(calibrate.CPU_COLLECTIVE_BYTES)


def test_the_layouts_are_measured_in_passes_there_and_back(monkeypatch):
    """Every layout's steps in ROUNDS rounds, one a pass over the layouts, every other pass in the opposite order
    (a drift of the machine over the calibration lands on every layout alike, not on those in the middle), the
    step_repeats shared between the rounds, after an untimed pass over the first layout (the process's first model
    steps slower); the rows in the layouts' order."""
    from types import SimpleNamespace

    done = []

    class Layout:
        def __init__(self, job, fields, say, reference=None):
            self.fields = fields

        def round(self, timed, warm=False):
            if warm:
                assert timed == 0 and not done
                return
            done.append((self.fields, timed))

        def result(self, say):
            return self.fields

    monkeypatch.setattr(calibrate, "layouts", lambda r: ["a", "b", "c"])
    monkeypatch.setattr(calibrate, "LayoutSteps", Layout)
    monkeypatch.setattr(calibrate, "ROUNDS", 3)
    job = SimpleNamespace(r=SimpleNamespace(cfg=SimpleNamespace(calibrate=SimpleNamespace(step_repeats=7))))
    assert calibrate.steps(job, print) == ["a", "b", "c"]
    assert [f for f, _ in done] == ["a", "b", "c", "c", "b", "a", "a", "b", "c"] and {t for _, t in done} == {3}


def test_a_round_builds_and_steps_one_model_at_a_time(monkeypatch):
    """A round holds one model at a time, as a run does (a layout's five built at once stepped 1.16-1.52x slower than
    fresh runs): each built, warmed up, its timers' blocks stepped on it in their order (a variant's right after
    the layout's own at the same depth), let go before the next is built; the warm-up pass steps the first model
    alone and records nothing."""
    from types import SimpleNamespace

    from moe_hydra.core.resolved import resolve
    from tests.conftest import compose_config

    r = resolve(compose_config("hardware.devices_per_node=2", "stage=calibrate", "calibrate.layouts=plan"))
    alive, events = set(), []

    class Built:
        def __init__(self, job, plan):
            self.key = next(k for k, p in lay.models.items() if p is plan)
            alive.add(self.key)
            events.append(("build", self.key))
            self.model = None

        def free(self):
            alive.discard(self.key)

    def on(t, built):
        t.built, t.job = built, SimpleNamespace(_router_stats=lambda model: None)  # no router counted
        return t

    def step(t, batch=0):
        assert alive == {t.model} and t.built.key == t.model  # the one model alive is the timer's own
        events.append(("step", t.model))
        return 0.01, None, None

    job = SimpleNamespace(r=r, for_plan=lambda plan: SimpleNamespace(init_model_parallel=lambda: None))
    monkeypatch.setattr(calibrate, "Built", Built)
    monkeypatch.setattr(calibrate, "release_model_parallel", lambda: None)
    monkeypatch.setattr(calibrate.StepTimer, "on", on)
    monkeypatch.setattr(calibrate.StepTimer, "step", step)
    lay = calibrate.LayoutSteps(job, calibrate.layouts(r)[0], lambda text: None)
    lay.round(0, warm=True)  # the first model only: the process's first model is what steps slow
    assert not alive and all(t.rounds == 0 and not t.seconds for t in lay.timers)
    first = next(iter(lay.models))
    assert [k for e, k in events if e == "build"] == [first] and len(lay.models) == 5  # two depths, three variants
    assert [k for e, k in events if e == "step"] == [first] * (
        calibrate.STEP_WARMUP + sum(1 for t in lay.timers if t.model == first))
    events.clear()
    lay.round(2)
    built = [k for e, k in events if e == "build"]
    assert built == list(lay.models)
    runs = [k for _, k in events]  # each model's steps all together, after its build
    assert [k for i, k in enumerate(runs) if i == 0 or k != runs[i - 1]] == built
    assert not alive and all(t.rounds == 1 and len(t.seconds) == 2 for t in lay.timers)
    per_model = {k: sum(1 for t in lay.timers if t.model == k) for k in lay.models}
    steps = [k for e, k in events if e == "step"]
    # the layout's groups just made: an untimed pass over its first model's shapes
    assert {k: steps.count(k) for k in lay.models} == {  # warm-up, then 1 untimed + 2 timed each
        k: calibrate.STEP_WARMUP + (4 if k == first else 3) * n for k, n in per_model.items()}


def test_each_model_is_warmed_up_on_its_largest_micro_batch_at_the_fewest_a_step():
    """A round first steps each model on the shape of the most tokens a micro-batch (its largest buffers), of those
    the one of the fewest micro-batches a step; one timer a model, in the models' order."""
    from types import SimpleNamespace

    def timer(model, mbs, seq, m):
        return SimpleNamespace(model=model, r=SimpleNamespace(batch=SimpleNamespace(
            micro_batch_size=mbs, seq_length=seq, micro_batches_per_step=m)))

    timers = [timer("d1", 1, 128, 1), timer("d1", 4, 128, 1), timer("d1", 1, 512, 1), timer("d1", 1, 128, 8),
              timer("v", 1, 128, 1), timer("d1", 4, 128, 2), timer("v", 2, 128, 1)]
    assert calibrate.warmup_timers(timers) == [timers[1], timers[6]]


def test_the_layouts_and_variants_it_measures_are_every_one_the_job_can_run():
    """On two processes, tiny_moe: the plan's layout first, then each TP, PP, EP, ETP the rules allow (TP 2 with
    ETP 1 and EP 1 is refused: V01), each once; the recompute levels and the other dispatcher as variants, the
    selective one with the modules the rules allow without Transformer Engine ([core_attn]: L52, L75)."""
    from moe_hydra.core.resolved import resolve
    from tests.conftest import compose_config

    r = resolve(compose_config("hardware.devices_per_node=2", "stage=calibrate"))
    found = [(f["tensor_model_parallel_size"], f["pipeline_model_parallel_size"], f["expert_model_parallel_size"],
              f["expert_tensor_parallel_size"]) for f in calibrate.layouts(r)]
    assert found[0] == (1, 1, 1, 1) and len(found) == len(set(found))
    assert set(found) == {(1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 2, 1), (1, 2, 1, 1), (2, 1, 1, 2), (2, 1, 2, 1)}, found
    assert [(g, o) for g, o, _ in calibrate.variants(r)] == [("recompute", "selective"), ("recompute", "full"),
                                                             ("dispatcher", "allgather")]
    assert calibrate.variants(r)[0][2]["recompute_modules"] == ["core_attn"]
    # a variant's pair is the layout's own step at its shape: one of those measured anyway
    assert set(calibrate.variant_shapes(128)) <= set(calibrate.step_shapes(128))
    plan_only = resolve(compose_config("hardware.devices_per_node=2", "expert_mesh=ep2", "calibrate.layouts=plan"))
    assert [(f["expert_model_parallel_size"], f["sequence_parallel"]) for f in calibrate.layouts(plan_only)] == [
        (2, False)]


def test_a_local_calibration_launches_the_jobs_processes_once_a_layout(monkeypatch, tmp_path):
    """stage=calibrate on the local launcher: one launch of the job's processes a layout, in the layouts' order (a
    layout measured after others in one process steps slower than alone), the rates measured by the first only;
    calibration.json written here from what every launch's rank 0 found, in that order, the first's machine."""
    from moe_hydra.commands import run
    from moe_hydra.core.resolved import resolve
    from tests.conftest import compose_config

    r = resolve(compose_config("hardware.devices_per_node=2", "stage=calibrate"))
    n = len(calibrate.layouts(r))
    assert calibrate.parts(r) == [{"layouts": [i], "rates": i == 0} for i in range(n)] and n == 6
    launched, written = [], []

    def launch(cfg, r, p, out_dir, snapshot, **more):
        launched.append(more)
        return {"machine": {"launch": len(launched)}, "layouts": [f"layout {more[calibrate.PART]['layouts'][0]}"]}

    def write(r, implementation, found, out_dir, seconds, processes):
        written.append((found, processes, seconds))
        return {"measurements": [], "machine": {"processes": 2}, "seconds": seconds}

    monkeypatch.setattr(run, "_launch", launch)
    monkeypatch.setattr(calibrate, "write", write)
    assert run._run_calibrate(None, r, {}, tmp_path, {}) == "COMPLETED"
    assert launched == [{calibrate.PART: part} for part in calibrate.parts(r)]
    (found, processes, seconds), = written
    assert [x["layouts"] for x in found] == [[f"layout {i}"] for i in range(n)] and processes == calibrate.PER_LAYOUT
    assert seconds > 0


@pytest.mark.slow
@pytest.mark.serial
def test_a_calibration_predicts_runs_it_never_saw(cli, tmp_path):
    """Held out, never the fit: calibrated on one process (depths 1 and 3, micro-batches of 1, 2 and 8 a step, full
    recompute as a variant), the plan predicts runs of shapes it never measured — 4 layers with two micro-batches a
    step; 2 layers, micro-batch 4, full recompute — within x1.5 of 20 steady steps each (this CPU's runs of one
    config differ by up to x1.6: docs/cpu.md), after 15: a CPU run's bf16 expert GEMMs make their kernels over its
    first steps, and the calibration measures steps that find theirs made (steps 4-23: 0.21 and 0.34 too fast)."""
    cal = tmp_path / "cal"
    r = cli("stage=calibrate", "logger=none", "calibrate.layouts=plan", "calibrate.variants=[recompute]",
            f"hydra.run.dir={cal}", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for i, config in enumerate([["model.num_layers=4", "train.micro_batch_size=2", "train.global_batch_size=4"],
                                ["model.num_layers=2", "recompute=full"]]):
        common = ["logger=none", *config, "contract.warmup_steps=15", "contract.window=[16,35]", "train.train_iters=35"]
        plan = cli("stage=plan", *common, f"hardware.calibration={cal / 'calibration.json'}",
                   f"hydra.run.dir={tmp_path / f'plan{i}'}")
        assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
        st = json.loads((tmp_path / f"plan{i}" / "plan.json").read_text())["step_time"]
        # the second run reads the machine's reference in its window (steps 16, 21, 26, 31), the calibration named
        carry = ["contract.reference_every=5", f"hardware.calibration={cal / 'calibration.json'}"] if i else []
        run = cli(*common, *carry, f"hydra.run.dir={tmp_path / f'run{i}'}", timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        found = json.loads((tmp_path / f"run{i}" / "results.json").read_text())
        measured = found["step_time_ms"] / 1e3
        assert abs(math.log(st["seconds"] / measured)) <= math.log(1.5), (config, st, measured)
        if i:
            ref, carried = found["machine_reference"], found["step_time_carried"]
            assert ref["readings"] == 4 and ref["every"] == 5 and found["step_time"]["seconds"] == st["seconds"]
            ratio = ref["index_s"] / st["calibration"]["reference"]["index_s"]
            assert "each" not in st["calibration"]["reference"]  # the plan names the summary, not every reading
            assert carried["ratio"] == pytest.approx(ratio)
            assert carried["seconds"] == pytest.approx(st["seconds"] * ratio)
            assert abs(math.log(carried["seconds"] / measured)) <= math.log(1.5), (carried, measured)
            assert f"carried to the machine as this run found it (its reference x{carried['ratio']:.3f})" in run.stdout
        else:
            assert "machine_reference" not in found  # contract.reference_every=0: nothing between the steps
