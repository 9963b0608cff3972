"""The shape of the package: layers import one way, no module imports itself back, and the configs ship
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
