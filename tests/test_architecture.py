"""The shape of the package: layers import one way, no module imports itself back, every command lives in the
command package with one pattern, exit codes and the bad-input exception are defined once, and the configs ship
inside the package so a plain (non-editable) install plans from any directory."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "moe_hydra"

# A layer may import itself and the layers listed for it, nothing else (lazy imports inside functions count).
ALLOWED = {
    "core": {"core"},
    "planning": {"core", "planning"},
    "analysis": {"core", "analysis"},  # reads files; judges them with the core's statistics
    "job": {"core", "planning", "job"},
    "handoff": {"core", "handoff"},  # Megatron-LM / Bridge commands to and from the resolved plan
    "launch": {"core", "planning", "analysis", "job", "handoff", "launch"},  # launchers start the job
    "app": {"core", "planning", "analysis", "job", "handoff", "launch", "app"},
}
# Programs moe_hydra starts itself (their command lines are written by moe_hydra, not by users): not commands
PROGRAMS = {
    "moe_hydra.job.rank": "a local rank under a wrapper (nsys): the launcher writes its argv",
    "moe_hydra.job.fit": "one rank of stage=fit's builds: the fit writes its argv",
    "moe_hydra.job.warm_server": "the warm-start server the local launcher starts and talks to",
}
# Exceptions that are neither bad input nor a failure: each with why
OTHER_EXCEPTIONS = {
    "Stopped": "a signal stopped the job after it recorded its steps (exit 128 + n)",
    "JobStopped": "a signal stopped the local job (exit 128 + n)",
    "Unmapped": "export's note of a value with no flag, reported beside the command it prints",
    "_Budget": "ddmin's control flow: bisect.max_trials reached, the search returns the smallest failing set so far",
    "Queued": "a loop's control flow (tune, bisect): an experiment queued on Slurm (detached), the journal saved, exit 0",
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def layer(module: str) -> str:
    """core | planning | analysis | job | launch, or app for the top level (app, cli, the commands)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED.keys() - {"app"} else "app"


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The moe_hydra modules ``module`` imports, anywhere in its body."""
    f = MODULES[module]
    package = module if f.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(f.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            target = _resolve(name) if name.startswith("moe_hydra") else None
            if target and target != module and MODULES[target].name != "__init__.py":
                found.add(target)
    return found


def test_layers_import_one_way():
    wrong = [f"{m} ({layer(m)}) imports {t} ({layer(t)})" for m in sorted(MODULES) for t in sorted(imports(m))
             if layer(t) not in ALLOWED[layer(m)]]
    assert not wrong, "imports against the layers' direction:\n  " + "\n  ".join(wrong)


def test_no_import_cycle():
    graph = {m: imports(m) for m in MODULES}

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == goal:
                    return path + [nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [" -> ".join(c) for m in sorted(graph) if (c := reaches(m, m))]
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_the_layer_check_catches_a_wrong_import(tmp_path, monkeypatch):
    """The check itself: a core module importing planning is reported."""
    bad = tmp_path / "moe_hydra" / "core"
    bad.mkdir(parents=True)
    (bad / "x.py").write_text("def f():\n    from moe_hydra.planning import plan\n")
    monkeypatch.setitem(MODULES, "moe_hydra.core.x", bad / "x.py")
    assert imports("moe_hydra.core.x") == {"moe_hydra.planning.plan"}
    assert "planning" not in ALLOWED[layer("moe_hydra.core.x")]


def test_core_and_planning_import_no_torch_or_megatron():
    """Every module of the core and the planner imported, and neither torch nor megatron loaded."""
    names = sorted(m for m in MODULES if layer(m) in ("core", "planning"))
    code = ("import sys\n" + "".join(f"import {m}\n" for m in names)
            + "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.slow
def test_a_plain_install_plans_from_another_directory(tmp_path):
    """``pip install --target`` (not editable), then ``stage=plan`` from a directory that is not the checkout:
    the configs and the Hydra plugins come from the installed package."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    assert (site / "moe_hydra" / "conf" / "model" / "tiny_moe.yaml").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import moe_hydra, sys; print(moe_hydra.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    run = subprocess.run([sys.executable, "-m", "moe_hydra", "stage=plan", "model=qwen3_30b_a3b", "hardware=h100_sxm",
                          f"hydra.run.dir={tmp_path / 'plan'}"], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "plan" / "plan.json").is_file()


# ----------------------------------------------------------------------------- one command pattern


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text())


def _main_guard(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) for n in tree.body)


def command_problems(modules: dict[str, Path]) -> list[str]:
    """What breaks the command pattern: a command outside ``moe_hydra.commands`` (a ``__main__`` block or an
    argparse parser elsewhere, a top-level module that is not the two-line entry of a registered command), a
    registered command without its module, its ``EXITS`` or its entry."""
    from moe_hydra.commands import COMMANDS

    out = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text())
        parts = name.split(".")
        if parts[:2] == ["moe_hydra", "commands"] or name in PROGRAMS:
            continue
        if len(parts) == 2 and path.name not in ("__init__.py", "__main__.py"):  # a top-level module: an entry
            body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            entry = (len(body) == 2 and ast.unparse(body[0]) == "from moe_hydra.commands import entry"
                     and ast.unparse(body[1]) == f"if __name__ == '__main__':\n    entry({parts[1]!r})")
            if not entry:
                out.append(f"{name}: a top-level module is a command's entry (from moe_hydra.commands import entry; "
                           f"entry({parts[1]!r})) and nothing else; its logic belongs in moe_hydra.commands")
            elif parts[1] not in COMMANDS:
                out.append(f"{name}: the entry of {parts[1]!r}, which moe_hydra.commands.COMMANDS does not name")
            continue
        if len(parts) > 2 and _main_guard(tree):
            out.append(f"{name}: a __main__ block outside moe_hydra.commands (a command goes there; a program "
                       "moe_hydra starts itself is named in PROGRAMS)")
        if "ArgumentParser" in {getattr(n, "attr", getattr(n, "id", None)) for n in ast.walk(tree)}:
            out.append(f"{name}: an argument parser outside moe_hydra.commands")
    for command in COMMANDS:
        module = f"moe_hydra.commands.{command}"
        if module not in modules:
            out.append(f"{command}: registered in COMMANDS, no module {module}")
            continue
        names = {t.id for n in ast.parse(modules[module].read_text()).body for t in
                 (n.targets if isinstance(n, ast.Assign) else []) if isinstance(t, ast.Name)}
        names |= {n.name for n in ast.parse(modules[module].read_text()).body if isinstance(n, ast.FunctionDef)}
        if "EXITS" not in names or not ({"arguments", "run"} <= names or "main" in names):
            out.append(f"{module}: a command defines EXITS and arguments() + run() (or main() for the run command)")
        if command != "run" and f"moe_hydra.{command}" not in modules:
            out.append(f"{command}: no entry moe_hydra/{command}.py (python -m moe_hydra.{command})")
    return out


def definition_problems(modules: dict[str, Path]) -> list[str]:
    """A second definition of an exit code (a module-level ``EXIT_*`` name, or ``sys.exit``/``SystemExit`` of a
    number other than 0) or of the outcome exceptions (a class named Refused or Failed, or an exception class that
    derives from neither and is not in OTHER_EXCEPTIONS) outside ``moe_hydra.core.errors``."""
    out, classes = [], {}
    for name, path in sorted(modules.items()):
        if name == "moe_hydra.core.errors":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                for leaf in ast.walk(t):
                    if isinstance(leaf, ast.Name) and leaf.id.startswith("EXIT_"):
                        out.append(f"{name}: defines {leaf.id}; exit codes are defined once, in moe_hydra.core.errors")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "SystemExit", "exit") \
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value not in (0, None):
                out.append(f"{name}: {ast.unparse(node)}: an exit code written as a number (moe_hydra.core.errors)")
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (name, [ast.unparse(b).split(".")[-1] for b in node.bases])

    def derives(cls: str, seen: frozenset = frozenset()) -> str | None:
        """"outcome" (Refused / Failed), "exception" (another exception), or None (not an exception)."""
        if cls in ("Refused", "Failed"):
            return "outcome"
        if cls in seen or cls not in classes:
            return "exception" if cls.endswith(("Error", "Exception", "Exit", "Interrupt")) else None
        kinds = {derives(b, seen | {cls}) for b in classes[cls][1]}
        return "outcome" if "outcome" in kinds else "exception" if "exception" in kinds else None

    for cls, (module, _) in sorted(classes.items()):
        if cls in ("Refused", "Failed"):
            out.append(f"{module}: defines {cls} again; it is moe_hydra.core.errors.{cls}")
        elif derives(cls) == "exception" and cls not in OTHER_EXCEPTIONS:
            out.append(f"{module}: {cls} is an exception that is neither Refused (bad input) nor Failed "
                       "(moe_hydra.core.errors); derive it from one, or say in OTHER_EXCEPTIONS why it is neither")
    return out


def test_every_command_is_a_module_of_the_command_package():
    problems = command_problems(MODULES)
    assert not problems, "\n  ".join(problems)


def test_exit_codes_and_the_outcome_exceptions_are_defined_once():
    problems = definition_problems(MODULES)
    assert not problems, "\n  ".join(problems)


def test_the_pattern_checks_catch_a_command_outside_the_package_and_a_second_definition(tmp_path):
    """The checks themselves: a command written outside the package, an entry with logic, an exit code and a
    bad-input exception of a module's own are each reported."""
    def module(name: str, text: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        return path

    bad = {
        "moe_hydra.launch.tool": module("tool", "import argparse\nap = argparse.ArgumentParser()\n"
                                                "if __name__ == '__main__':\n    ap.parse_args()\n"),
        "moe_hydra.mine": module("mine", "from moe_hydra.commands import entry\nprint('work')\n"
                                         "if __name__ == '__main__':\n    entry('mine')\n"),
        "moe_hydra.analysis.odd": module("odd", "import sys\nEXIT_BAD = 2\nclass BadInput(ValueError):\n    pass\n"
                                                "class Refused(Exception):\n    pass\n"
                                                "def f():\n    sys.exit(2)\n"),
    }
    found = command_problems({**MODULES, **bad}) + definition_problems({**MODULES, **bad})
    text = "\n".join(found)
    assert "moe_hydra.launch.tool: a __main__ block outside moe_hydra.commands" in text
    assert "moe_hydra.launch.tool: an argument parser outside moe_hydra.commands" in text
    assert "moe_hydra.mine: a top-level module is a command's entry" in text
    assert "moe_hydra.analysis.odd: defines EXIT_BAD" in text
    assert "moe_hydra.analysis.odd: BadInput is an exception that is neither Refused" in text
    assert "moe_hydra.analysis.odd: defines Refused again" in text
    assert "moe_hydra.analysis.odd: sys.exit(2): an exit code written as a number" in text
    assert not command_problems(MODULES) and not definition_problems(MODULES)


def test_every_command_answers_help_with_its_exit_codes():
    """``moe-hydra <command> --help`` exits 0 and lists the command's exit codes; ``moe-hydra --help`` names every
    command (in-process: argparse's own help)."""
    import contextlib
    import io

    from moe_hydra.commands import COMMANDS, command, overview, run_command

    text = overview()
    for name in COMMANDS:
        assert f"\n  {name} " in text, name
        if name == "run":
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
            run_command(name, ["--help"])
        assert e.value.code == 0, name
        for code in command(name).EXITS:
            assert f"\n  {code}  " in out.getvalue(), (name, code)


@pytest.mark.parametrize("flag, target", [("--accept", "accept"), ("--diff", "diff"), ("--against", "regress")])
@pytest.mark.parametrize("prog", ["moe-hydra compare", "python -m moe_hydra.compare"])
def test_an_old_spelling_answers_as_the_command_it_became(flag, target, prog):
    """``compare --accept`` (--diff, --against) is the command accept (diff, regress): its help, usage and errors
    name that command, under the spelling the user typed it with."""
    import contextlib
    import io

    from moe_hydra.commands import command, run_command, user_text

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        run_command("compare", [flag, "--help"], prog=prog)
    new = prog[: -len("compare")] + target
    assert e.value.code == 0 and out.getvalue().startswith(f"usage: {new} "), out.getvalue()[:200]
    assert user_text(command(target).__doc__).strip().splitlines()[0] in out.getvalue()


def test_no_test_imports_a_benchmark_and_no_benchmark_a_test():
    """What both need lives in the package (moe_hydra.testing, moe_hydra.launch.compose, the analysis): a test that
    imports a benchmark (or loads one by its path), or a benchmark that imports a test or puts tests/ on the path,
    is reported. Running a benchmark as a program (its --help, in a subprocess) is not importing it."""
    def reaches(path: Path, other: str) -> list[str]:
        found = []
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if \
                isinstance(node, ast.ImportFrom) else []
            found += [n for n in names if n.split(".")[0] in ({other, "conftest"} if other == "tests" else {other})]
            if isinstance(node, (ast.Call, ast.Assign, ast.AugAssign)):
                code = ast.unparse(node)
                if code.startswith(("sys.path", "importlib.util.spec_from_file_location")) and other in code:
                    found.append(code)
        return found

    wrong = [f"{f.relative_to(ROOT)} reaches {what}" for f in sorted((ROOT / "tests").glob("*.py"))
             for what in reaches(f, "benchmarks")]
    wrong += [f"{f.relative_to(ROOT)} reaches {what}" for f in sorted((ROOT / "benchmarks").glob("*.py"))
              for what in reaches(f, "tests")]
    assert not wrong, "\n  ".join(wrong)
