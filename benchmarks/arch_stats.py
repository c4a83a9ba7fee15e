"""The package's shape in figures: lines and modules per sub-package, the package-level import graph,
modules over 500 lines and functions over 80 lines.

    python3 benchmarks/arch_stats.py [ROOT]        # ROOT defaults to the repository's kv_cache/

Reads the source as text (ast), runs nothing of the package. Imports are counted at sub-package level
(`kv_cache.render.console` -> `render`, `kv_cache.benchmarks.standard.run` -> `benchmarks.standard`; a
top-level module such as `kv_cache/launcher.py` is its own node),
relative imports resolved against the importing module.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path


def _node(parts: tuple[str, ...], is_pkg_file: bool) -> str:
    """The graph node of a module path relative to the root package: first component, or `launcher` for
    launcher.py.
    Nested benchmark plugins (benchmarks/standard) are one level deeper, so they stay apart."""
    if not parts:
        return "(root)"
    head = parts[0].removesuffix(".py")
    if head == "benchmarks" and len(parts) >= 2:
        return f"benchmarks.{parts[1].removesuffix('.py')}"
    return head


def _module_parts(path: Path, root: Path) -> tuple[str, ...]:
    rel = path.relative_to(root)
    parts = list(rel.parts)
    if parts[-1] == "__init__.py":
        parts = parts[:-1]
    else:
        parts[-1] = parts[-1].removesuffix(".py")
    return tuple(parts)


def _imports(tree: ast.AST, mod: tuple[str, ...], is_pkg: bool, pkg: str) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == pkg:
                    out.add(tuple(a.name.split(".")[1:]))
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = list(mod if is_pkg else mod[:-1])
                base = base[: len(base) - (n.level - 1)]
                target = base + (n.module.split(".") if n.module else [])
            elif n.module and n.module.split(".")[0] == pkg:
                target = n.module.split(".")[1:]
            else:
                continue
            if target:
                out.add(tuple(target))
            else:
                out.update((a.name,) for a in n.names)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "kv_cache"
    pkg = root.name
    lines: dict[str, int] = defaultdict(int)
    modules: dict[str, int] = defaultdict(int)
    graph: dict[str, set[str]] = defaultdict(set)
    big_modules, big_functions = [], []
    total = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        n = text.count("\n")
        parts = _module_parts(path, root)
        is_pkg = path.name == "__init__.py"
        node = _node(parts, is_pkg)
        lines[node] += n
        modules[node] += 1
        total += n
        if n > 500:
            big_modules.append((n, str(path.relative_to(root))))
        tree = ast.parse(text)
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (f.end_lineno or f.lineno) - f.lineno + 1
                if length > 80:
                    big_functions.append((length, f"{path.relative_to(root)}:{f.name}"))
        for target in _imports(tree, parts, is_pkg, pkg):
            known = (root / target[0]).is_dir() or (root / f"{target[0]}.py").is_file()
            other = _node(target, False) if known else "(root)"
            if other != node:
                graph[node].add(other)
    print(f"{total} lines in {sum(modules.values())} modules under {root}")
    print("\nsub-package            modules   lines   imports")
    for node in sorted(lines):
        print(f"  {node:<22} {modules[node]:>5} {lines[node]:>7}   {', '.join(sorted(graph[node])) or '-'}")
    print("\nmodules over 500 lines:", ", ".join(f"{p} {n}" for n, p in sorted(big_modules, reverse=True)) or "none")
    print("functions over 80 lines:", ", ".join(f"{p} {n}" for n, p in sorted(big_functions, reverse=True)) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
