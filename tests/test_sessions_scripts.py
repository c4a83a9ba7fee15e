"""Session scripts (kv_cache.workload.sessions): generator, trace adapter, pace transform, turn classes."""

import dataclasses
import json
import math
import shutil
from collections import Counter

import numpy as np
import pytest

from kv_cache.settings.schema import SessionsConfig, load_config
from kv_cache.workload.sessions import (
    Pace,
    SessionScript,
    Turn,
    apply_pace,
    classify_turn,
    generate_session,
    generate_sessions,
    lognormal_params,
    parse_pace,
    sessions_from_trace,
)
from kv_cache.workload.traces import TraceRequest, open_trace

CFG = SessionsConfig()


def take(n, seed=42, cfg=CFG, start=0):
    it = generate_sessions(cfg, seed, start)
    return [next(it) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Script model
# ---------------------------------------------------------------------------------------------


def test_contexts_append_only_and_with_a_rewrite():
    s = SessionScript(
        "x",
        (
            Turn(100, 10, None, None),
            Turn(20, 5, 3.0, "agentic"),
            Turn(50, 7, 40.0, "human", kept_tokens=60),  # history rewritten: only 60 tokens reused
            Turn(1, 1, 2.0, None),
        ),
        block_tokens=16,
        shared_prefix_tokens=30,
    )
    # turn 1: 30 shared + 100; turn 2: 140 + 20; turn 3: 60 kept + 50; turn 4: 117 + 1
    assert s.contexts() == [(30, 130), (140, 160), (60, 110), (117, 118)]
    assert s.input_tokens(2) == 110
    assert s.max_context_tokens == 165


def test_config_defaults():
    c = load_config(None).sessions
    assert c == CFG
    assert (c.block_tokens, c.new_tokens_mean, c.new_tokens_median, c.shared_prefix_tokens) == (
        512,
        6000,
        4000,
        4000,
    )
    assert (c.human_pause_probability, c.agentic_pause_mean_s, c.human_pause_mean_s) == (0.3, 5, 30)
    assert (c.agentic_pause_median_s, c.human_pause_median_s) == (2, 15)  # AIPerf's manifest, lognormal
    assert (c.max_context_tokens, c.turns_mean, c.human_threshold_s) == (200000, 20, 15)


def test_lognormal_params():
    mu, sigma = lognormal_params(6000, 4000)
    assert mu == pytest.approx(math.log(4000)) and sigma == pytest.approx(math.sqrt(2 * math.log(1.5)))
    assert sigma == pytest.approx(0.900516, abs=1e-6)
    assert lognormal_params(5, 5) == (math.log(5), 0.0)
    with pytest.raises(ValueError):
        lognormal_params(3, 4)


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------


def test_generator_is_deterministic_per_seed_and_index():
    a = take(50)
    assert a == take(50)
    assert a != take(50, seed=43)
    # session i depends only on (seed, i): not on how many were drawn before it
    assert take(5, start=30) == a[30:35]
    assert generate_session(CFG, 42, 17) == a[17]
    assert [s.session_id for s in a[:3]] == ["session-000000", "session-000001", "session-000002"]
    assert len({s.session_id for s in a}) == 50


def test_generator_structure():
    for s in take(200):
        assert s.block_tokens == 512 and s.shared_prefix_tokens == 4000
        first, *rest = s.turns
        assert first.pause_before_s is None and first.pause_kind is None
        assert classify_turn(first, 15) == "start"
        for t in rest:
            assert t.pause_kind in ("human", "agentic") and t.pause_before_s >= 0 and t.kept_tokens is None
        assert all(t.new_tokens >= 1 and t.output_tokens >= 1 for t in s.turns)
        assert all(isinstance(t.new_tokens, int) and isinstance(t.output_tokens, int) for t in s.turns)


def test_generator_distributions_on_2000_sessions():
    sessions = take(2000, seed=1)
    later = np.array([t.new_tokens for s in sessions for t in s.turns[1:]])
    first = np.array([s.turns[0].new_tokens for s in sessions])
    out = np.array([t.output_tokens for s in sessions for t in s.turns])
    human = np.array([t.pause_before_s for s in sessions for t in s.turns[1:] if t.pause_kind == "human"])
    agentic = np.array([t.pause_before_s for s in sessions for t in s.turns[1:] if t.pause_kind == "agentic"])
    assert len(later) > 20000
    assert abs(np.median(later) - 4000) <= 400
    assert abs(later.mean() - 6000) <= 600
    assert abs(first.mean() + 4000 - 12000) <= 1200  # shared prefix + first prompt
    assert abs(np.median(out) - 600) <= 60
    assert abs(out.mean() - 1000) <= 100
    assert abs(human.mean() - 30) <= 3
    assert abs(agentic.mean() - 5) <= 0.5
    assert abs(np.median(human) - 15) <= 1.5 and abs(np.median(agentic) - 2) <= 0.2  # lognormal (AIPerf)
    assert abs(len(human) / (len(human) + len(agentic)) - 0.3) <= 0.02


def test_context_never_exceeds_the_limit():
    for cfg in (CFG, dataclasses.replace(CFG, max_context_tokens=30000, turns_mean=50.0)):
        sessions = take(500, cfg=cfg)
        assert max(s.max_context_tokens for s in sessions) <= cfg.max_context_tokens
        for s in sessions:
            assert s.contexts()[0][0] == cfg.shared_prefix_tokens
    # a tiny limit still gives a first turn that fits
    tiny = dataclasses.replace(
        CFG, shared_prefix_tokens=10, first_turn_tokens_mean=5000.0, max_context_tokens=12
    )
    s = generate_session(tiny, 0, 0)
    assert len(s.turns) == 1 and s.max_context_tokens <= 12
    with pytest.raises(ValueError, match="max_context_tokens"):
        generate_session(dataclasses.replace(CFG, shared_prefix_tokens=11, max_context_tokens=12), 0, 0)
    with pytest.raises(ValueError):
        generate_session(CFG, 0, -1)


def test_turns_mean_one_gives_single_turn_sessions():
    assert all(len(s.turns) == 1 for s in take(50, cfg=dataclasses.replace(CFG, turns_mean=1.0)))


# ---------------------------------------------------------------------------------------------
# Pace and classes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pace"),
    [
        ("trace", Pace("trace")),
        (" Human:30:60 ", Pace("human", 30.0, 60.0)),
        ("agentic:0:2.5", Pace("agentic", 0.0, 2.5)),
        ("fixed:40", Pace("fixed", 40.0, 40.0)),
        ("human:5:5", Pace("human", 5.0, 5.0)),
    ],
)
def test_parse_pace(text, pace):
    assert parse_pace(text) == pace
    assert parse_pace(str(pace)) == pace


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected 'trace', 'human:MIN:MAX'"),
        ("slow", "expected 'trace'"),
        ("human:30", "expected 'trace'"),
        ("human:a:b", "expected 'trace'"),
        ("fixed:1:2", "expected 'trace'"),
        ("trace:1", "expected 'trace'"),
        ("human:60:30", "MIN (60) must be <= MAX (30)"),
        ("human:-1:3", "finite and >= 0"),
        ("fixed:inf", "finite and >= 0"),
        (None, "expected 'trace'"),
    ],
)
def test_parse_pace_errors(text, message):
    with pytest.raises(ValueError) as info:
        parse_pace(text)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_apply_human_pace_replaces_every_pause():
    pace = parse_pace("human:30:60")
    for s in take(100):
        paced = apply_pace(s, pace, seed=42)
        assert paced.turns[0] == s.turns[0]
        assert [(t.new_tokens, t.output_tokens) for t in paced.turns] == [
            (t.new_tokens, t.output_tokens) for t in s.turns
        ]
        for t in paced.turns[1:]:
            assert 30 <= t.pause_before_s <= 60 and t.pause_kind == "human"
            assert classify_turn(t, 15) == "return"
        assert paced == apply_pace(s, pace, seed=42)
    s = take(1)[0]
    assert apply_pace(s, pace, 1) != apply_pace(s, pace, 2)
    other = dataclasses.replace(s, session_id="other")
    assert [t.pause_before_s for t in apply_pace(other, pace, 42).turns] != [
        t.pause_before_s for t in apply_pace(s, pace, 42).turns
    ]


def test_apply_other_paces():
    s = next(s for s in take(50) if len(s.turns) > 3)
    assert apply_pace(s, parse_pace("trace"), 1) is s
    fixed = apply_pace(s, parse_pace("fixed:20"), 1)
    assert all(t.pause_before_s == 20 and t.pause_kind is None for t in fixed.turns[1:])
    assert all(classify_turn(t, 15) == "return" for t in fixed.turns[1:])
    agentic = apply_pace(s, parse_pace("agentic:1:2"), 1)
    assert all(1 <= t.pause_before_s <= 2 and t.pause_kind == "agentic" for t in agentic.turns[1:])
    flat = apply_pace(s, parse_pace("human:45:45"), 1)
    assert all(t.pause_before_s == 45 for t in flat.turns[1:])


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        (Turn(10, 1, None, None), "start"),
        (Turn(10, 1, 1.0, "human"), "return"),
        (Turn(10, 1, 100.0, "agentic"), "agentic"),
        (Turn(10, 1, 15.0, None), "return"),
        (Turn(10, 1, 14.9, None), "agentic"),
        (Turn(10, 1, 0.0, None), "agentic"),
    ],
)
def test_classify_turn(turn, expected):
    assert classify_turn(turn, 15.0) == expected


# ---------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------


def req(index, ids, inp, out, session=None, think=None, arrival=None, new=None, kind="request", block=4):
    return TraceRequest(
        index, session, 1, arrival, think, inp, inp if new is None else new, out, ids, block, kind
    )


def test_sessionless_grouping_rule():
    # block 4 tokens; a row's complete blocks = its first input // 4 ids
    rows = [
        req(0, (0, 1, 2), 12, 2, arrival=0.0),  # session A
        req(1, (0, 5, 6), 12, 1, arrival=1.0),  # shares only block 0 (< 2 blocks) -> session B
        req(2, (0, 1, 2, 3, 4), 20, 3, arrival=5.0),  # A's complete blocks (0, 1, 2) are a prefix -> A
        req(3, (0, 1, 2, 3, 9, 9), 22, 1, arrival=9.0),  # A's latest (0, 1, 2, 3, 4) is not a prefix -> C
        req(4, (0, 1, 2, 3, 4, 7, 10), 26, 1, arrival=10.5),  # continues A: 26 >= 20 + 3, all kept
        req(5, (0, 5, 6, 8), 13, 1, arrival=11.0),  # continues B: 13 = 12 + 1, no new token
        req(6, (0, 1, 2, 3, 4, 7, 8), 20, 1, arrival=12.0),  # continues A, shorter than 26 + 1: rewritten
    ]
    scripts = sessions_from_trace(rows)
    assert [s.session_id for s in scripts] == ["trace-0", "trace-1", "trace-3"]
    a, b, c = scripts
    assert [len(s.turns) for s in scripts] == [4, 2, 1]
    assert all(s.shared_prefix_tokens == 4 and s.block_tokens == 4 for s in scripts)  # block 0 shared by all
    assert [inp for _, inp in a.contexts()] == [12, 20, 26, 20]  # the rows' inputs, exactly
    assert [inp for _, inp in b.contexts()] == [12, 13]
    assert c.contexts() == [(4, 22)]
    assert a.turns[0] == Turn(8, 2, None, None)  # 12 - 4 shared
    assert a.turns[1] == Turn(6, 3, 5.0, None)  # 20 - (12 + 2); pause = arrival gap, kind unknown
    assert a.turns[2] == Turn(3, 1, 5.5, None)
    # rewritten: kept = the 6 matched blocks (24 tokens) capped at the input, less the 1 token recomputed
    assert a.turns[3] == Turn(1, 1, 1.5, None, kept_tokens=19)
    assert b.turns[1] == Turn(1, 1, 10.0, None, kept_tokens=12)  # no new token -> 1, taken from the prefix


def test_sessions_with_ids_from_rows():
    rows = [
        req(0, None, 100, 10, session="s", new=100, think=3.0, kind="agentic"),
        req(1, None, 300, 0, session="t", new=300, think=None),
        req(2, None, 130, 5, session="s", new=20, think=50.0, kind="human"),
        req(3, None, 80, 5, session="s", new=80, think=None),  # rewritten history: nothing kept
        req(4, None, 310, 5, session="t", new=10, think=None, arrival=None),
    ]
    s, t = sessions_from_trace(rows)
    assert s.shared_prefix_tokens == 0  # no hash ids: nothing known to be shared
    assert s.turns == (
        Turn(100, 10, None, None),
        Turn(20, 5, 3.0, "agentic"),
        Turn(80, 5, 50.0, "human", kept_tokens=0),
    )
    assert [classify_turn(x, 15) for x in s.turns] == ["start", "agentic", "return"]
    assert t.turns == (Turn(300, 1, None, None), Turn(10, 5, 0.0, None, kept_tokens=300))  # output 0 -> 1
    assert sessions_from_trace(rows, max_sessions=1) == [s]


def test_aiperf_trace(tmp_path):
    lines = [
        {"session_id": "a", "input_length": 1100, "output_length": 50, "hash_ids": [1, 2, 3], "timestamp": 0},
        {
            "session_id": "b",
            "input_length": 1100,
            "output_length": 60,
            "hash_ids": [1, 2, 4],
            "timestamp": 10,
        },
        {"session_id": "a", "input_length": 200, "output_length": 70, "hash_ids": [9], "delay": 20000},
        {"session_id": "b", "input_length": 300, "output_length": 80, "hash_ids": [8], "delay": 5000},
    ]
    path = tmp_path / "agentic.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    a, b = sessions_from_trace(open_trace(path, "aiperf"))
    assert (a.session_id, b.session_id) == ("a", "b")
    assert a.block_tokens == 512 and a.shared_prefix_tokens == 1024  # the 2 complete blocks [1, 2] shared
    assert a.turns == (Turn(76, 50, None, None), Turn(200, 70, 20.0, None))
    assert b.turns == (Turn(76, 60, None, None), Turn(300, 80, 5.0, None))
    assert [inp for _, inp in a.contexts()] == [1100, 1350]
    assert [classify_turn(t, 15) for t in a.turns + b.turns] == ["start", "return", "start", "agentic"]


def test_agentic_coding_traces(traces_dir, tmp_path):
    # the two real conversations, plus one with a sub-agent (they have none) to see child sessions kept
    for f in sorted((traces_dir / "agentic-coding").glob("*.json")):
        shutil.copy(f, tmp_path)
    req = {"type": "n", "model": "m", "out": 5, "input_types": ["tool_result"], "api_time": 1.0}
    sub = {"type": "subagent", "agent_id": "agent_001", "t": 40.0, "duration_ms": 20_000, "requests": [
        {**req, "t": 0.0, "in": 200, "hash_ids": [50, 51, 52], "think_time": 0.0},
        {**req, "t": 5.0, "in": 300, "hash_ids": [50, 51, 52, 53], "think_time": 3.0}]}
    conv = {"id": "z_sub", "block_size": 64, "hash_id_scope": "local", "requests": [
        {**req, "t": 0.0, "in": 130, "hash_ids": [1, 2], "think_time": 0.0, "input_types": ["text"]}, sub,
        {**req, "t": 45.0, "in": 400, "hash_ids": [1, 2, 3, 4, 5, 6], "think_time": 4.0}]}
    (tmp_path / "z_sub.json").write_text(json.dumps(conv))
    source = open_trace(tmp_path)
    rows = list(source)
    scripts = sessions_from_trace(source)
    by_session = {}
    for r in rows:
        by_session.setdefault(r.session_id, []).append(r)
    assert len(scripts) == len(by_session) == source.stats.sessions
    assert sum(len(s.turns) for s in scripts) == len(rows)
    sub = [s for s in scripts if "/" in s.session_id]
    assert [s.session_id for s in sub] == ["z_sub/agent_001"] and source.stats.subagents == 1  # kept
    for s in scripts:
        mine = by_session[s.session_id]
        assert s.block_tokens == 64 and s.shared_prefix_tokens == 0  # hash ids are per conversation
        assert [inp for _, inp in s.contexts()] == [r.input_tokens for r in mine]  # inputs reproduced exactly
        for prev, r, t in zip(mine, mine[1:], s.turns[1:], strict=False):
            if prev.think_time_s is not None:
                assert t.pause_before_s == prev.think_time_s
            else:  # not recorded: the arrival gap
                assert t.pause_before_s == max(0.0, r.arrival_s - prev.arrival_s)
            expected = {"human": "human", "agentic": "agentic", "subagent": "agentic"}.get(prev.kind)
            assert t.pause_kind == expected
            assert t.output_tokens == max(1, r.output_tokens)
    classes = Counter(classify_turn(t, 15) for s in scripts for t in s.turns)
    assert classes["start"] == len(scripts)
    assert classes["return"] == sum(1 for r in rows if r.kind == "human")
    five = sessions_from_trace(source, max_sessions=5)
    assert five == scripts[:5]


def mooncake_sessions(raw: list[dict], block: int = 512) -> dict[str, list[int]]:
    """The grouping rule of sessions_from_trace, by brute force over the raw rows: a row continues the
    session whose latest row's complete blocks (>= 2 of them) are the longest prefix of its hash ids
    (ties: the later session), else starts session "mooncake-<row>". Returns each session's inputs."""
    latest: dict[str, tuple] = {}
    inputs: dict[str, list[int]] = {}
    for i, x in enumerate(raw):
        ids = tuple(x["hash_ids"])
        best, best_len = None, 0
        for name, prefix in latest.items():
            if len(prefix) >= 2 and ids[: len(prefix)] == prefix and len(prefix) >= best_len:
                best, best_len = name, len(prefix)
        name = best or f"mooncake-{i}"
        latest[name] = ids[: x["input_length"] // block]
        inputs.setdefault(name, []).append(x["input_length"])
    return inputs


def test_mooncake_conversation_trace_first_200_rows(traces_dir):
    path = traces_dir / "mooncake" / "conversation_trace_300.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()[:200]]
    source = open_trace(path, max_rows=200)
    scripts = sessions_from_trace(source)
    assert sum(len(s.turns) for s in scripts) == 200
    expected = mooncake_sessions(raw)
    assert {s.session_id: [inp for _, inp in s.contexts()] for s in scripts} == expected
    assert all(x["hash_ids"][0] == raw[0]["hash_ids"][0] for x in raw)  # one system-prompt block for all
    assert all(s.shared_prefix_tokens == 512 and s.block_tokens == 512 for s in scripts)  # block 0 everywhere
    multi = [s for s in scripts if len(s.turns) > 1]
    assert 0 < len(multi) == sum(len(v) > 1 for v in expected.values()) < len(scripts) < 200
    firsts = [int(s.session_id.split("-")[1]) for s in scripts]
    assert firsts == sorted(firsts) and all(s.session_id.startswith("mooncake-") for s in scripts)
    for s in multi:
        for t in s.turns[1:]:
            assert t.pause_kind is None and t.pause_before_s >= 0 and t.new_tokens >= 1
    assert sessions_from_trace(source, max_sessions=10) == scripts[:10]


def test_replications_resample_a_traces_sessions_seeded():
    # issue 29 item 5: replications cycled the trace in order (only the start and the pacing changed), so
    # the interval left out the session-sample variance; with resample each seed draws its own sample
    import itertools

    from kv_cache.workload.session_supply import script_supply
    from kv_cache.workload.sessions import SessionScript, Turn

    trace = [SessionScript(f"s{i}", (Turn(1000 * (i + 1), 10, None, None),), block_tokens=512,
                           shared_prefix_tokens=0) for i in range(20)]

    def first(seed, resample, n=40):
        return [s.session_id.split("#")[0] for s in itertools.islice(script_supply(trace, None, seed, resample)(), n)]

    assert first(1, False)[:20] == [f"s{i}" for i in range(20)] and first(1, False) == first(2, False)
    a, b = first(1, True), first(2, True)
    assert a == first(1, True)  # seeded: every rung and configuration of a replication replays the same
    assert a != b and len(set(a)) < 40  # another replication, another sample, drawn with replacement
    ids = [s.session_id for s in itertools.islice(script_supply(trace, None, 1, True)(), 40)]
    assert len(set(ids)) == 40  # a session drawn twice is two sessions
