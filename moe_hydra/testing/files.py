"""The file-system boundary, case by case: every path a command is given (a file, a run or sweep directory, an output
directory, an environment variable's directory) given as something it is not — nonexistent, a directory where a
file belongs, a file where a directory belongs, binary, Latin-1, truncated JSON, empty — and files that moe_hydra
writes for another command (``sweep.json``, ``results.json``, ``noise.json``) corrupt or missing a field.

The promise, per case: the command ends with one message (exit 1 or 2, never a traceback) that names the path it
could not use. ``tests/test_hardening_files.py`` runs every case on every commit; ``benchmarks/hardening_files.py``
runs them and prints the counts per command and per kind.

Unreadable and read-only paths are a permission, which root (CI's user) does not have taken from it: those kinds
run only as another user (:func:`permissions_apply`) and are counted as skipped otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from moe_hydra.commands import run_command

# What a bad path can be, as written by :func:`make`.
NONEXISTENT, DIRECTORY, FILE, BINARY, LATIN1, TRUNCATED, EMPTY, UNREADABLE = (
    "nonexistent", "a directory", "a file", "binary", "Latin-1", "truncated JSON", "empty", "unreadable")
FILE_KINDS = (NONEXISTENT, DIRECTORY, BINARY, LATIN1, TRUNCATED, EMPTY, UNREADABLE)  # where a file belongs
DIR_KINDS = (NONEXISTENT, FILE, EMPTY, UNREADABLE)  # where a directory of runs belongs
# inside a directory of runs: its results.json, or its sweep.json, given as each of these
INNER_KINDS = (DIRECTORY, BINARY, LATIN1, TRUNCATED, EMPTY)


def permissions_apply() -> bool:
    """Whether a mode of 000 keeps this process out (not as root)."""
    return os.geteuid() != 0


def make(path: Path, kind: str) -> Path:
    """Write ``path`` as ``kind``; ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == DIRECTORY:
        path.mkdir()
    elif kind == FILE:
        path.write_text("not a directory\n")
    elif kind == BINARY:
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == LATIN1:
        path.write_bytes("pretrain_gpt.py --num-layers 2 # caf\xe9 {\"a\": \"\xe9\"}\n".encode("latin-1"))
    elif kind == TRUNCATED:
        path.write_text('{"results_version": 3, "status": "complete", "step_times_ms": [1.0, 2.')
    elif kind == EMPTY:
        if path.suffix:
            path.write_text("")
        else:
            path.mkdir()
    elif kind == UNREADABLE:
        if path.suffix:
            path.write_text("{}")
        else:
            path.mkdir()
        path.chmod(0)
    elif kind != NONEXISTENT:
        raise ValueError(f"unknown kind {kind!r}")
    return path


@dataclass(frozen=True)
class Case:
    """One command given one bad path: ``argv(path, root)`` builds its command line from the bad ``path``."""

    command: str
    what: str  # which argument, as its users know it
    kind: str
    name: str  # the bad path's name under the case's root (a suffix: a file; none: a directory)
    argv: Callable[[Path, Path], list[str]]
    inner: str | None = None  # the bad path is this file inside a run directory (results.json, sweep.json)
    env: str | None = None  # the bad path is this environment variable's value

    @property
    def id(self) -> str:
        return f"{self.command} {self.what}: {self.kind}"


def _run_dir(root: Path) -> Path:
    """A run directory whose results.json the case then spoils."""
    d = root / "runs" / "0"
    d.mkdir(parents=True, exist_ok=True)
    return d


def cases() -> list[Case]:
    """Every command's every path argument, as each kind it can wrongly be."""
    out: list[Case] = []

    def file_arg(command: str, what: str, argv: Callable[[Path, Path], list[str]], name: str = "input.json",
                 kinds: tuple[str, ...] = FILE_KINDS) -> None:
        out.extend(Case(command, what, k, name, argv) for k in kinds)

    def dir_arg(command: str, what: str, argv: Callable[[Path, Path], list[str]]) -> None:
        out.extend(Case(command, what, k, "dir", argv) for k in DIR_KINDS)
        out.extend(Case(command, f"{what} (its results.json)", k, "results.json", argv, inner="results.json")
                   for k in INNER_KINDS)

    dir_arg("compare", "DIR", lambda p, root: [str(p), "--out", str(root / "out")])
    dir_arg("accept", "DIR", lambda p, root: [str(p)])
    dir_arg("steady", "DIR", lambda p, root: [str(p)])
    dir_arg("noise", "DIR", lambda p, root: [str(p), "--out", str(root / "out" / "noise.json")])
    dir_arg("diff", "RUN", lambda p, root: [str(p), str(p)])
    dir_arg("export", "DIR", lambda p, root: ["megatron-lm", str(p)])
    file_arg("regress", "BASELINE", lambda p, root: [str(p), str(_run_dir(root))], name="baseline.json")
    file_arg("compare", "--noise", lambda p, root: [str(_run_dir(root).parent), "--noise", str(p),
                                                     "--out", str(root / "out")], name="noise.json")
    file_arg("run", "hardware.calibration", lambda p, root: ["stage=plan", f"hardware.calibration={p}",
                                                             f"hydra.run.dir={root / 'run'}"], name="calibration.json")
    file_arg("ingest", "--file", lambda p, root: ["megatron-lm", "--file", str(p)], name="flags.txt")
    file_arg("data", "FILE", lambda p, root: ["prepare", "--out", str(root / "ds" / "text"), str(p)],
             name="corpus.txt", kinds=(NONEXISTENT, DIRECTORY, BINARY, LATIN1, EMPTY, UNREADABLE))
    for verb in ("status", "wait", "cancel"):
        out.extend(Case("sweep", f"{verb} DIR", k, "dir", lambda p, root, v=verb: [v, str(p)])
                   for k in DIR_KINDS)
        out.extend(Case("sweep", f"{verb} DIR (its sweep.json)", k, "sweep.json",
                        lambda p, root, v=verb: [v, str(p.parent)], inner="sweep.json")
                   for k in (*INNER_KINDS, "no overrides"))
    out.extend(Case("run", "MOE_HYDRA_SITE", k, "site", lambda p, root: ["stage=plan",
                                                                          f"hydra.run.dir={root / 'run'}"],
                    env="MOE_HYDRA_SITE") for k in (NONEXISTENT, FILE))
    out.extend(Case("run", "MOE_HYDRA_SITE (its site/default.yaml)", k, "site.yaml",
                    lambda p, root: ["stage=plan", f"hydra.run.dir={root / 'run'}"], env="MOE_HYDRA_SITE",
                    inner="site/default.yaml") for k in (BINARY, LATIN1, TRUNCATED))
    out.extend(Case("run", "hydra.run.dir", k, "dir", lambda p, root: ["stage=plan", f"hydra.run.dir={p}"])
               for k in (FILE, UNREADABLE))
    start = ["hardware.devices_per_node=1", "logger=none"]
    out.extend(Case("tune", "hydra.sweep.dir", k, "dir", lambda p, root: [*start, f"hydra.sweep.dir={p}"])
               for k in (FILE, UNREADABLE))
    out.extend(Case("tune", "hydra.sweep.dir (its tune.json)", k, "tune", lambda p, root: [
        *start, f"hydra.sweep.dir={p}"], inner="tune.json") for k in INNER_KINDS)
    sides = ["--good", "train.micro_batch_size=1", "--bad", "train.micro_batch_size=2"]
    out.extend(Case("bisect", "GOOD BAD", k, "dir", lambda p, root: [str(p), str(p)]) for k in DIR_KINDS)
    out.extend(Case("bisect", "GOOD BAD (its .hydra/overrides.yaml)", k, "run", lambda p, root: [str(p), str(p)],
                    inner=".hydra/overrides.yaml") for k in INNER_KINDS)
    out.extend(Case("bisect", "--out", k, "out", lambda p, root: [*sides, "--out", str(p), *start])
               for k in (FILE, UNREADABLE))
    out.extend(Case("bisect", "--out (its bisect.json)", k, "bi", lambda p, root: [*sides, "--out", str(p), *start],
                    inner="bisect.json") for k in INNER_KINDS)
    return out


def _spoil(case: Case, root: Path) -> tuple[Path, Path]:
    """(the path the command is given, the bad path in it) for ``case`` under ``root``."""
    if case.env and case.inner:  # a site directory whose site file is bad
        site = root / "site"
        make(site / "site" / "default.yaml", case.kind)
        return site, site / "site" / "default.yaml"
    if case.inner == "results.json":
        run = _run_dir(root)
        make(run / "results.json", case.kind)
        return run.parent if case.command in ("compare", "accept", "noise", "steady") else run, run / "results.json"
    if case.inner == "sweep.json":
        sweep = root / "sweep"
        if case.kind == "no overrides":
            sweep.mkdir(parents=True)
            (sweep / "sweep.json").write_text(json.dumps({"sweep_version": 2, "points": [{"num": 0, "dir": "x"}]}))
        else:
            make(sweep / "sweep.json", case.kind)
        return sweep / "sweep.json", sweep / "sweep.json"
    if case.inner:  # a file in the directory the command is given (a journal, a run's overrides)
        return root / case.name, make(root / case.name / case.inner, case.kind)
    bad = make(root / case.name, case.kind)
    return bad, bad


@dataclass
class Outcome:
    case: Case
    code: int
    said: str  # stderr and stdout
    broken: str | None  # the promise it broke, or None

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.said


def check(case: Case, root: Path) -> Outcome:
    """Run ``case`` under ``root`` (a fresh directory), in-process; what came of it."""
    given, bad = _spoil(case, root)
    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.get(case.env) if case.env else None
    cwd = os.getcwd()
    try:
        os.chdir(root)
        if case.env:
            os.environ[case.env] = str(given)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = run_command(case.command, case.argv(given, root))
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 2
            except Exception:  # noqa: BLE001 - what escaped: the figure counted
                import traceback

                traceback.print_exc()
                code = -1
    finally:
        os.chdir(cwd)
        if case.env:
            if saved is None:
                os.environ.pop(case.env, None)
            else:
                os.environ[case.env] = saved
        with contextlib.suppress(OSError):
            bad.chmod(0o755)
    said = err.getvalue() + out.getvalue()
    broken = None
    if code == -1 or "Traceback" in said:
        broken = "a traceback"
    elif code not in (1, 2):
        broken = f"exit {code}, not 1 or 2"
    elif not (str(bad) in said or str(given) in said or str(bad.parent) in said):
        broken = "the message names no path"
    return Outcome(case, code, said, broken)
