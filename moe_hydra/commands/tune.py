"""Tune: run the evidence-gated loop by itself, from a start to a validated, exported configuration.

    moe-hydra tune [GROUP=OPTION ...] [KEY=VALUE ...]

It takes the groups and overrides python -m moe_hydra takes, the start of the loop: contract (what is frozen and
what may change) -> fit (the memory estimate and a build of the layout) -> scale (the layout search) -> screen (short
measured runs of the layouts the search cannot tell apart) -> profile (which wall dominates the step) -> retune
(one-variable A/Bs against the incumbent for that wall, each a sequential repeat=auto test: only "faster" is
accepted, and the winner is profiled again) -> validate (a 50-step run through the acceptance gate, its golden
values kept, and a sequential A/B of the winner against the start) -> export (Megatron-LM and Megatron-Bridge
commands). Its directory is hydra.sweep.dir (default outputs/tune/<date>/<time>): tune.json (the journal: every
stage's evidence, every run, GPU-hours spent), tune.md (the story), tune.png, and best/ (the winner's overrides,
commands and baseline). The same command again continues a tune that stopped, never running a finished experiment
again; with launcher=slurm launcher.detach=true each invocation queues what it can and returns.

tune.max_trials (16) and tune.budget_gpu_hours (8) bound the retune; tune.allow=[precision,routing,data] lets it
try changes that alter numerics or the label; tune.window (auto: each run steps until its step times are steady)
is the window of its short runs, and a run whose window is not steady is run again longer, never judged;
tune.max_repeats (4) the runs an arm of each A/B, stopped early once a gain of tune.min_gain (0.05) is ruled out.

examples:
  moe-hydra tune hardware.devices_per_node=2 recompute=full train.micro_batch_size=1 train.global_batch_size=8
  moe-hydra tune model=qwen3_30b_a3b hardware=h100_sxm hardware.nodes=2 launcher=slurm hydra.sweep.dir=outputs/q3
  moe-hydra tune ... tune.allow=[precision] tune.budget_gpu_hours=64
"""

from __future__ import annotations

import argparse

from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED

EXITS = {EXIT_OK: "the tune ended (tune.json status done), or queued its next experiment on Slurm (detached)",
         EXIT_FAILED: "an experiment the loop cannot go on without failed (the search, the screening)",
         EXIT_REFUSED: "bad input, refused before anything ran: an override that does not compose, a start the rules "
         "refuse, tune.* out of bounds, a tune directory that holds another tune or is held by a running one"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="the start, as python -m moe_hydra takes it "
                    "(group=option, key=value), and hydra.sweep.dir=DIR for the tune's directory")


def run(args: argparse.Namespace) -> int:
    from moe_hydra.commands import _overrides
    from moe_hydra.launch import tune

    argv = [a for a in _overrides.normalize(args.overrides) if a not in ("-m", "--multirun")]
    problems = _overrides.check_overrides(argv)
    if problems:
        from moe_hydra.core.errors import Refused

        raise Refused("\n  ".join(problems))
    return tune.Tune(argv).run()
