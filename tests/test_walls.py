"""The Three Walls from traces built by hand (moe_hydra.core.walls), and which wall moved (analysis.profiles)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_hydra.analysis import profiles
from moe_hydra.core import walls

MAIN, GLOO, GPU = (1, 10), (1, 11), (0, 7)
DATA = Path(__file__).parent / "data"


def ev(name, start, end, cat="cpu_op", where=MAIN):
    return {"ph": "X", "cat": cat, "name": name, "pid": where[0], "tid": where[1], "ts": start, "dur": end - start}


def step(n, start, end):
    return ev(f"{walls.STEP}{n}", start, end, cat="user_annotation")


def exclusive_sum(b):
    return sum(b[k] for k in walls.EXCLUSIVE)


def test_cpu_step_is_split_by_interval_union():
    """A CPU step of 100 us: an operator (with a nested one) 10..40, gloo's all-to-all on its own thread 30..60
    with the c10d call that starts it, and Megatron's _AllToAll Function around the wait (a span, not compute)."""
    trace = [step(1, 0, 100),
             ev("aten::mm", 10, 40), ev("aten::add", 15, 20),
             ev("_AllToAll", 44, 60), ev("c10d::alltoall_base_", 45, 46),
             ev("gloo:all_to_all", 30, 60, cat="user_annotation", where=GLOO),
             ev("autograd::engine::evaluate_function: MmBackward0", 60, 90), ev("aten::mm", 70, 80)]
    b = walls.breakdown(trace)
    assert b["device"] == "cpu" and b["steps"] == [1]
    assert b["wall_ms"] == pytest.approx(0.100)
    assert b["compute_ms"] == pytest.approx(0.040)  # 10..40 and 70..80; the wrappers are not compute
    assert b["communication_ms"] == pytest.approx(0.030)  # 30..60 (the c10d call lies inside)
    assert b["exposed_communication_ms"] == pytest.approx(0.020)  # 40..60: not under the operator
    assert b["host_ms"] == pytest.approx(0.040) and b["memcpy_ms"] == 0 and b["idle_ms"] == 0
    assert exclusive_sum(b) == pytest.approx(b["wall_ms"])
    # self time: the outer mm less the nested add
    top = {row["name"]: row for row in b["top_compute"]}
    assert top["aten::mm"]["ms"] == pytest.approx(0.035) and top["aten::mm"]["calls"] == 2
    assert b["top_communication"][0]["name"] == "gloo:all_to_all"


def test_gpu_step_splits_device_and_host_time():
    """Kernels 10..50 (compute) and 40..70 (NCCL), a copy 65..80, host calls 0..12 and 80..85, nothing after."""
    trace = [step(1, 0, 100),
             ev("sm90_xmma_gemm_bf16", 10, 50, cat="kernel", where=GPU),
             ev("ncclDevKernel_AllToAll_RING", 40, 70, cat="kernel", where=(0, 8)),
             ev("Memcpy DtoH", 65, 80, cat="gpu_memcpy", where=GPU),
             ev("aten::mm", 0, 12), ev("cudaStreamSynchronize", 80, 85, cat="cuda_runtime")]
    b = walls.breakdown(trace)
    assert b["device"] == "cuda"
    assert b["compute_ms"] == pytest.approx(0.040)
    assert b["communication_ms"] == pytest.approx(0.030)
    assert b["exposed_communication_ms"] == pytest.approx(0.020)  # 50..70
    assert b["memcpy_ms"] == pytest.approx(0.010)  # 70..80
    assert b["host_ms"] == pytest.approx(0.015)  # 0..10 and 80..85: the device idle, the host busy
    assert b["idle_ms"] == pytest.approx(0.015)  # 85..100
    assert exclusive_sum(b) == pytest.approx(b["wall_ms"])
    assert b["fractions"]["exposed_communication"] == pytest.approx(0.2)


def test_a_gpu_step_is_the_host_annotation_and_the_backward_thread_is_host():
    """The profiler projects the step's annotation onto the streams it launched on (``gpu_user_annotation``, shorter
    than the step); the step is the host's span. Autograd runs the backward pass on a thread of its own."""
    autograd = (1, 12)
    trace = [step(1, 0, 100), ev(f"{walls.STEP}1", 20, 30, cat="gpu_user_annotation", where=GPU),
             ev("sm90_xmma_gemm_bf16", 20, 30, cat="kernel", where=GPU),
             ev("aten::mm", 0, 20), ev("aten::mm", 50, 70, where=autograd),
             ev("cudaLaunchKernel", 70, 75, cat="cuda_runtime", where=autograd),
             ev("aten::mm", 80, 90, where=(2, 12))]  # another process's thread is not this rank's host
    b = walls.breakdown(trace)
    assert b["wall_ms"] == pytest.approx(0.100)
    assert b["compute_ms"] == pytest.approx(0.010)
    assert b["host_ms"] == pytest.approx(0.045)  # 0..20 on the main thread, 50..75 on autograd's
    assert b["idle_ms"] == pytest.approx(0.045)  # 30..50 and 75..100
    assert exclusive_sum(b) == pytest.approx(b["wall_ms"])


def test_a_real_h200_trace_of_a_host_bound_step():
    """Two steps of tiny_moe traced by torch.profiler on one H200 (benchmarks/gpu_check.sh, 2026-12-04; events
    outside steps 12-13 and the flow arrows cut): each step is launched from Python, the GPU mostly waits on it."""
    events = json.loads(gzip.decompress((DATA / "h200_tiny_moe.trace.json.gz").read_bytes()))["traceEvents"]
    annotations = [e for e in events if e["name"].startswith(walls.STEP) and e["cat"] == "user_annotation"]
    b = walls.breakdown(events, alone=True)
    assert b["device"] == "cuda" and b["steps"] == [12, 13]
    assert b["wall_ms"] == pytest.approx(sum(e["dur"] for e in annotations) / 1e3)  # 136.5 ms, not the streams'
    assert exclusive_sum(b) == pytest.approx(b["wall_ms"])
    assert b["compute_ms"] < 0.05 * b["wall_ms"] < b["host_ms"] / 10  # a host-bound step: host most of the wall
    main_thread_only = walls.breakdown([e for e in events if e["tid"] == annotations[0]["tid"] or e["pid"] == 0],
                                       alone=True)
    assert main_thread_only["host_ms"] < b["host_ms"] - 0.1 * b["wall_ms"]  # the backward thread's launches count


def test_a_lone_rank_has_no_communication():
    """One rank's collectives move nothing: NCCL's kernels are compute, gloo's work is not communication."""
    gpu = [step(1, 0, 100), ev("ncclDevKernel_AllReduce", 10, 30, cat="kernel", where=GPU)]
    assert walls.breakdown(gpu, alone=True)["communication_ms"] == 0
    assert walls.breakdown(gpu, alone=True)["compute_ms"] == pytest.approx(0.020)
    cpu = [step(1, 0, 100), ev("c10d::allreduce_", 5, 6), ev("gloo:all_reduce", 6, 30, "user_annotation", GLOO)]
    assert walls.breakdown(cpu, alone=True)["communication_ms"] == 0
    assert walls.breakdown(cpu)["communication_ms"] == pytest.approx(0.025)


def test_steps_are_measured_one_by_one_and_outside_time_is_ignored():
    trace = [step(1, 0, 100), step(2, 200, 250), ev("aten::mm", 90, 210), ev("aten::mm", 120, 180)]
    b = walls.breakdown(trace)
    assert b["steps"] == [1, 2]
    assert b["per_step_ms"]["wall_ms"] == pytest.approx([0.100, 0.050])
    assert b["per_step_ms"]["compute_ms"] == pytest.approx([0.010, 0.010])  # only the parts inside each step
    assert b["wall_ms"] == pytest.approx(0.150)


def test_a_trace_without_step_annotations_is_refused():
    with pytest.raises(ValueError, match="no step annotations"):
        walls.breakdown([ev("aten::mm", 0, 10)])


def test_the_slowest_rank_is_the_one_whose_window_took_longest():
    fast = {"rank": 0, **{k: 1.0 for k in walls.PARTS}}
    slow = {"rank": 1, **{k: 2.0 for k in walls.PARTS}}
    s = walls.summarize([slow, fast])
    assert s["slowest_rank"]["rank"] == 1 and [r["rank"] for r in s["ranks"]] == [0, 1]
    assert s["spread"]["wall_ms"] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}


intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)).map(sorted).map(tuple), max_size=8)


def cells(ivs):
    return {x for a, b in ivs for x in range(a, b)}


@settings(max_examples=300, deadline=None)
@given(intervals, intervals, st.integers(0, 60), st.integers(0, 60))
def test_interval_arithmetic_matches_counting_cells(a, b, lo, hi):
    """merge, subtract, clip and length against sets of unit cells."""
    ma, mb = walls.merge(a), walls.merge(b)
    assert cells(ma) == cells(a) and all(x[1] < y[0] for x, y in zip(ma, ma[1:]))
    assert cells(walls.subtract(ma, mb)) == cells(a) - cells(b)
    assert walls.length(walls.subtract(ma, mb)) == len(cells(a) - cells(b))
    assert cells(walls.clip(ma, lo, hi)) == {x for x in cells(a) if lo <= x < hi}


# --------------------------------------------------------------------------- which wall moved

def doc(**per_step):
    base = {"wall_ms": [100.0] * 5, "compute_ms": [60.0, 61, 59, 60, 60], "communication_ms": [10.0] * 5,
            "exposed_communication_ms": [5.0, 5.5, 4.5, 5, 5], "host_ms": [35.0, 34, 36, 35, 35],
            "memcpy_ms": [0.0] * 5, "idle_ms": [0.0] * 5}
    return {"profile_version": 1, "slowest_rank": {"per_step_ms": {**base, **per_step}}}


def test_the_wall_that_moved_is_named_with_its_size():
    b = doc(wall_ms=[140.0] * 5, communication_ms=[48.0, 49, 50, 51, 52], exposed_communication_ms=[43.0, 44, 45, 46, 42])
    m = profiles.moved([doc()], [b], floor=0.02)
    assert m["moved"][0] == "communication" and set(m["moved"]) == {"communication", "exposed communication"}
    assert m["walls"]["exposed communication"]["delta_ms_per_step"] == pytest.approx(39.0)
    assert m["summary"].startswith("communication +40.0 ms/step") and "compute, host, memcpy, idle unchanged" in m["summary"]


def test_a_move_within_the_noise_floor_is_unchanged():
    b = doc(host_ms=[38.0, 37, 39, 38, 38])  # +3 ms/step, 3 % of a 100 ms step
    assert "host" in profiles.moved([doc()], [b], floor=0.0)["moved"]
    assert profiles.moved([doc()], [b], floor=0.05)["moved"] == []


def test_a_malformed_profile_is_left_out_with_a_warning(tmp_path):
    warned = []
    (tmp_path / "profile.json").write_text('{"profile_version": 1, "slowest_rank": {"per_step_ms": {"wall_ms": [1]}}}')
    assert profiles.read(tmp_path, warned.append) is None
    assert "compute_ms" in warned[0] and "profile.json" in warned[0]
    assert profiles.read(tmp_path / "absent", warned.append) is None and len(warned) == 1
