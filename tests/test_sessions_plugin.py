"""The sessions benchmark is a plugin like the standard run (issue 32): its settings tree is typed (no `Any`),
and none of its modules writes to a stream itself: every line it prints goes through kv_cache/render/ (the
import contract `sessions-prints-at-its-root` keeps render/ out of all but run.py)."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from kv_cache.settings.sessions import LadderSettings, SessionsSettings

SESSIONS = Path(__file__).resolve().parent.parent / "kv_cache" / "benchmarks" / "sessions"


def _writes(path: Path) -> list[str]:
    """`print(...)` and `<anything>.write(...)` calls in a module, as 'file:line'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "print") or (isinstance(f, ast.Attribute) and f.attr == "write"):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_of_the_sessions_benchmark_writes_a_line_itself():
    modules = sorted(SESSIONS.glob("*.py"))
    assert {"run.py", "ladder.py", "answer.py"} <= {m.name for m in modules}
    assert [w for m in modules for w in _writes(m)] == []


def test_the_check_finds_a_write(tmp_path):
    # adversarial: the walk above would see the calls it is there to forbid
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nprint('x')\nsys.stdout.write('y')\n")
    assert _writes(probe) == ["probe.py:2", "probe.py:3"]


def test_the_sessions_settings_tree_is_typed():
    for cls in (SessionsSettings, LadderSettings):
        hints = typing.get_type_hints(cls)
        untyped = [f.name for f in dataclasses.fields(cls) if hints[f.name] is typing.Any]
        assert untyped == [], cls.__name__
