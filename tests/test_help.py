"""The help pages are written for users: ``moe-hydra --help`` (and ``python -m moe_hydra --help``) lists every command
from the one list (``moe_hydra.commands.COMMANDS``), and every command's ``--help`` says what it does, shows an
example and its exit codes, with no reST roles and no internals."""

from __future__ import annotations

import contextlib
import io
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import moe_hydra.commands
from moe_hydra.commands import COMMANDS, cli, command, overview, run_command, summary

ROOT = Path(__file__).resolve().parent.parent
ROLE = re.compile(r":(mod|func|class|meth|data|attr|obj|exc|ref|doc):`")
# What a user has no use for in a help page: the machinery's own names
INTERNALS = ("submitit", "pickle", "moe_hydra.launch", "moe_hydra.analysis", "moe_hydra.core", "moe_hydra.job",
             "moe_hydra.handoff", "moe_hydra.planning", "JobReturn", "_screening")


def command_modules() -> set[str]:
    """The commands as modules of the package: every module of moe_hydra/commands/ not named _*."""
    return {m.name for m in pkgutil.iter_modules(moe_hydra.commands.__path__) if not m.name.startswith("_")}


def help_of(name: str) -> str:
    """``moe-hydra NAME --help`` in this process (the run command's is Hydra's, from conf/config.yaml)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = run_command(name, ["--help"])
        except SystemExit as e:
            code = e.code
    assert code in (0, None), (name, code, out.getvalue()[-2000:])
    return out.getvalue()


def test_every_command_module_is_in_the_one_list():
    """A module added to moe_hydra/commands/ is a command only once COMMANDS names it (what --help lists)."""
    assert command_modules() == set(COMMANDS), (
        f"moe_hydra/commands/ holds {sorted(command_modules() - set(COMMANDS))} that COMMANDS does not name, "
        f"and COMMANDS names {sorted(set(COMMANDS) - command_modules())} that it does not hold")
    assert len(set(COMMANDS)) == len(COMMANDS)


def test_the_overview_lists_every_command_once_with_its_summary():
    lines = overview().splitlines()
    for name in COMMANDS:
        rows = [line for line in lines if line.split()[:1] == [name]]
        assert rows == [f"  {name:<{max(map(len, COMMANDS))}}  {summary(command(name))}"], (name, rows)
        assert not ROLE.search(rows[0]) and "``" not in rows[0], rows[0]


@pytest.mark.parametrize("argv0", ["moe-hydra", "python -m moe_hydra"])
def test_help_of_both_entry_points_lists_every_command_then_the_run_command(argv0, monkeypatch, capsys):
    """``moe-hydra --help`` and ``python -m moe_hydra --help`` are the one function (pyproject's script and
    moe_hydra/__main__.py): the commands, then the run command's groups and keys."""
    monkeypatch.setattr(sys, "argv", [argv0, "--help"])
    with pytest.raises(SystemExit) as e:
        cli()
    text = capsys.readouterr().out
    assert e.value.code == 0
    assert text.startswith(overview())
    assert "== Configuration groups ==" in text and "== Exit codes ==" in text


def test_the_console_script_prints_the_same_help():
    """The installed ``moe-hydra`` (pyproject's [project.scripts]) answers --help with the list of commands."""
    script = Path(sys.executable).parent / "moe-hydra"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (the package is not installed in this environment)")
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in COMMANDS:
        assert f"\n  {name} " in r.stdout, name


@pytest.mark.parametrize("name", COMMANDS)
def test_every_commands_help_is_written_for_users(name):
    text = help_of(name)
    low = text.lower()
    assert "examples:" in low, f"moe-hydra {name} --help shows no example (an 'examples:' block in its docstring)"
    examples = text[low.index("examples:"):]
    assert (f"moe-hydra {name} " if name != "run" else "python -m moe_hydra ") in examples, (
        f"moe-hydra {name} --help: its examples show no command line of it")
    assert "exit codes" in low, f"moe-hydra {name} --help lists no exit codes"
    assert not ROLE.search(text), f"moe-hydra {name} --help shows a reST role: {ROLE.search(text).group()}"
    assert "``" not in text, f"moe-hydra {name} --help shows reST literal marks"
    found = [word for word in INTERNALS if word in text]
    assert not found, f"moe-hydra {name} --help names internals: {found}"


def test_the_readme_names_every_command():
    """The README's sentence that lists the commands names each of them (it is read where --help is not)."""
    readme = (ROOT / "README.md").read_text()
    sentence = readme[readme.index("`moe-hydra --help`"):].split(";")[0]
    missing = [name for name in COMMANDS if not re.search(rf"\b{name}\b", sentence)]
    assert not missing, f"README.md's list of commands lacks {missing}"
