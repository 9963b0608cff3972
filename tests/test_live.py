"""What a running job shows while it runs (moe_hydra.job.live): the routers' health in results.json from a real
Megatron-Core run, against a known answer (a capacity factor of 0.5 drops at least about half the routed slots),
and the rows and figures the live log builds. The W&B history of real runs, read back from the offline files:
tests/test_tracking.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import yaml

from moe_hydra.core.metrics import StepRecord
from moe_hydra.job import live


def test_the_log_interval_is_every_step_for_short_runs_and_every_tenth_else():
    assert live.log_interval(SimpleNamespace(log_interval=None), 99) == 1
    assert live.log_interval(SimpleNamespace(log_interval=None), 100) == 10
    assert live.log_interval(SimpleNamespace(log_interval=3), 1000) == 3


def test_a_row_carries_megatrons_keys_and_the_window_only_inside_it():
    rec = StepRecord(step=5, time_ms=250.0, loss=6.5, grad_norm=1.5, memory_gib=2.0)
    row = live.row(rec, tokens_per_step=1000, world=2, flops_per_token=1e9, peak=10.0, lr=3e-4, window=(4, 10))
    assert row["iteration-time"] == 0.25 and row["lm loss"] == 6.5 and row["grad-norm"] == 1.5
    assert row["learning-rate"] == 3e-4 and row["train/step"] == 5
    assert row["throughput/tokens_per_s_per_gpu"] == pytest.approx(2000.0)  # 1000 tokens / 0.25 s / 2 GPUs
    assert row["throughput"] == pytest.approx(2.0) == row["throughput/tflops_per_gpu"]  # 2000 x 1 GFLOP/s: TFLOP/s
    assert row["throughput/mfu"] == pytest.approx(0.2) and row["mem-max-allocated-bytes"] == 2 * 2**30
    assert row["steady/step_ms"] == 250.0
    outside = live.row(StepRecord(step=3, time_ms=250.0, loss=6.5), 1000, 2, 1e9, None, None, (4, 10))
    assert not any(k.startswith("steady/") for k in outside) and "throughput/mfu" not in outside
    assert "grad-norm" not in outside and "learning-rate" not in outside


def test_the_router_summary_averages_the_windows_logged_steps_per_layer():
    def layer(i, imbalance):
        return {"layer": i, "tokens_per_expert": [imbalance, 2 - imbalance], "imbalance": imbalance,
                "ep_imbalance": 1.0, "dropped_share": 0.0, "load_balancing_loss": 1.0 + i}

    logged = [(1, [layer(0, 1.9), layer(1, 1.9)]), (4, [layer(0, 1.2), layer(1, 1.6)]),
              (5, [layer(0, 1.4), layer(1, 1.2)])]
    s = live.router_summary(logged, (4, 10))
    assert s["steps"] == [4, 5] and [x["layer"] for x in s["layers"]] == [0, 1]
    assert s["layers"][0]["imbalance"] == pytest.approx(1.3) and s["layers"][1]["imbalance"] == pytest.approx(1.4)
    assert s["worst_layer"] == 1 and s["layers"][1]["load_balancing_loss"] == 2.0
    assert s["layers"][0]["tokens_per_expert"] == pytest.approx([1.3, 0.7])
    assert live.router_summary([], (4, 10)) is None
    row = live.router_row(logged[1][1])
    assert row["moe/imbalance_layer_1"] == 1.6 and row["moe/imbalance_max"] == 1.6
    assert row["moe/load_balancing_loss_layer_0"] == 1.0


def test_diff_names_an_imbalance_change_per_layer():
    from moe_hydra.analysis.diagnosis import router_moved

    a = {"layers": [{"layer": 0, "imbalance": 1.2}, {"layer": 1, "imbalance": 1.25}]}
    b = {"layers": [{"layer": 0, "imbalance": 1.22}, {"layer": 1, "imbalance": 1.75}]}
    assert router_moved(a, b) == "moved on layer 1 (1.25 -> 1.75, +40.0%)"
    assert router_moved(a, a) == "steady (worst layer 1: 1.25 -> 1.25, +0.0%)"
    assert router_moved(a, None) is None and router_moved(None, b) is None  # a dense model: no line


@pytest.mark.slow
def test_a_capacity_factor_of_half_drops_half_the_routed_slots_on_ep2(cli, tmp_path):
    """A real EP 2 run of tiny_moe with moe_expert_capacity_factor 0.5: each expert keeps at most half its even
    share, so at least about half the routed slots are dropped, on every MoE layer; what is kept is the tokens x
    top-k of the global batch less the dropped; the imbalance of the kept tokens is at least 1 per expert and per
    EP rank; the aux loss is the router's."""
    r = cli("hardware.devices_per_node=2", "expert_mesh=ep2", "routing.moe_expert_capacity_factor=0.5",
            "logger=none", "contract.window=[4,6]", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "window ends in" not in r.stdout + r.stderr and re.search(r"step +6 +loss", r.stdout + r.stderr)  # plain
    assert re.search(r"moe_hydra: routers: imbalance \(max / mean tokens per expert\) layer 0 [0-9.]+, layer 1 "
                     r"[0-9.]+; worst layer \d, EP ranks [0-9.]+; up to [0-9.]+% of routed slots dropped", r.stdout), \
        r.stdout[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    router = results["router"]
    assert router["steps"] == [4, 5, 6] and [x["layer"] for x in router["layers"]] == [0, 1]
    topk = yaml.safe_load((tmp_path / "run" / ".hydra" / "config.yaml").read_text())["model"]["moe_router_topk"]
    slots = results["tokens_per_step"] * topk  # each token routed to top-k experts
    for x in router["layers"]:
        assert 0.4 <= x["dropped_share"] < 1.0, x
        assert sum(x["tokens_per_expert"]) == pytest.approx((1 - x["dropped_share"]) * slots), x
        assert 1.0 <= x["ep_imbalance"] <= x["imbalance"], x
        assert x["load_balancing_loss"] > 0, x


@pytest.mark.slow
def test_sweep_status_shows_a_running_local_point_with_its_last_step(tmp_path):
    """A local sweep whose first point trains for a while: `sweep status` shows it RUNNING with the step rank 0
    last logged and its step time (read from the point's live.json while its process lives), not UNKNOWN."""
    sweep = tmp_path / "multi"
    proc = subprocess.Popen([sys.executable, "-m", "moe_hydra", "logger=none", "contract.window=[4,400]",
                             "seed=1,2", f"hydra.sweep.dir={sweep}", "-m"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        seen = ""
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if list(sweep.glob("*/live.json")):
                r = subprocess.run([sys.executable, "-m", "moe_hydra.sweep", "status", str(sweep)],
                                   capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
                seen = r.stdout + r.stderr
                if re.search(r"RUNNING.*step \d+", seen):
                    break
            assert proc.poll() is None, "the sweep ended before it was seen running"
            time.sleep(1)
        assert re.search(r"RUNNING.*step \d+", seen), seen
        record = json.loads(next(sweep.glob("*/live.json")).read_text())
        assert record["step"] >= 1 and record["train_iters"] == 400 and record["step_time_ms"] > 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


@pytest.mark.slow
def test_a_run_on_a_terminal_shows_its_live_line(tmp_path):
    """Through a pseudo-terminal the run draws its live line (step, step time, tokens/s/GPU, loss, the time left
    to the end of the window) besides the metric lines; through a pipe (every other test's runs, CI, Slurm logs)
    only the metric lines come out (the capacity test checks that)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the run, its output on the terminal
        os.chdir(tmp_path)
        os.environ.update({"COLUMNS": "200", "TERM": "xterm"})
        os.execv(sys.executable, [sys.executable, "-m", "moe_hydra", "logger=none", "contract.window=[4,8]",
                                  f"hydra.run.dir={tmp_path / 'run'}"])
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 0, text[-3000:]
    assert re.search(r"\d+/8 .*ms/step .*tokens/s/GPU .*loss \d+\.\d+ .*window ends in \d+ s", text), text[-3000:]
    assert re.search(r"step +8 +loss", text), text[-3000:]  # the metric lines still come


def test_nvml_is_sampled_on_its_own_thread_and_the_loop_reads_the_latest():
    """A fake NVML whose power rises on each reading: the sampler thread keeps reading it while the caller only
    takes the latest sample (no NVML call on its own thread), with the temperature and throttle reasons."""
    import threading

    from moe_hydra.job import telemetry

    callers = []

    class FakeNvml:
        NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
        readings = 0

        def nvmlDeviceGetName(self, h): return "Fake GPU"  # noqa: E704
        def nvmlSystemGetDriverVersion(self): return "1.0"  # noqa: E704
        def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=2**30)  # noqa: E704
        def nvmlDeviceGetClockInfo(self, h, kind): return 1980  # noqa: E704
        def nvmlDeviceGetTemperature(self, h, kind): return 61  # noqa: E704
        def nvmlDeviceGetCurrentClocksEventReasons(self, h): return 4  # noqa: E704

        def nvmlDeviceGetPowerUsage(self, h):
            callers.append(threading.current_thread().name)
            FakeNvml.readings += 1
            return 1000 * FakeNvml.readings

    gpu = telemetry.Gpu(FakeNvml(), None, 0).start()
    first = gpu.latest()
    time.sleep(5 * telemetry.INTERVAL_S)
    later = gpu.latest()
    gpu.stop()
    assert first["temperature_c"] == 61 and first["throttle_reasons"] == 4 and first["memory_used_gib"] == 1.0
    assert later["power_w"] > first["power_w"]  # the thread went on reading
    assert callers.count(threading.current_thread().name) == 1  # only start()'s first reading ran here


def test_a_sweep_counts_its_points_from_its_sweep_overrides():
    from moe_hydra.commands.run import sweep_size

    assert sweep_size(["a=1,2", "b=x,y,z", "c=3"]) == 6 and sweep_size(["seed=range(0,4)"]) == 4
    assert sweep_size(["c=1"]) == 1 and sweep_size(["lr=interval(0,1)"]) is None  # an interval has no count


def test_a_sweeps_progress_is_a_bar_on_a_terminal_and_a_line_elsewhere(tmp_path):
    """After each point: points done by state (failed ones in red on a terminal), those to go and the slowest point
    so far, read from the points' results.json."""
    import io

    from rich.console import Console

    from moe_hydra.commands.run import Outcomes

    from tests.test_compare import fake_run

    for i, ms in ((0, 120.0), (1, 180.0)):
        fake_run(tmp_path, str(i), [ms] * 23)
    shown = {}
    for terminal in (False, True):
        o = Outcomes()
        o.points, out = 4, io.StringIO()
        o.console = Console(file=out, force_terminal=terminal, width=140, color_system="standard" if terminal else None)
        for i, state in ((0, "COMPLETED"), (1, "COMPLETED"), (2, "FAILED")):
            o.outcomes.append((f"#{i} x={i}", state))
            o._progress(f"#{i} x={i}", str(tmp_path / str(i)))
        shown[terminal] = out.getvalue().splitlines()
    plain, bar = shown[False], shown[True]
    assert plain[0] == "moe_hydra.sweep: 1 of 4 points done (1 COMPLETED), 3 to go; slowest so far #0 x=0: 120.0 ms/step"
    assert plain[2] == ("moe_hydra.sweep: 3 of 4 points done (2 COMPLETED, 1 FAILED), 1 to go; slowest so far #1 "
                        "x=1: 180.0 ms/step")
    assert len(bar) == 3 and all("\x1b[" in line and "━" in line for line in bar)  # drawn, coloured
    last = re.sub(r"\x1b\[[0-9;]*m", "", bar[2])
    assert re.search(r"sweep ━+\S* +3/4 points +2 COMPLETED +1 FAILED +1 to go +slowest so far #1 x=1: 180.0 ms/step",
                     last), last
    assert "\x1b[31m1 FAILED" in bar[2]  # red
