"""Which timer took the device times is said wherever a run's figures are read: a merge whose ranks used
different timers prints each rank's, and a --processes run's merged summary names the ranks on the Python
fallback (storage/timedio.py), whose device times include the wait for the GIL."""

from __future__ import annotations

from kv_cache.render.console import report_lines
from kv_cache.render.merged_table import merged_table
from kv_cache.results.merge import merge_documents
from tests.test_merge import SIZES, _ranks

C = {"timer": "c", "description": "clock_gettime(CLOCK_MONOTONIC) around each syscall in C, GIL released"}
PY = {"timer": "python", "description": "perf_counter_ns() around os.pwritev/os.preadv in Python (fallback: "
      "the C helper is not built); includes the wait to re-take the GIL"}


def _merged(timers: list[dict]) -> dict:
    docs, _ = _ranks(sizes=SIZES[:len(timers)])
    for d, t in zip(docs, timers, strict=True):
        d["measurement"].update(device_timer=t, timed=f"device = the syscalls, timer: {t['description']}",
                                io_mode="direct", chunk_bytes=4 << 20, fsync=True, io_workers=8)
    return merge_documents(docs)


def test_ranks_that_timed_differently_are_printed_each():
    m = _merged([PY, C])
    assert m["measurement"]["device_timer"] is None  # the ranks differ: each one's under per_rank
    text = "\n".join(report_lines(m))
    assert "Timed: None" not in text
    assert "  Timed (rank 0): device = the syscalls, timer: perf_counter_ns()" in text
    assert "  Timed (rank 1): device = the syscalls, timer: clock_gettime(" in text
    assert "  device timer: python on rank(s) 0 of 2: perf_counter_ns()" in merged_table(m)


def test_a_merge_on_the_c_helper_prints_one_timed_line_and_no_fallback_warning():
    m = _merged([C, C])
    assert m["measurement"]["device_timer"] == C
    text = "\n".join(report_lines(m))
    assert text.count("  Timed: device = the syscalls, timer: clock_gettime(") == 1 and "Timed (rank" not in text
    assert "device timer:" not in merged_table(m)
    assert "device timer: python on rank(s) 0, 1 of 2" in merged_table(_merged([PY, PY]))
