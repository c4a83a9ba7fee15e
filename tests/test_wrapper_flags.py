"""mlperf_wrapper.py's front door (issue 17, 'no flag abbreviations, and a did you mean for typos'): a
wrapper flag abbreviated or mistyped is named before anything else is said about it, and a refused
kv-cache flag leaves no rank directory behind."""

import pytest

from kv_cache.cli.wrapper import main


@pytest.mark.parametrize(("argv", "line"), [
    (["--opt", "1", "--seed", "1", "--base-output-dir", "R", "--cache-dir", "C"],
     "mlperf_wrapper.py: error: unrecognized arguments: --opt (did you mean --option?); flags are never abbreviated"),
    (["--optoin", "1", "--seed", "1", "--base-output-dir", "R", "--cache-dir", "C"],
     "mlperf_wrapper.py: error: unrecognized arguments: --optoin (did you mean --option?)"),
    (["--rank-output-base", "R", "--rank-cache-base", "C", "--seed-base", "1", "--num-user", "3"],
     "mlperf_wrapper.py: error: unrecognized arguments: --num-user (did you mean --num-users?)"),
    (["--rank-output-base", "R", "--rank-cache-bas", "C", "--seed-base", "1"],
     "mlperf_wrapper.py: error: unrecognized arguments: --rank-cache-bas (did you mean --rank-cache-base?); "
     "flags are never abbreviated"),
])
def test_abbreviations_and_typos_are_named_with_a_did_you_mean(argv, line, capsys):
    ran = []
    assert main(argv, env={}, runner=ran.append) == 2
    assert ran == [] and capsys.readouterr().err.strip() == line


def test_kv_cache_flags_pass_through_untouched(tmp_path):
    ran = []
    argv = ["--rank-output-base", str(tmp_path), "--rank-cache-base", str(tmp_path), "--seed-base", "1",
            "--num-users", "3", "--duration=5"]
    assert main(argv, env={}, runner=lambda plan: ran.append(plan) or 0) == 0
    assert "--num-users" in ran[0].argv and "--duration=5" in ran[0].argv


def test_a_refused_kv_cache_flag_creates_no_rank_directory(tmp_path, capsys):
    out = tmp_path / "RESULTS"
    argv = ["--rank-output-base", str(out), "--rank-cache-base", str(tmp_path / "cache"), "--seed-base", "1",
            "--num-users", "0"]
    assert main(argv, env={"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "mlperf_wrapper.py: error: --num-users must be positive, got 0"
    assert not out.exists()
