"""The front door: a missing dependency is one line naming the package and its install command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kv_cache.launcher import missing_dependency_message

ROOT = Path(__file__).resolve().parent.parent

# Runs kv-cache.py with numpy hidden by an import hook, in isolated mode (-I: no PYTHONPATH, no user site).
HIDE_NUMPY = """
import runpy, sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("args", [["--help"], ["--duration", "1"]])
def test_missing_numpy_is_one_line(args):
    proc = subprocess.run([sys.executable, "-I", "-c", HIDE_NUMPY, str(ROOT / "kv-cache.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "'numpy' is not installed" in proc.stderr and "-m pip install numpy" in proc.stderr


def test_message_names_the_pip_package():
    exc = ModuleNotFoundError("No module named 'yaml'", name="yaml")
    msg = missing_dependency_message(exc)
    assert msg.startswith("kv-cache: error: the Python package 'pyyaml' is not installed")
    assert "pip install pyyaml" in msg


def test_our_own_broken_module_is_not_blamed_on_a_dependency(monkeypatch):
    from kv_cache import launcher

    def broken(argv=None):
        raise ModuleNotFoundError("No module named 'kv_cache.nothing'", name="kv_cache.nothing")
    import kv_cache.cli
    monkeypatch.setattr(kv_cache.cli, "main", broken)
    with pytest.raises(ModuleNotFoundError):
        launcher.main([])


def _without_numpy(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` run in a child whose import of numpy fails: a directory first on sys.path holds a numpy
    that raises as a missing one does (a sys.path dir, not an import hook: what a broken venv looks like)."""
    fake = tmp_path / "fake" / "numpy"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "fake"), "PYTHONNOUSERSITE": "1"}
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("args", [["--help"], ["--rank-output-base", "o", "--rank-cache-base", "c", "--seed-base", "1"]])
def test_the_mlperf_wrapper_without_numpy_gives_kv_cache_pys_one_line(tmp_path, args):
    wrapper = _without_numpy(tmp_path, "mlperf_wrapper.py", *args)
    plain = _without_numpy(tmp_path, "kv-cache.py", "--help")
    assert wrapper.returncode == 2 and plain.returncode == 2, wrapper.stderr
    assert wrapper.stderr.count("\n") == 1 and "Traceback" not in wrapper.stderr
    assert wrapper.stderr.startswith("mlperf_wrapper.py: error: the Python package 'numpy' is not installed")
    # the same hint, word for word, under each tool's name
    assert wrapper.stderr.removeprefix("mlperf_wrapper.py") == plain.stderr.removeprefix("kv-cache")
    assert not (tmp_path / "o").exists()  # nothing was created
