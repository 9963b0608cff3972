"""How far this machine's speed moves while nothing changes, and which cheap probe follows the model's step.

A calibration (``stage=calibrate``) predicts the machine as it was while it measured; on this 2-core VM the same
run's step time moves by tens of percent between hours. This benchmark measures that drift and what would track
it: on the job's processes (2 ranks, gloo, the job's threads), one shrunken model of ``--model`` built once, then
for ``--minutes`` rounds of ``--steps`` training steps (their median; the slowest rank's) each followed by four
probes, every rank at once after a barrier, the slowest rank's time:

- ``host``: 300 forward and backward calls of eight 16-wide linear layers (module calls and op dispatch: the host
  cost that is most of a small model's step on a CPU);
- ``gemm``: ``calibrate.gemm`` (the calibration's own rate measurement), 100 calls of a micro-batch's tokens x
  hidden x 4 hidden, fp32;
- ``memory``: ``calibrate.memory_bandwidth`` on 64 MiB (larger than the caches);
- ``python``: a plain Python loop of 3 million additions (the interpreter alone).

It prints the step's range over the run; how far the same step differs between two windows of ``--window`` rounds
(every pair: |ln| median, p90, worst), which is what the machine alone moves a prediction made in one window and
judged in another; and each probe's Pearson correlation with the step, round by round and over the windows (log
times), with what is left of those differences once each window's step is divided by the probe's ratio. A probe that
follows the step closely could carry a calibration to the machine as it is now; one that does not, cannot.

    python benchmarks/machine_drift.py [--minutes 15] [--model tiny_moe] [--steps 12] [--window 8] [OVERRIDE ...]

A killed run leaves its two rank processes behind (torch's spawn): stop it with Ctrl-C, or kill its process group.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import socket
import statistics
import time
from pathlib import Path

PROBES = ("host", "gemm", "memory", "python")


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    from moe_hydra.core.resolved import resolve
    from moe_hydra.job import calibrate
    from moe_hydra.job.train import Job
    from moe_hydra.launch.compose import compose_typed

    r = resolve(compose_typed([f"model={args.model}", *args.overrides, "stage=calibrate",
                               f"hardware.devices_per_node={world}"]))
    job = Job(r, {})
    job.init_distributed()
    shape = calibrate.shrunk(r, args.layers, 1, args.seq_length, args.microbatches)
    calibrate.release_model_parallel()
    job.for_plan(shape).init_model_parallel()
    timer = calibrate.Built(job, shape).timer(shape)
    for _ in range(calibrate.STEP_WARMUP):
        timer.step()

    layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)])
    x16 = torch.randn(4, 16)
    h = r.cfg.model.hidden_size

    def host() -> None:
        for _ in range(300):
            layers(x16).sum().backward()

    def python() -> None:
        s = 0
        for i in range(3_000_000):
            s += i

    probes = {"host": host,
              "gemm": lambda: calibrate.gemm(args.seq_length, 4 * h, h, torch.float32, job.device, repeats=100),
              "memory": lambda: calibrate.memory_bandwidth(1 << 24, torch.float32, job.device, repeats=10),
              "python": python}
    rounds, end = [], time.monotonic() + 60 * args.minutes
    while True:
        row = {"t": time.time(), "step": statistics.median(timer.step()[0] for _ in range(args.steps))}
        for name, call in probes.items():
            dist.barrier()
            t0 = time.perf_counter()
            call()
            row[name] = time.perf_counter() - t0
        slowest = torch.tensor([row[k] for k in ("step", *PROBES)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        rounds.append({**row, **dict(zip(("step", *PROBES), slowest.tolist()))})
        done = torch.tensor([float(time.monotonic() > end)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)  # every rank stops after the same round
        if done.item():
            break
    calibrate.release_model_parallel()
    dist.destroy_process_group()
    if rank == 0:
        shape_of = {"layers": args.layers, "seq_length": args.seq_length, "microbatches": args.microbatches}
        Path(out).write_text(json.dumps({"model": " ".join([args.model, *args.overrides]), "shape": shape_of,
                                         "rounds": rounds}))


def report(found: dict, window: int) -> None:
    import numpy
    from scipy.stats import pearsonr

    rounds = found["rounds"]
    logs = {k: [math.log(x[k]) for x in rounds] for k in ("step", *PROBES)}

    def windows(v: list[float]) -> list[float]:
        return [statistics.fmean(v[i:i + window]) for i in range(0, len(v) - window + 1, window)]

    step_w = windows(logs["step"])
    minutes = (rounds[-1]["t"] - rounds[0]["t"]) / 60
    print(f"{found['model']}, {found['shape']}: {len(rounds)} rounds over {minutes:.1f} min")
    print(f"step (median of a round): {min(x['step'] for x in rounds) * 1e3:.0f}-"
          f"{max(x['step'] for x in rounds) * 1e3:.0f} ms; windows of {window} rounds: "
          f"{math.exp(min(step_w)) * 1e3:.0f}-{math.exp(max(step_w)) * 1e3:.0f} ms "
          f"(|ln| range {max(step_w) - min(step_w):.3f})")
    pairs = list(itertools.combinations(range(len(step_w)), 2))

    def spread(apart: list[float]) -> str:
        return (f"{statistics.median(apart):6.3f} {numpy.percentile(apart, 90):6.3f} {max(apart):6.3f}"
                if apart else "")

    # the same step in two windows: what the machine alone moves a prediction made in one and judged in the other
    print(f"{'probe':8} {'median ms':>9} {'r, rounds':>10} {'r, windows':>11}   |ln| of two windows' steps (median, "
          f"p90, worst over {len(pairs)} pairs)")
    print(f"{'(none)':8} {'':9} {'':10} {'':11}   {spread([abs(step_w[i] - step_w[j]) for i, j in pairs])}")
    for k in PROBES:
        probe_w = windows(logs[k])  # with the probe's ratio applied: what a reference read through both would leave
        print(f"{k:8} {statistics.median(x[k] for x in rounds) * 1e3:9.1f} "
              f"{pearsonr(logs['step'], logs[k])[0]:10.2f} {pearsonr(step_w, probe_w)[0]:11.2f}   "
              f"{spread([abs(step_w[i] - step_w[j] - probe_w[i] + probe_w[j]) for i, j in pairs])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--model", default="tiny_moe")
    ap.add_argument("overrides", nargs="*", help="more config overrides (the model's widths: model.hidden_size=256)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--out", default="outputs/machine_drift.json")
    ap.add_argument("--report", help="only print the report of an earlier --out")
    args = ap.parse_args()
    if not args.report:
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        mp.spawn(_rank, args=(2, port, args, args.out), nprocs=2)
    report(json.loads(Path(args.report or args.out).read_text()), args.window)


if __name__ == "__main__":
    main()
