"""The front door seen from a shell: `kv-cache --help` names every sub-command, and a closed pipe on stdout
(`kv-cache ... | head`) never stops a command: it runs to its end, writes its files, and ends quietly with
141 (128 + SIGPIPE) instead of a traceback."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kv_cache.cli import COMMANDS, main
from kv_cache.cli import stdout as cli_stdout
from kv_cache.cli.exits import after_output
from kv_cache.errors import ExitCode
from kv_cache.launcher import CLOSED_PIPE

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_lists_every_command(capsys, argv):
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert set(COMMANDS) == {"run", "sessions", "merge", "report", "compare", "audit", "catalogue"}
    for name in COMMANDS:
        assert f"{name} (" in text, name


def _with_closed_reader(args: list[str], close_stderr: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m kv_cache ARGS` with stdout on a pipe whose reader has already gone (like `| head`
    after it has read its lines): every write to stdout fails with EPIPE. `close_stderr`: stderr too."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, "-m", "kv_cache", *args], stdout=write_end,
                              stderr=write_end if close_stderr else subprocess.PIPE,
                              text=True, timeout=300, env=env, cwd=ROOT)
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


RUN = ["--model", "tiny-1b", "--num-users", "2", "--duration", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0.1",
       "--generation-mode", "none", "--seed", "7", "--log-level", "INFO"]


@pytest.mark.parametrize("close_stderr", [False, True])
def test_a_run_whose_stdout_is_closed_measures_its_window_and_writes_its_results(tmp_path, close_stderr):
    """`kv-cache ... | head -1`: the banner's write fails at once, and the run still measures its whole window
    (progress lines and logging on stderr go on), writes the whole document, removes its run files, and
    ends 141. A closed stderr as well stops nothing either."""
    cache, output = tmp_path / "cache", tmp_path / "p.json"
    done = _with_closed_reader([*RUN, "--cache-dir", str(cache), "--output", str(output)], close_stderr)
    assert done.returncode == CLOSED_PIPE, done.stderr
    if not close_stderr:
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
        assert "elapsed" in done.stderr  # the plain progress lines, unaffected
    doc = json.loads(output.read_text())
    assert doc["total_requests"] > 0
    assert doc["verdict"] != "INCOMPLETE" and doc["stop_reason"] != "interrupted"
    assert not cache.exists() or not any(cache.iterdir())  # the run's files (and its marker) are gone


def test_sessions_whose_stdout_is_closed_write_every_rung(tmp_path):
    """`kv-cache sessions ... | head -1`: every rung runs and the document holds them all, then 141."""
    cache, output = tmp_path / "cache", tmp_path / "s.json"
    done = _with_closed_reader(["sessions", "--model", "tiny-1b", "--ladder", "2,3", "--window", "1", "--warmup",
                                "0", "--tiers", "none,dram+storage", "--cpu-mem-gb", "0.1", "--cache-dir", str(cache),
                                "--output", str(output)])
    assert done.returncode == CLOSED_PIPE, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    doc = json.loads(output.read_text())
    assert not doc.get("interrupted")
    assert sorted((r["sessions"], r["tiers"]) for r in doc["rungs"]) == [
        (2, "dram+storage"), (2, "none"), (3, "dram+storage"), (3, "none")]
    assert not cache.exists() or not any(cache.iterdir())


def test_processes_whose_stdout_is_closed_write_the_ranks_and_the_merge(tmp_path):
    cache, output = tmp_path / "cache", tmp_path / "pp.json"
    done = _with_closed_reader([*RUN, "--processes", "2", "--cache-dir", str(cache), "--output", str(output)])
    assert done.returncode == CLOSED_PIPE, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    merged = json.loads(output.read_text())
    assert merged["total_requests"] > 0 and merged["verdict"] != "INCOMPLETE"
    assert all(json.loads((tmp_path / f"pp_rank{r}.json").read_text())["total_requests"] > 0 for r in (0, 1))
    assert not cache.exists() or not any(cache.iterdir())


def test_compare_json_and_report_plots_write_their_files_when_stdout_is_closed(tmp_path):
    done = _with_closed_reader(["compare", str(RENDER / "ext4_direct.json"), str(RENDER / "shm_buffered.json"),
                                "--json", str(tmp_path / "c.json"), "--plots", str(tmp_path / "cp")])
    assert done.returncode == CLOSED_PIPE, done.stderr
    assert json.loads((tmp_path / "c.json").read_text())
    assert (tmp_path / "cp" / "index.html").stat().st_size > 0
    done = _with_closed_reader(["report", str(RENDER / "ext4_direct.json"), "--plots", str(tmp_path / "rp")])
    assert done.returncode == CLOSED_PIPE, done.stderr
    assert (tmp_path / "rp" / "index.html").stat().st_size > 0


class _GonePipe(io.StringIO):
    """A stream whose reader has gone: every write and flush raises EPIPE; counts the attempts."""

    attempts = 0

    def write(self, text: str) -> int:
        self.attempts += 1
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self) -> None:
        raise OSError(errno.EPIPE, "Broken pipe")


def test_the_tolerant_stream_drops_output_after_epipe_and_says_so():
    gone = _GonePipe()
    stream = cli_stdout.TolerantStream(gone)
    assert stream.write("banner\n") == len("banner\n")
    stream.flush()
    stream.writelines(["a\n", "b\n"])
    assert stream.reader_gone and gone.attempts == 1  # one try, then dropped
    assert cli_stdout.StdStreams(stream, stream).stdout_closed


def test_the_tolerant_stream_drops_output_after_a_terminal_hung_up():
    """A terminal that hung up (an ssh session lost) fails every write with EIO: the reader is gone too."""
    class HungUp(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

    stream = cli_stdout.TolerantStream(HungUp())
    assert stream.write("report\n") == len("report\n")
    assert stream.reader_gone


def test_the_tolerant_stream_raises_errors_that_are_not_a_gone_reader():
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        cli_stdout.TolerantStream(Full()).write("x")


def test_tolerant_stdio_restores_the_streams_and_is_idempotent():
    before = sys.stdout, sys.stderr
    with cli_stdout.tolerant_stdio() as stdio:
        assert isinstance(sys.stdout, cli_stdout.TolerantStream) and sys.stdout is stdio.stdout
        assert cli_stdout.install().stdout is stdio.stdout  # no wrapper around a wrapper
        assert not stdio.stdout_closed
    assert (sys.stdout, sys.stderr) == before


@pytest.mark.parametrize(("code", "closed", "status"), [
    (ExitCode.OK, True, 141), (ExitCode.OK, False, 0), (ExitCode.FAIL, True, 1),
    (ExitCode.STORAGE_ERROR, True, 3), (ExitCode.RANKS_LOST, True, 4), (ExitCode.INTERRUPTED, True, 130),
])
def test_a_closed_stdout_turns_only_a_zero_status_into_141(code, closed, status):
    assert after_output(code, closed) == status
    assert cli_stdout.CLOSED_PIPE == CLOSED_PIPE == 141


def test_readme_lists_the_six_commands_and_no_refused_tracing():
    # the README's long text lives in docs/ now (issue 33): the pages that hold these sentences
    text = " ".join(" ".join((ROOT / "docs" / page).read_text() for page in
                             ("architecture.md", "results.md", "running.md")).split())
    assert "sub-commands (run = default, sessions, merge, report, compare, audit)" in text
    assert "The six sub-commands are `run` (the default), `sessions`, `merge`, `report`, `compare` and `audit`" in text
    assert "parsed but refused" not in text
    assert "| 141 | stdout was closed by its reader" in text
