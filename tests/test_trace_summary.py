"""The per-file trace summary counts the whole file's rows and skips, by kind, whatever pass the run was in
when it stopped, and what was replayed of it over the passes separately (JSON and console)."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

from kv_cache.render.console import trace_rows
from kv_cache.settings.pacing import ThinkTime
from kv_cache.settings.schema import BenchConfig
from kv_cache.workload.replay import OpenLoopTrace, TracePlanner, load_sessions
from kv_cache.workload.traces import open_trace


def _planner() -> TracePlanner:
    cfg = BenchConfig()
    return TracePlanner(0, True, cfg.qos_distribution, cfg.qos_profiles, seed=7)


def _console(*sources) -> str:
    return "\n".join(trace_rows({"trace_replay": {"stats": [s.summary() for s in sources]}}))


def _mooncake_2_good_8_bad(tmp_path: Path) -> Path:
    """The issue's file: 2 good rows, 8 malformed (4 bad JSON, 2 absurd, 2 bad values), 2 beyond a
    4,096-token window, in between."""
    good = [{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 10, "input_length": 100, "output_length": 5, "hash_ids": [4]}]
    lines = ([json.dumps(good[0])] + ["{bad"] * 4
             + [json.dumps({"timestamp": 1, "input_length": 5, "output_length": 1e30, "hash_ids": [1]})] * 2
             + [json.dumps({"timestamp": 2, "input_length": "x", "output_length": 1})] * 2
             + [json.dumps({"timestamp": 3, "input_length": 5000, "output_length": 1, "hash_ids": [2]})] * 2
             + [json.dumps(good[1])])
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_run_stopped_in_a_later_cycle_reports_the_whole_file(tmp_path):
    """Replayed for 5 rows (the 3rd pass unfinished, as a window ends): before, the summary was that pass's:
    "1 rows replayed, 0 skipped"."""
    src = open_trace(_mooncake_2_good_8_bad(tmp_path), max_context_tokens=4096)
    rows = OpenLoopTrace([src], _planner(), 0, 0)
    assert len(list(itertools.islice(iter(rows), 5))) == 5
    assert src.stats.rows == 1  # (the pass the run was in)
    st = src.summary()
    assert st["rows"] == 2 and st["complete"] is True
    assert st["skipped_malformed"] == 8 and st["skipped_other"] == 2
    assert st["skipped_reasons"] == {"absurd_value:output_length": 2, "bad_json": 4, "bad_value:input_length": 2,
                                     "beyond_context_window": 2}
    assert st["skipped_by_kind"] == {"malformed": 6, "absurd": 2, "beyond_context_window": 2,
                                     "beyond_max_conversations": 0, "failed_request": 0, "other": 0}
    assert st["replayed"] == {"rows_sent": 5, "passes": 3, "passes_complete": 2}
    assert (f"{src.path} (mooncake): 12 rows read (the whole file): 2 used, 10 skipped: malformed 6 (bad_json 4, "
            "bad_value:input_length 2); absurd 2 (absurd_value:output_length 2); beyond the context window 2; "
            "5 rows sent to the load generator over 3 passes (2 complete)") in _console(src)


def test_a_run_that_ends_in_its_first_pass_says_the_file_was_not_read_whole(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 10, "output_length": 1}) + "\n"
                         for t in range(20)) + "{bad\n")
    src = open_trace(p)
    list(itertools.islice(iter(OpenLoopTrace([src], _planner(), 1, 0)), 7))
    st = src.summary()
    assert (st["rows"], st["complete"], st["replayed"]) == (7, False, {"rows_sent": 7, "passes": 1,
                                                                       "passes_complete": 0})
    assert "7 rows read (not the whole file: the run stopped reading it there): 7 used, 0 skipped; 7 rows sent to the load generator " \
           "in 1 pass (not complete)" in _console(src)


def test_burstgpt_files_count_failed_and_malformed_rows_apart(tmp_path):
    """Two BurstGPT files, open loop over 2 cycles: each file's own rows and skips, each file's passes."""
    header = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
    a = [header, (0, "ChatGPT", 100, 20, 120, "c"), (1, "ChatGPT", 50, 0, 50, "c"),  # a failed request
         (2, "ChatGPT", "x", 5, 5, "c"), (3, "ChatGPT", 100, 2e9, 0, "c"), (4, "ChatGPT", 30, 3, 33, "c")]
    b = [header, (0, "GPT-4", 200, 30, 230, "API log"), (1, "GPT-4", 0, 5, 5, "API log")]  # zero input
    for name, data in (("a.csv", a), ("b.csv", b)):
        with open(tmp_path / name, "w", newline="") as fh:
            csv.writer(fh).writerows(data)
    srcs = [open_trace(tmp_path / n) for n in ("a.csv", "b.csv")]
    assert len(list(OpenLoopTrace(srcs, _planner(), 2, 0))) == 6
    sa, sb = (s.summary() for s in srcs)
    assert (sa["rows"], sa["skipped_by_kind"]["failed_request"], sa["skipped_by_kind"]["malformed"],
            sa["skipped_by_kind"]["absurd"]) == (2, 1, 1, 1)
    assert sa["replayed"] == {"rows_sent": 4, "passes": 2, "passes_complete": 2}
    assert (sb["rows"], sb["skipped_reasons"], sb["replayed"]) == (1, {"zero_input": 1},
                                                                   {"rows_sent": 2, "passes": 2, "passes_complete": 2})
    text = _console(*srcs)
    assert ("5 rows read (the whole file): 2 used, 3 skipped: malformed 1 (bad_value:Request tokens 1); absurd 1 "
            "(absurd_value:Response tokens 1); failed requests 1; 4 rows sent to the load generator over 2 passes (2 complete)") in text
    assert "2 rows read (the whole file): 1 used, 1 skipped: malformed 1 (zero_input 1)" in text


SHAREGPT = [{"id": "c1", "conversations": [{"from": "human", "value": "h" * 40}, {"from": "gpt", "value": "g" * 80},
                                          {"from": "human", "value": "h" * 40}, {"from": "gpt", "value": "g" * 80}]},
            {"no": "conversations"}, {"id": "c2", "conversations": [{"from": "gpt", "value": "only an answer"}]},
            {"id": "c3", "conversations": [{"from": "human", "value": "q" * 20}, {"from": "gpt", "value": "a" * 20}]},
            "not an object"]


def test_sharegpt_sessions_count_their_turns_and_passes(tmp_path, monkeypatch):
    """Closed-loop sessions: the file read once (its skips by reason), then its sessions replayed over
    passes: a pass is complete when every session of the file sent its last turn."""
    from kv_cache.workload.traces import tokenizer as tok_mod

    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: None)
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(SHAREGPT))
    src = open_trace(p)
    users = load_sessions([src], _planner(), ThinkTime(), 0.0, 7, 0)
    assert [len(u.turns) for u in users] == [2, 1]
    for _ in range(2):  # two whole passes, then one turn of the third
        for u in users:
            while u.has_next():
                u.next_request()
        for u in users:
            u.restart()
    users[0].next_request()
    st = src.summary()
    assert st["rows"] == 3 and st["complete"] is True and st["sessions"] == 2
    assert st["skipped_reasons"] == {"missing_field:conversations": 1, "no_turns": 1, "not_an_object": 1}
    assert st["skipped_by_kind"]["malformed"] == 3
    assert st["replayed"] == {"rows_sent": 7, "passes": 3, "passes_complete": 2}
    assert ("6 rows read (the whole file): 3 used, 3 skipped: malformed 3 (missing_field:conversations 1, no_turns 1, "
            "not_an_object 1); 7 rows sent to the load generator over 3 passes (2 complete)") in _console(src)


def test_sharegpt_stopped_at_its_conversation_limit_says_so(tmp_path, monkeypatch):
    from kv_cache.workload.traces import tokenizer as tok_mod

    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: None)
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(SHAREGPT))
    src = open_trace(p, max_conversations=1)
    load_sessions([src], _planner(), ThinkTime(), 0.0, 7, 0)
    st = src.summary()
    assert st["rows"] == 2 and st["stopped_at"] == "max_conversations"
    assert "(up to the max conversations limit: the rest of the file was not read)" in _console(src)


def test_sessions_of_two_files_are_counted_in_their_own_file(tmp_path):
    """Two AIPerf JSONL files of sessions: each session's turns are counted in the file it starts in."""
    def aiperf(name, sessions):
        p = tmp_path / name
        p.write_text("".join(json.dumps({"session_id": s, "input_length": 64, "output_length": 4, "timestamp": t})
                             + "\n" for t, s in enumerate(sessions)) + "[1]\n")
        return p
    srcs = [open_trace(aiperf("a.jsonl", ["s1", "s1", "s2"])), open_trace(aiperf("b.jsonl", ["s3"]))]
    users = load_sessions(srcs, _planner(), ThinkTime(), 0.0, 7, 0)
    for u in users:
        while u.has_next():
            u.next_request()
    a, b = (s.summary() for s in srcs)
    assert a["format"] == "aiperf" and a["skipped_reasons"] == {"not_an_object": 1}
    assert (a["replayed"], b["replayed"]) == ({"rows_sent": 3, "passes": 1, "passes_complete": 1},
                                              {"rows_sent": 1, "passes": 1, "passes_complete": 1})
