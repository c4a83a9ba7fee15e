"""kv_cache/host/malloc.py: the arena cap and the periodic malloc_trim, with a fake libc (deterministic;
no timing), and once against this process's real malloc where it is glibc's."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from kv_cache.host import malloc


class FakeLibc:
    def __init__(self, mallopt_ok: bool = True) -> None:
        self.mallopt_calls: list[tuple[int, int]] = []
        self.trims = 0
        self.mallopt_ok = mallopt_ok

    def mallopt(self, param: int, value: int) -> int:
        self.mallopt_calls.append((param, value))
        return 1 if self.mallopt_ok else 0

    def malloc_trim(self, pad: int) -> int:
        assert pad == 0
        self.trims += 1
        return 1


def _probe(libc):
    return lambda: (libc, "2.36")


def _tick(s: float):
    return SimpleNamespace(elapsed_s=s)


def test_configure_caps_the_arenas_once_at_start():
    libc = FakeLibc()
    policy = malloc.configure({}, _probe(libc))
    assert libc.mallopt_calls == [(malloc.M_MMAP_THRESHOLD, 131072), (malloc.M_ARENA_MAX, malloc.ARENA_MAX)]
    assert policy.record() == {"allocator": "glibc 2.36", "arena_max": 2,
                               "arena_max_source": "kv-cache: mallopt(M_ARENA_MAX) at start",
                               "mmap_threshold": "kv-cache: mallopt(M_MMAP_THRESHOLD=131072) at start"}


def test_a_refused_threshold_is_said_as_glibcs_dynamic_one():
    policy = malloc.configure({}, _probe(FakeLibc(mallopt_ok=False)))
    assert policy.record()["mmap_threshold"] == "mallopt(M_MMAP_THRESHOLD) refused: glibc's dynamic threshold"


def test_the_users_arena_setting_keeps_our_threshold():
    libc = FakeLibc()
    policy = malloc.configure({"MALLOC_ARENA_MAX": "8"}, _probe(libc))
    assert libc.mallopt_calls == [(malloc.M_MMAP_THRESHOLD, 131072)]
    assert policy.record()["mmap_threshold"] == malloc.FIXED


@pytest.mark.parametrize("environ", [{"MALLOC_MMAP_THRESHOLD_": "131072"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}])
def test_an_mmap_threshold_of_the_environment_is_said_and_nothing_is_changed_for_it(environ):
    libc = FakeLibc()
    policy = malloc.configure(environ, _probe(libc))
    assert libc.mallopt_calls == [(malloc.M_ARENA_MAX, malloc.ARENA_MAX)]  # (no mallopt of the threshold)
    assert "in the environment" in policy.record()["mmap_threshold"]


@pytest.mark.parametrize("environ", [{"MALLOC_ARENA_MAX": "8"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}])
def test_the_users_arena_setting_is_kept(environ):
    libc = FakeLibc()
    policy = malloc.configure(environ, _probe(libc))
    assert libc.mallopt_calls == [(malloc.M_MMAP_THRESHOLD, 131072)]  # (the arenas left alone)
    assert policy.arena_max is None and "in the environment" in policy.arena_max_source
    assert policy.libc is libc  # the trims still run


def test_a_refused_mallopt_is_said():
    policy = malloc.configure({}, _probe(FakeLibc(mallopt_ok=False)))
    assert policy.arena_max is None and "refused" in policy.note


def test_not_glibc_changes_nothing_and_says_why():
    policy = malloc.configure({}, lambda: (None, None))
    trimmer = malloc.MallocTrimmer(policy, 60)
    assert not trimmer.active
    trimmer.tick(_tick(1e6))
    trimmer.done()
    rec = trimmer.record()
    assert rec["allocator"] is None and "not glibc" in rec["note"] and "trims" not in rec


def test_a_preloaded_allocator_is_left_alone():
    libc = FakeLibc()
    policy = malloc.configure({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, _probe(libc))
    assert policy.libc is None and libc.mallopt_calls == [] and "libjemalloc" in policy.note


def test_trims_every_interval_of_ticks_and_counts_what_rss_gave_back():
    libc = FakeLibc()
    rss = iter([100, 60, 60, 70, 50, 50])  # before/after of 3 trims: -40, +10 (counted 0), 0
    clock = iter([0.0, 0.002, 1.0, 1.001, 2.0, 2.005])
    trimmer = malloc.MallocTrimmer(malloc.configure({}, _probe(libc)), 60, rss=lambda: next(rss),
                                   clock=lambda: next(clock))
    for s in range(1, 181):  # 180 ticks of 1 s: due at 60, 120 and 180
        trimmer.tick(_tick(float(s)))
        if trimmer._thread is not None:  # (the trim runs on its thread: wait for it before the next tick)
            while trimmer._wake.is_set():
                time.sleep(0.001)
    trimmer.done()
    rec = trimmer.record()
    assert libc.trims == 3 == rec["trims"] == rec["trims_released"]
    assert rec["trim_returned_bytes"] == 40
    assert rec["trim_seconds_total"] == pytest.approx(0.008) and rec["trim_seconds_max"] == pytest.approx(0.005)
    assert rec["trim_interval_s"] == 60 and "malloc_trim(0)" in rec["trim_method"]


def test_interval_zero_never_trims():
    libc = FakeLibc()
    trimmer = malloc.MallocTrimmer(malloc.configure({}, _probe(libc)), 0)
    assert not trimmer.active
    for s in range(1, 100):
        trimmer.tick(_tick(float(s)))
    trimmer.done()
    assert libc.trims == 0 and trimmer.record()["trims"] == 0
    assert trimmer.record()["trim_method"].startswith("off")


def test_the_real_malloc_where_it_is_glibc():
    libc, version = malloc._glibc()
    if libc is None:
        pytest.skip("malloc here is not glibc's")
    trimmer = malloc.MallocTrimmer(malloc.MallocPolicy(f"glibc {version}", libc=libc), 60)
    trimmer.trim_once()
    rec = trimmer.record()
    assert rec["trims"] == 1 and rec["trim_returned_bytes"] >= 0 and malloc.rss_bytes() > 0


def test_trim_soon_trims_once_on_the_trimmers_thread_and_not_after_done():
    libc = FakeLibc()
    trimmer = malloc.MallocTrimmer(malloc.configure({}, _probe(libc)), 60, rss=lambda: 10)
    trimmer.trim_soon()  # (what the periodic document's thread calls once a document is freed)
    while trimmer.record()["trims"] < 1:
        time.sleep(0.001)
    trimmer.done()
    trimmer.trim_soon()
    assert libc.trims == 1 and not trimmer._thread.is_alive()
