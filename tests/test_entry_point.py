"""The front door seen from a shell: `kv-cache --help` names every sub-command, and a closed pipe on stdout
(`kv-cache report X.json | head`) ends quietly with 141 (128 + SIGPIPE) instead of a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kv_cache.cli import COMMANDS, main
from kv_cache.launcher import CLOSED_PIPE

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_lists_all_five_commands(capsys, argv):
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert set(COMMANDS) == {"run", "sessions", "merge", "report", "compare"}
    for name in COMMANDS:
        assert f"{name} (" in text, name


def _with_closed_reader(args: list[str]) -> subprocess.CompletedProcess:
    """Run `python -m kv_cache ARGS` with stdout on a pipe whose reader has already gone (like `| head`
    after it has read its lines): every write to stdout fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, "-m", "kv_cache", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=env, cwd=ROOT)
    finally:
        os.close(write_end)


RENDER = FIXTURES / "render"


@pytest.mark.parametrize(("args", "code"), [
    (["report", str(FIXTURES / "results" / "kv-cache-results-1.json")], CLOSED_PIPE),
    (["compare", str(RENDER / "ext4_direct.json"), str(RENDER / "shm_buffered.json")], CLOSED_PIPE),
    (["merge", str(RENDER / "merged" / "m_rank0.json"), str(RENDER / "merged" / "m_rank1.json"),
      "--output", "{tmp}/m.json"], CLOSED_PIPE),
    # argparse's --help swallows its own write errors (OSError) and exits 0: quiet already
    (["--help"], 0),
    (["sessions", "--help"], 0),
])
def test_closed_pipe_ends_quietly(tmp_path, args, code):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = _with_closed_reader(args)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == code
    assert CLOSED_PIPE == 141


def test_merge_with_a_closed_pipe_still_writes_its_document(tmp_path):
    """The merged document is written before the table is printed: a closed stdout loses no result."""
    done = _with_closed_reader(["merge", str(RENDER / "merged" / "m_rank0.json"),
                                str(RENDER / "merged" / "m_rank1.json"), "--output", str(tmp_path / "m.json")])
    assert done.returncode == CLOSED_PIPE
    assert (tmp_path / "m.json").stat().st_size > 0



def test_readme_lists_the_five_commands_and_no_refused_tracing():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "sub-commands (run = default, sessions, merge, report, compare)" in text
    assert "The five sub-commands are `run` (the default), `sessions`, `merge`, `report` and `compare`" in text
    assert "parsed but refused" not in text
    assert "| 141 | stdout was closed by its reader" in text
