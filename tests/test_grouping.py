"""The one trace-rows -> sessions grouping (trace replay and `kv-cache sessions` both use it)."""

from kv_cache.workload.grouping import complete_ids, group_sessions
from kv_cache.workload.traces import TraceRequest


def row(index, session=None, tokens=1024, ids=(), block=512):
    return TraceRequest(index, session, 1, None, None, tokens, tokens, 1, tuple(ids), block, "request")


def test_session_ids_group_interleaved_rows_in_order():
    rows = [row(0, "a"), row(1, "b"), row(2, "a"), row(3, None), row(4, "b")]
    grouped = group_sessions(rows, infer_sessionless=False)
    assert [(g.key, [r.index for r in g.rows]) for g in grouped.sessions] == \
        [("a", [0, 2]), ("b", [1, 4]), ("row_3", [3])]
    assert all(m is None for g in grouped.sessions for m in g.matched)


def test_max_rows_and_max_sessions():
    rows = [row(i, s) for i, s in enumerate("abcab")]
    assert sum(len(g.rows) for g in group_sessions(rows, infer_sessionless=False, max_rows=3).sessions) == 3
    kept = group_sessions(rows, infer_sessionless=False, max_sessions=2).sessions
    assert [(g.key, len(g.rows)) for g in kept] == [("a", 2), ("b", 2)]  # rows of c skipped, not the rest


def test_sessionless_rows_continue_the_longest_matching_prefix():
    first = row(0, ids=(0, 1, 2), tokens=3 * 512)  # system block 0 + two blocks of its own
    other = row(1, ids=(0, 7, 8), tokens=3 * 512)  # shares only the one-block system prompt: a new session
    cont = row(2, ids=(0, 1, 2, 3), tokens=4 * 512)  # extends the first row's complete blocks
    grouped = group_sessions([first, other, cont], infer_sessionless=True, fmt="mooncake")
    assert [(g.key, [r.index for r in g.rows]) for g in grouped.sessions] == \
        [("mooncake-0", [0, 2]), ("mooncake-1", [1])]
    assert grouped.sessions[0].matched == [None, 3]
    assert complete_ids(row(5, ids=(4, 5, 6), tokens=1000), 512) == (4,)
