"""Output paths: checked before a run (exit 2, one line), written safely after it (kept, or a fallback)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from kv_cache.cli import main
from kv_cache.results import outputs
from kv_cache.results import write as write_mod
from kv_cache.results.outputs import OutputPathError, check_output_path, write_results


def test_a_missing_directory_is_created(tmp_path):
    path = tmp_path / "a" / "b" / "r.json"
    check_output_path(str(path))
    assert path.parent.is_dir() and not path.exists()
    assert [p.name for p in path.parent.iterdir()] == []  # the probe file is gone


@pytest.mark.parametrize("make, words", [
    (lambda tmp: str(tmp), "is a directory"),
    (lambda tmp: "/dev/null", "special file"),
    (lambda tmp: "/proc/version", "cannot write in /proc"),
    (lambda tmp: "", "is empty"),
])
def test_bad_paths_are_refused(tmp_path, make, words):
    with pytest.raises(OutputPathError, match=words):
        check_output_path(make(tmp_path))


def test_a_read_only_directory_is_refused(tmp_path, monkeypatch):
    def erofs(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(outputs.tempfile, "mkstemp", erofs)
    with pytest.raises(OutputPathError, match="Read-only file system"):
        check_output_path(str(tmp_path / "r.json"))


def test_an_existing_file_is_kept_with_a_suffix(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"old": 1}')
    (tmp_path / "r.json.1").write_text("older")
    w = write_results(str(path), {"new": 1})
    assert w.kept_as == str(tmp_path / "r.json.2") and w.error is None and w.path == str(path)
    assert json.loads((tmp_path / "r.json.2").read_text()) == {"old": 1}
    new = json.loads(path.read_text())
    assert new["new"] == 1 and "kept as" in new["measurement"]["notes"][0]


def _fail_writes_to(monkeypatch, target: str, fallback_dir: str, err: int) -> None:
    """write_json_atomic fails with `err` for `target` only (a read-only directory, a full disk); the
    fallback goes under `fallback_dir`."""
    real = write_mod.write_json_atomic

    def fail_first(path, data):
        if str(path) == target:
            raise OSError(err, os.strerror(err))
        return real(path, data)
    monkeypatch.setattr(write_mod, "write_json_atomic", fail_first)
    monkeypatch.setattr(write_mod.tempfile, "gettempdir", lambda: fallback_dir)


def test_a_failed_write_goes_to_a_named_fallback(tmp_path, monkeypatch):
    target = str(tmp_path / "r.json")
    _fail_writes_to(monkeypatch, target, str(tmp_path / "fb"), errno.EROFS)
    os.mkdir(tmp_path / "fb")
    w = write_results(target, {"x": 1})
    assert w.error and "Read-only" in w.error and w.path.startswith(str(tmp_path / "fb"))
    assert json.loads(open(w.path).read()) == {"x": 1}


@pytest.mark.parametrize("argv, words", [
    (["--output", "/proc/version"], "--output /proc/version: cannot write in /proc"),
    (["--xlsx-output", "/dev/null"], "--xlsx-output /dev/null is a special file"),
    (["--io-trace-log", "/"], "--io-trace-log / is a directory"),
    (["sessions", "--output", "/"], "--output / is a directory"),
])
def test_cli_refuses_before_running(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_report_is_printed_when_the_results_cannot_be_written(quick_settings, tmp_path, monkeypatch, caplog):
    import io

    from kv_cache.benchmarks.standard.outputs import write_outputs
    from kv_cache.results.run_document import interrupted_results

    settings = quick_settings("--output", str(tmp_path / "r.json"))
    _fail_writes_to(monkeypatch, settings.outputs.output, str(tmp_path), errno.EROFS)
    out = io.StringIO()
    write_outputs(settings, interrupted_results({}, settings), out)
    text = out.getvalue()
    assert "STORAGE PERFORMANCE ASSESSMENT: FAIL" in text
    fallback = text.rsplit("Results written to ", 1)[1].split("\n", 1)[0].strip()
    assert fallback.startswith(str(tmp_path / "kv-cache-fallback-")) and os.path.exists(fallback)
    assert "could not write the results" in caplog.text and fallback in caplog.text


def test_a_final_document_that_cannot_replace_the_periodic_one_says_so(quick_settings, tmp_path, monkeypatch,
                                                                       caplog):
    """The results file holds this run's periodic document (keep=False) and the final one cannot replace
    it (the directory went read-only, the disk filled): the periodic one stays, INCOMPLETE, saying it is
    there when "the rank ended without its final document". The final document, in the fallback, says that
    the file at --output is stale and superseded by it, and so does the log."""
    import io

    from kv_cache.benchmarks.standard.outputs import write_outputs
    from kv_cache.results.run_document import interrupted_results

    settings = quick_settings("--output", str(tmp_path / "r.json"))
    _fail_writes_to(monkeypatch, settings.outputs.output, str(tmp_path), errno.ENOSPC)
    out = io.StringIO()
    write_outputs(settings, interrupted_results({}, settings), out, keep=False)
    fallback = out.getvalue().rsplit("Results written to ", 1)[1].split("\n", 1)[0].strip()
    notes = json.loads(open(fallback).read())["measurement"]["notes"]
    [note] = [n for n in notes if "could not be replaced" in n]
    assert settings.outputs.output in note and "No space left on device" in note
    assert f"superseded by this final document at {fallback}" in note and note in caplog.text
    # with a file of someone else's there (keep=True: kept as .1 first), nothing of the kind is said
    out = io.StringIO()
    write_outputs(settings, interrupted_results({}, settings), out)
    fallback = out.getvalue().rsplit("Results written to ", 1)[1].split("\n", 1)[0].strip()
    assert not [n for n in json.loads(open(fallback).read())["measurement"]["notes"] if "could not be replaced" in n]
