"""Bisect: which change made it slow, found by one-variable A/Bs, automatically.

    moe-hydra bisect GOOD_DIR BAD_DIR [--out DIR] [KEY=VALUE ...]
    moe-hydra bisect --good "OVERRIDES" --bad "OVERRIDES" [--out DIR] [KEY=VALUE ...]

The difference between the good and the bad configuration (two run directories, or two sets of overrides) is split
into units: a config group's option with its own keys is one unit, any other key one of its own; what no config
switches (software versions, platform, CPU, CUDA: the runs' env.json) is reported, not bisected. Bad against good is
measured first (a sequential A/B, repeat=auto); if it is not slower the bisect stops: not reproduced. Then delta
debugging: subsets of the bad side's units applied to good, each judged against good by a sequential A/B, until the
smallest set that still makes it slower — one unit, or an interaction (two units slow only together) — with its
share of the regression; good and that set are profiled and the walls that moved named. A subset the rules refuse is
recorded and stepped around. KEY=VALUE applies to both sides (hardware.devices_per_node=2, launcher=slurm).

Its directory (--out, default outputs/bisect/<date>/<time>) holds bisect.json (the difference, every trial with its
verdict and interval, the culprit, the walls, GPU-hours), bisect.md (the answer first) and one directory per A/B.
The same command again continues a bisect that stopped, never measuring an A/B again; with launcher=slurm
launcher.detach=true each invocation queues what it can and returns. bisect.max_trials (24) bounds the A/Bs,
bisect.max_repeats (8) the runs an arm of each; bisect.window (auto: each run steps until its step times are
steady) is their window, and a run whose window is not steady is run again longer, never judged.

examples:
  moe-hydra bisect --good "train.micro_batch_size=4" --bad "train.micro_batch_size=4 recompute=full \
optimizer.lr=3e-4" --out outputs/bi hardware.devices_per_node=2
  moe-hydra bisect outputs/runs/2026-11-30/10-00-00 outputs/runs/2026-12-01/10-00-00
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from moe_hydra.core.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Refused

EXITS = {EXIT_OK: "the bisect ended (bisect.json status found, not_reproduced, max_trials or not_minimal), or "
         "queued its next A/B on Slurm (detached)",
         EXIT_FAILED: "an A/B the search cannot go on without failed",
         EXIT_REFUSED: "bad input, refused before anything ran: not two sides, a directory that is not a run, two "
         "identical configurations, a side that does not compose or plan, bisect.* out of bounds, a directory "
         "that holds another bisect"}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("words", nargs="*", metavar="DIR|KEY=VALUE", help="the good and the bad run directory (unless "
                    "--good/--bad), and overrides for both sides")
    ap.add_argument("--good", metavar="OVERRIDES", help="the good side as overrides, in one quoted argument")
    ap.add_argument("--bad", metavar="OVERRIDES", help="the bad side as overrides, in one quoted argument")
    ap.add_argument("--out", type=Path, metavar="DIR", help="the bisect's directory (default "
                    "outputs/bisect/<date>/<time>)")


def run(args: argparse.Namespace) -> int:
    from moe_hydra.commands import _overrides
    from moe_hydra.launch import bisect

    dirs = [w for w in args.words if "=" not in w]
    common = [w for w in args.words if "=" in w]
    envs: tuple[dict, dict] = ({}, {})
    if (args.good is None) != (args.bad is None):
        raise Refused("give both --good and --bad (or two run directories)")
    if args.good is not None:
        if dirs:
            raise Refused(f"--good/--bad or two run directories, not both (got {' '.join(dirs)})")
        try:
            good, bad = shlex.split(args.good), shlex.split(args.bad)
        except ValueError as e:
            raise Refused(f"--good/--bad: not a command line ({e})") from None
    elif len(dirs) == 2:
        (good, good_env), (bad, bad_env) = (bisect.run_dir_overrides(Path(d)) for d in dirs)
        envs = (good_env, bad_env)
    else:
        raise Refused(f"bisect takes two run directories (GOOD BAD) or --good and --bad; got {len(dirs)} "
                      f"director{'y' if len(dirs) == 1 else 'ies'}")
    problems = [p for side in (good, bad, common) for p in _overrides.check_overrides(side)]
    if problems:
        raise Refused("\n  ".join(dict.fromkeys(problems)))
    return bisect.Bisect(good, bad, common, args.out, envs).run()
