"""The front door: no flag is ever taken for an abbreviation of another, and a typo gets a one-line
"did you mean" and exit status 2, before anything runs."""

import pytest

from kv_cache.cli import COMMANDS, build_main_parser, build_parser, did_you_mean, main


@pytest.mark.parametrize("argv,hint", [
    (["sessions", "--windo", "5"], "(did you mean one of --window, --window-plan?)"),  # a prefix of both
    (["--num-user", "5"], "(did you mean --num-users?)"),
    (["run", "--durat", "5"], "(did you mean --duration?)"),
    (["--request-rat=3"], "(did you mean --request-rate?)"),
])
def test_a_prefix_or_typo_is_refused_with_a_suggestion(argv, hint, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments" in err and err.rstrip().endswith(hint)
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_no_parser_accepts_abbreviations():
    top, parsers = build_main_parser()
    assert top.allow_abbrev is False
    assert all(p.allow_abbrev is False for p in parsers.values()) and set(parsers) == set(COMMANDS)
    assert all(build_parser(name).allow_abbrev is False for name in COMMANDS)


def test_a_flag_far_from_every_known_one_gets_no_guess():
    assert did_you_mean("unrecognized arguments: --zzzzzz", ["--window", "--warmup"]) == ""
    assert did_you_mean("argument --window: invalid float value: 'x'", ["--window"]) == ""
    assert did_you_mean("unrecognized arguments: 5 --windw", ["--window", "--warmup"]) == " (did you mean --window?)"


@pytest.mark.parametrize("argv,hint", [
    (["--dur", "5"], "(did you mean --duration?)"),
    (["--proc", "2"], "(did you mean --processes?)"),
    (["--num", "3"], "(did you mean one of --num-gpus, --num-users?)"),
])
def test_a_unique_prefix_is_refused_and_named(argv, hint, capsys, tmp_path, monkeypatch):
    """Short prefixes are too far from their flag for difflib; the flag they start is named instead, and the
    prefix itself is still refused (no abbreviations), before anything runs."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith(hint)
    assert list(tmp_path.iterdir()) == []


def test_a_prefix_of_many_flags_gets_no_prefix_guess():
    many = ["--io-mode", "--io-workers", "--io-chunk-mb", "--io-trace-log"]
    assert did_you_mean("unrecognized arguments: --io-", many) == ""
    assert did_you_mean("unrecognized arguments: --dur=5", ["--duration", "--dry"]) == " (did you mean --duration?)"
