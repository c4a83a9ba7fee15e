"""Package layering: the import contracts of pyproject.toml hold, and kv_cache's subpackages form no cycle."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kv_cache"


def test_import_contracts_hold():
    pytest.importorskip("importlinter", reason="import-linter comes with the dev extra")
    # This checkout's package first on the path: an installed copy elsewhere must not be the one analysed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Absolute names an import statement inside ``module`` refers to (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level == 0:
            base = node.module or ""
        else:
            here = module.split(".") if is_package else module.split(".")[:-1]
            anchor = here[: len(here) - (node.level - 1)]
            base = ".".join(anchor + ([node.module] if node.module else []))
        # `from pkg import name` may name a submodule: count both, the subpackage is what matters here
        return [base] + [f"{base}.{a.name}" for a in node.names]
    return []


def _node(parts: list[str]) -> str:
    """The graph node of a module: kv_cache.<child>, or kv_cache.benchmarks.<name> for a benchmark plugin."""
    if len(parts) >= 3 and parts[1] == "benchmarks":
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def subpackage_graph() -> dict[str, set[str]]:
    """kv_cache.<child> (each benchmark its own) -> the other such nodes it imports (anywhere in it, function
    bodies too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        parts = module.split(".")
        if len(parts) < 2:
            continue  # the root package itself: it holds the version only
        src = _node(parts)
        deps = graph.setdefault(src, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, module, path.name == "__init__.py"):
                target = name.split(".")
                if len(target) >= 2 and target[0] == "kv_cache" and _node(target) != src:
                    dep = _node(target)
                    if (PACKAGE / target[1]).is_dir() or (PACKAGE / f"{target[1]}.py").is_file():
                        deps.add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_subpackages():
    graph = subpackage_graph()
    assert {"kv_cache.cli", "kv_cache.storage", "kv_cache.workload"} <= graph.keys()
    assert "kv_cache.storage" in graph["kv_cache.serving"]  # the scan sees real imports
    assert "kv_cache.core" in graph["kv_cache.benchmarks.sessions"]  # each benchmark is its own node
    found = cycles(graph)
    detail = {c: sorted(graph[c] & set(comp)) for comp in found for c in comp}
    assert found == [], detail


def test_the_two_benchmarks_do_not_import_each_other():
    graph = subpackage_graph()
    assert "kv_cache.benchmarks.sessions" not in graph["kv_cache.benchmarks.standard"]
    assert "kv_cache.benchmarks.standard" not in graph["kv_cache.benchmarks.sessions"]
