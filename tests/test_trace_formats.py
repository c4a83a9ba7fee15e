"""Trace formats come from one registry: each reader's descriptor drives the CLI's choices, detection,
the session formats and the block sizes."""

from pathlib import Path

import pytest

from kv_cache.cli import build_parser
from kv_cache.workload.traces import BLOCK_TOKENS, FORMATS, detect_format, formats, open_trace
from kv_cache.workload.traces._common import Row


def _choices(parser, flag):
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return action


def test_the_built_in_descriptors():
    built_in = {"mooncake": 512, "aiperf": 512, "bailian": 16, "weka": 64, "burstgpt": None, "sharegpt": None}
    assert set(FORMATS) >= set(built_in)  # (a new format adds to them)
    assert {k: v for k, v in BLOCK_TOKENS.items() if k in built_in} == built_in
    assert set(formats.session_formats()) & set(built_in) == {"weka", "aiperf", "bailian", "sharegpt"}
    assert formats.get("weka").directory and not any(formats.get(f).directory for f in built_in if f != "weka")
    assert all(f.sniff and f.summary for f in formats.all_formats())


def test_the_cli_choices_and_help_are_the_registry():
    action = _choices(build_parser(), "--trace-format")
    assert tuple(action.choices) == ("auto", *formats.names())
    assert all(f.summary in action.help for f in formats.all_formats())


def _toy_read(path: Path, stats, opts):
    for i, line in enumerate(path.read_text().splitlines()[1:]):
        n = int(line)
        yield Row(None, 0, float(i), None, n, n, 1, None, None)


@pytest.fixture
def toy(monkeypatch):
    """A format added for one test: one descriptor in the registry, nothing else."""
    formats.all_formats()
    fmt = formats.TraceFormat(name="toy-test", summary="a toy file (#toy header)", read=_toy_read,
                              sniff=(formats.SniffRule(50, lambda h: h.first_line == "#toy-test"),))
    monkeypatch.setitem(formats._ENTRIES, fmt.name, fmt)
    return fmt


def test_a_registered_format_is_detected_read_and_offered_by_the_cli(toy, tmp_path):
    path = tmp_path / "t.toy"
    path.write_text("#toy-test\n100\n200\n")
    assert detect_format(path) == "toy-test"
    source = open_trace(path)
    assert source.format == "toy-test" and [r.input_tokens for r in source] == [100, 200]
    assert "toy-test" in _choices(build_parser(), "--trace-format").choices
    assert "a toy file (#toy header)" in formats.unknown_message()


def test_an_unknown_trace_names_every_registered_format(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    with pytest.raises(Exception, match="unknown trace format") as err:
        detect_format(path)
    assert all(f.summary in str(err.value) for f in formats.all_formats())


def test_a_named_format_that_is_not_registered_is_refused(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    with pytest.raises(Exception, match="unknown trace format 'nope'"):
        open_trace(path, "nope")
