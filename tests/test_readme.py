"""README.md's examples run as written and do what their comments say.

Every command line of README.md's fenced shell blocks (a line continued with a backslash is one; ``a && b`` is two)
has a row in EXAMPLES, saying how this test runs it; a new example without a row fails the test. The lines run in
README order, through bash, in a scratch directory holding the repository's docs/ and README.md (the examples'
inputs), with this environment's ``python`` and ``moe-hydra`` first on PATH:

- ``Run()``: as written. A plan or fit must report that its layout fits; the layout search must write a
  ``run_top.sh`` that trains its top layouts (no ``stage=plan``), whose first layout this test then plans;
- ``Plan(why)``: it trains (minutes on CPUs, or GPUs): planned instead (``stage=plan`` added, in a directory of its
  own), which checks that it composes, that the rules pass and that every point fits;
- ``Fixture(why)``: as written, on a directory of results written where the line before would have trained them;
- ``Skip(why)``: not run here, for the reason given (Slurm only, the test suite itself).
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from moe_hydra.core import contract
from moe_hydra.core.resolved import resolve
from moe_hydra.testing.results import base_results
from tests.conftest import compose_config
from tests.data.fixtures import write_calibration

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


@dataclass(frozen=True)
class Run:
    """Run it as written; ``beside``: it needs nothing from the lines before it, so it starts at once, in a scratch
    directory of its own, beside the others (the test's time is the longest lane's, not the sum)."""
    beside: bool = False


@dataclass(frozen=True)
class Plan:
    why: str
    replace: tuple[tuple[str, str], ...] = ()  # (text, by) changed in the line before it is planned


@dataclass(frozen=True)
class Fixture:
    why: str
    write: Callable[[Path], None]


@dataclass(frozen=True)
class Skip:
    why: str


def _write(d: Path, res: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.json").write_text(json.dumps(res))


def ab_sweep(cwd: Path) -> None:
    """outputs/ab: three repeats of each dispatcher, allgather 20 % slower."""
    rng = random.Random(5)
    arms = [("alltoall", 100.0), ("allgather", 120.0)] * 3
    for i, (dispatcher, mean) in enumerate(arms):
        _write(cwd / "outputs/ab" / str(i), base_results(dispatcher, [rng.gauss(mean, 2) for _ in range(20)], i + 1))


def noise_repeats(cwd: Path) -> None:
    """outputs/noise: eight repeats of one config."""
    rng = random.Random(6)
    for i in range(8):
        res = base_results("alltoall", [rng.gauss(100, 2) for _ in range(20)], 100 + i)
        res.update(swept=["repeat"], **contract.hashes(res["contract"], ["repeat"]))
        _write(cwd / "outputs/noise" / str(i), res)


def auto_run(cwd: Path) -> None:
    """outputs/auto: a contract.window=auto run, steady from step 4, its window the 20 steps it stopped on."""
    rng = random.Random(5)
    res = base_results("alltoall", [rng.gauss(100, 2) for _ in range(23)], 300)
    res.update(swept=[], window=[4, 23], window_measured=[4, 23], window_declared="auto",
               **contract.hashes(res["contract"], []))
    _write(cwd / "outputs/auto", res)


def validated_run(cwd: Path) -> None:
    """outputs/validate: one 50-step run on real data, its window [41, 50] steady, its loss falling."""
    rng = random.Random(7)
    res = base_results("alltoall", [rng.gauss(100, 2) for _ in range(50)], 200)
    res.update(swept=[], window=[41, 50], **contract.hashes(res["contract"], []))
    res["loss"]["per_step"] = [7.0 - 0.02 * i for i in range(50)]
    res["loss"]["last"] = res["loss"]["per_step"][-1]
    _write(cwd / "outputs/validate", res)


def calibration(cwd: Path) -> None:
    """outputs/calibration/calibration.json: a calibration of the two-process default (not measured)."""
    (cwd / "outputs/calibration").mkdir(parents=True, exist_ok=True)
    write_calibration(cwd / "outputs/calibration/calibration.json",
                      resolve(compose_config("hardware.devices_per_node=2")))


TRAINS = "trains on this machine's CPUs (tests/test_job.py trains the same)"
SLURM = "Slurm only (tests/test_campaign.py queues, follows and waits for detached campaigns on a local Slurm)"
EXAMPLES = {
    "make run": Skip("trains the default, as `python -m moe_hydra` does (tests/test_job.py)"),
    "make test": Skip("the test suite itself"),
    "python -m moe_hydra hardware.devices_per_node=2 attention_mesh=tp2 expert_mesh=ep2": Plan(TRAINS),
    "python -m moe_hydra hydra.run.dir=outputs/auto": Plan(TRAINS + " until steady (tests/test_steady.py trains it)"),
    "moe-hydra steady outputs/auto": Fixture("judges the run the line before trains", auto_run),
    "python -m moe_hydra stage=plan model=qwen3_30b_a3b hardware=h100_sxm hardware.nodes=2 expert_mesh=ep16": Run(),
    "python -m moe_hydra stage=fit model=deepseek_v3 hardware=h100_sxm hardware.nodes=128 mesh=dsv3_h100_1024 "
    'recompute=selective "recompute.recompute_modules=[core_attn,layernorm,mla_up_proj]"': Run(beside=True),
    "python -m moe_hydra stage=plan model=qwen3_235b_a22b hardware=h100_sxm hardware.nodes=32 hydra/sweeper=layout -m":
        Run(beside=True),
    "python -m moe_hydra hardware.devices_per_node=2 expert_mesh=ep2 profile=window": Plan(
        "trains and profiles on this machine's CPUs (tests/test_profile.py profiles the same)"),
    "python -m moe_hydra hardware.devices_per_node=2 expert_mesh=ep2 dispatcher=alltoall,allgather repeat=0,1,2 "
    "hydra.sweep.dir=outputs/ab -m": Plan("trains six runs; planned once per arm (a repeat is the same plan)",
                                          replace=(("repeat=0,1,2", "repeat=0"),)),
    "python -m moe_hydra.compare outputs/ab": Fixture("compares the six runs the line before trains", ab_sweep),
    "python -m moe_hydra launcher=slurm launcher.detach=true dispatcher=alltoall,allgather repeat=0,1,2 "
    "hydra.sweep.dir=outputs/campaign -m": Skip(SLURM),
    "python -m moe_hydra.sweep wait outputs/campaign": Skip(SLURM),
    "python -m moe_hydra repeat=0,1,2,3,4,5,6,7 hydra.sweep.dir=outputs/noise -m": Plan(
        "trains eight runs; planned once (a repeat is the same plan)", replace=(("repeat=0,1,2,3,4,5,6,7", "repeat=0"),)),
    "python -m moe_hydra.noise outputs/noise": Fixture("measures the eight runs the line before trains",
                                                       noise_repeats),
    "python -m moe_hydra train.global_batch_size=8 train.micro_batch_size=4,8 repeat=auto "
    "compare.noise_file=outputs/noise/noise.json": Plan("trains rounds of runs until the A/B is decided; its arms "
                                                        "are planned", replace=(("repeat=auto", "-m"),)),
    "python -m moe_hydra.data prepare --out data/docs docs/*.md README.md": Run(),
    'python -m moe_hydra data.kind=megatron "data.path=[data/docs]" contract.window=auto contract.warmup_steps=30 '
    "hydra.run.dir=outputs/validate": Plan(TRAINS + " for 50 steps or more"),
    "moe-hydra accept outputs/validate": Fixture("accepts the run the line before trains", validated_run),
    "python -m moe_hydra.tune hardware.devices_per_node=2 recompute=full train.micro_batch_size=1 "
    "train.global_batch_size=8 hydra.sweep.dir=outputs/tune": Skip(
        "trains for minutes: tests/test_tune.py runs the loop from this start"),
    "python -m moe_hydra stage=calibrate hardware.devices_per_node=2 hydra.run.dir=outputs/calibration": Skip(
        "measures for minutes: tests/test_calibrate.py calibrates two processes"),
    "python -m moe_hydra stage=plan hardware.devices_per_node=2 "
    "hardware.calibration=outputs/calibration/calibration.json": Fixture(
        "plans from the calibration the line before measures", calibration),
    'python -m moe_hydra.bisect --good "train.micro_batch_size=4" --bad "train.micro_batch_size=4 recompute=full '
    'optimizer.lr=3e-4" --out outputs/bisect hardware.devices_per_node=2': Skip(
        "trains for minutes: tests/test_bisect.py finds full recompute among neutral optimizer keys"),
}


def examples(text: str) -> list[str]:
    """The command lines of the fenced shell blocks: comments and blank lines left out, continued lines joined,
    ``a && b`` two commands."""
    out = []
    for block in re.findall(r"^```(?:bash|sh|shell|console)\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            out += [" ".join(part.split()) for part in line.split(" && ") if part.strip()]
    return out


def test_every_readme_example_has_a_row():
    found = examples(README.read_text())
    missing = [e for e in found if e not in EXAMPLES]
    assert not missing, "README examples with no row in tests/test_readme.py's EXAMPLES (say how to run each):\n  " \
        + "\n  ".join(missing)
    stale = [e for e in EXAMPLES if e not in found]
    assert not stale, "rows of EXAMPLES that README.md no longer shows:\n  " + "\n  ".join(stale)


def _scratch(path: Path) -> Path:
    """A directory holding what the examples read: the repository's docs/ and README.md."""
    path.mkdir()
    (path / "docs").symlink_to(ROOT / "docs")
    (path / "README.md").symlink_to(README)
    return path


def test_readme_examples_run_as_written(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}

    def start(line: str, cwd: Path) -> subprocess.Popen:
        return subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def bash(line: str, cwd: Path) -> tuple[int, str, str]:
        proc = start(line, cwd)
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err

    cwd = _scratch(tmp_path / "work")
    lines = examples(README.read_text())
    beside = {i: (_scratch(tmp_path / f"beside{i}"), set()) for i, line in enumerate(lines)
              if isinstance(EXAMPLES[line], Run) and EXAMPLES[line].beside}
    running = {i: start(lines[i], d) for i, (d, _) in beside.items()}
    failures = []
    for i, line in enumerate(lines):
        how = EXAMPLES[line]
        if isinstance(how, Skip) or i in beside:
            continue
        if isinstance(how, Fixture):
            how.write(cwd)
        run = line
        if isinstance(how, Plan):
            for text, by in how.replace:
                assert text in run, (line, text)
                run = run.replace(text, by)
            run += f" stage=plan hydra.run.dir=planned/{i} hydra.sweep.dir=planned/{i}"
        before = set(cwd.rglob("plan.json"))
        failures += _problems(run, cwd, before, *bash(run, cwd), bash)
    for i, proc in running.items():
        out, err = proc.communicate(timeout=300)
        failures += _problems(lines[i], *beside[i], proc.returncode, out, err, bash)
    assert not failures, "\n\n".join(failures)


def _problems(run: str, cwd: Path, before: set[Path], code: int, out: str, err: str, bash) -> list[str]:
    """What the line ``run`` did that its comment does not say: an exit other than 0, a traceback, a plan or fit
    that does not fit, a fit whose build disagrees with the estimate, a layout search whose sweep does not run."""
    said = (out + err)[-3000:]
    if code != 0 or "Traceback" in err:
        return [f"{run}\n  exit {code}:\n{said}"]
    plans = [json.loads(p.read_text()) for p in sorted(set(cwd.rglob("plan.json")) - before)]
    if "hydra/sweeper=layout" in run:
        return _layout_search_problems(cwd, bash)
    problems = []
    if "stage=plan" in run or "stage=fit" in run:
        if not plans:
            problems.append(f"{run}\n  wrote no plan.json")
        elif any(p["fits"] is False for p in plans):  # None: no capacity to fit (a CPU's memory)
            problems.append(f"{run}\n  does not fit: " + ", ".join(
                f"{p['memory']['total']:.1f} of {p['memory']['capacity']} GiB" for p in plans if p["fits"] is False))
    if "stage=fit" in run and "agree exactly" not in out:
        problems.append(f"{run}\n  the fit did not say the estimate and the build agree:\n{said}")
    return problems


def _layout_search_problems(cwd: Path, bash) -> list[str]:
    """The layout search's ready-to-run sweep trains the top layouts: the search's stage=plan left out, its own
    arguments added; planned here for its first layout, as the search estimated it."""
    searches = sorted(cwd.glob("outputs/multirun/*/*/run_top.sh"))
    if not searches:
        return ["the layout search wrote no run_top.sh"]
    script = searches[-1]
    command = shlex.split(script.read_text().splitlines()[-1])
    problems = []
    if any(word.split("=")[0].lstrip("+") == "stage" for word in command) or command[-1] != "$@":
        problems.append(f"{script} does not run its layouts (a stage override, or no \"$@\"): {command}")
    ranked = json.loads((script.parent / "layouts.json").read_text())
    first = min((c for c in ranked["candidates"] if c["rank"]), key=lambda c: c["rank"])
    code, _, err = bash(f"bash {script} stage=plan experiment=layout_01 hydra.sweep.dir=planned/top", cwd)
    plans = list((cwd / "planned/top").glob("*/plan.json"))
    if code != 0 or len(plans) != 1:
        return [*problems, f"bash {script} stage=plan experiment=layout_01: exit {code}, {len(plans)} plans:"
                           f"\n{err[-2000:]}"]
    plan = json.loads(plans[0].read_text())
    if not plan["fits"] or abs(plan["memory"]["total"] - first["memory_gib"]) > 1e-3:
        problems.append(f"run_top.sh's first layout plans {plan['memory']['total']} GiB (fits: {plan['fits']}); "
                        f"the search said {first['memory_gib']} GiB")
    return problems
