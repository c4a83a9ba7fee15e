"""The I/O worker count: --io-workers exactly, the probe's smallest count at 95 % of the best, and the
memory its buffers cost (clamped with a note, refused under --strict-memory)."""

from __future__ import annotations

import pytest

from kv_cache.core import io_workers as iw
from kv_cache.errors import StorageSetupError
from kv_cache.host.memlimit import MemoryLimit
from kv_cache.storage.files import FileStore

MIB = 1 << 20
GIB = 1 << 30
BIG = MemoryLimit(64 * GIB, "test")


def test_io_workers_is_exact_when_it_fits():
    notes: list[str] = []
    c = iw.choose(7, users=100, limit_allocs=0, chunk_bytes=16 * MIB, mem=BIG, strict=False, notes=notes)
    assert (c.count, c.how, c.clamped, notes) == (7, "--io-workers", None, [])


def test_a_count_whose_buffers_do_not_fit_is_clamped_with_a_note_or_refused_under_strict():
    mem = MemoryLimit(4 * GIB, "test")
    cap = iw.memory_cap(16 * MIB, mem)
    # half of 90 % of 4 GiB less 256 MiB reserve, in 32 MiB (read + write buffer) workers
    assert cap == int(0.5 * (int(0.9 * 4 * GIB) - 256 * MIB)) // (32 * MIB) == 53
    notes: list[str] = []
    c = iw.choose(100_000, users=1, limit_allocs=0, chunk_bytes=16 * MIB, mem=mem, strict=False, notes=notes)
    assert c.count == cap and c.clamped and "clamped to 53" in notes[0] and "100000 I/O workers" in notes[0]
    with pytest.raises(StorageSetupError) as ei:
        iw.choose(100_000, users=1, limit_allocs=0, chunk_bytes=16 * MIB, mem=mem, strict=True, notes=[])
    assert ei.value.setting == "io_workers" and "give at most 53" in str(ei.value)
    assert iw.provisional(100_000, 1, 16 * MIB, mem, False) == cap


def test_smallest_count_reaching_95_percent_of_the_best():
    rows = [{"workers": 1, "write_gibps": 0.5, "read_gibps": 0.8}, {"workers": 2, "write_gibps": 0.96,
            "read_gibps": 1.0}, {"workers": 4, "write_gibps": 1.0, "read_gibps": 1.9},
            {"workers": 8, "write_gibps": 0.97, "read_gibps": 2.0}]
    assert iw.smallest_reaching(rows, "write_gibps") == 2  # 0.96 >= 0.95 x 1.0
    assert iw.smallest_reaching(rows, "read_gibps") == 4  # 1.9 = 0.95 x 2.0
    # adversarial: a best reached only at the largest count is taken, not the first plateau
    rows2 = [{"workers": w, "read_gibps": g} for w, g in ((1, 1.0), (2, 1.0), (4, 1.0), (8, 3.0))]
    assert iw.smallest_reaching(rows2, "read_gibps") == 8


def test_the_probe_measures_the_tier_and_leaves_nothing_behind(tmp_path):
    with FileStore(tmp_path, 64 * 1024, fsync=False, io_mode="buffered") as store:
        rows = iw.probe(store, 64 * 1024, seed=1, counts=(1, 2), seconds=0.05)
        assert [r["workers"] for r in rows] == [1, 2]
        assert all(r["write_gibps"] > 0 and r["read_gibps"] > 0 for r in rows)
        assert store.keys() == [] and not list(store.run_dir.glob("*.npy"))
        notes: list[str] = []
        c = iw.choose(0, users=20, limit_allocs=3, chunk_bytes=64 * 1024, mem=BIG, strict=False, notes=notes,
                      store=store, probe_seconds=0.02)
        first = [r for r in c.probe if not r.get("confirm")]
        assert 1 <= c.count <= 3 and c.how.startswith("probe") and len(first) == len(iw.PROBE_COUNTS)
        assert "probe GiB/s write/read 1:" in c.line()


def test_a_short_run_is_not_probed_and_says_so():
    notes: list[str] = []
    c = iw.choose(0, users=5, limit_allocs=0, chunk_bytes=16 * MIB, mem=BIG, strict=False, notes=notes,
                  store=object(), probe_seconds=iw.probe_seconds(10))
    assert c.count == 5 and "not probed" in c.how and c.probe == []
    assert iw.probe_seconds(120) == iw.PROBE_SECONDS and iw.probe_seconds(300, max_requests=10) == 0


def test_a_closed_loop_run_gets_at_most_one_probed_worker_per_user(tmp_path):
    with FileStore(tmp_path, 64 * 1024, fsync=False, io_mode="buffered") as store:
        c = iw.choose(0, users=2, limit_allocs=0, chunk_bytes=64 * 1024, mem=BIG, strict=False, notes=[],
                      store=store, probe_seconds=0.01, demand=1)
    assert c.count == 1 and ("one per user" in c.how or c.how.startswith("probe"))


def test_a_probe_that_meets_a_storage_error_falls_back_and_leaves_the_error_to_the_run():
    class Failing:
        def write(self, key, nbytes, bufs):
            raise OSError(30, "Read-only file system")

        def delete(self, key):
            raise OSError(30, "Read-only file system")

    notes: list[str] = []
    c = iw.choose(0, users=3, limit_allocs=0, chunk_bytes=64 * 1024, mem=BIG, strict=False, notes=notes,
                  store=Failing(), probe_seconds=0.01)
    assert c.count == 3 and "the probe failed" in c.how and "Read-only" in notes[0]


def test_each_probe_thread_frees_what_the_store_holds_for_it(tmp_path):
    """The remote tiers keep a slot ring per writing thread (Redis: 8 chunks): the probe's ~60 short-lived
    threads kept theirs to the end of the run (a Redis run's peak RSS was 16.7 GiB at 16 workers, against
    2.6 GiB measured for --io-workers 16). Each probe thread now calls the store's release_thread as it
    ends: no ring outlives the probe."""
    import threading

    class Ringed(FileStore):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.tls, self.live, self.released, self.lock = threading.local(), set(), 0, threading.Lock()

        def write(self, key, nbytes, bufs, stop=None):
            if not hasattr(self.tls, "ring"):
                self.tls.ring = object()
                with self.lock:
                    self.live.add(id(self.tls.ring))
            return super().write(key, nbytes, bufs, stop)

        def release_thread(self):
            ring = getattr(self.tls, "ring", None)
            with self.lock:
                self.released += 1
                if ring is not None:
                    self.live.discard(id(ring))

    with Ringed(tmp_path, 64 * 1024, fsync=False, io_mode="buffered") as store:
        rows = iw.probe(store, 64 * 1024, seed=1, counts=(1, 2, 4), seconds=0.01)
        assert [r["workers"] for r in rows] == [1, 2, 4]
        assert store.live == set() and store.released == 2 * (1 + 2 + 4)  # write and read threads alike


# ------------------------------------------------------------------ the rule, on synthetic probe figures
def _synthetic(write: dict[int, float], read: dict[int, float], noise: float, seed: int):
    """Probe rows and a `measure` from true rates per count, each figure off by up to +-`noise` (seeded)."""
    import random

    rng = random.Random(seed)

    def jitter(x: float) -> float:
        return x * (1 + rng.uniform(-noise, noise))

    rows = [{"workers": n, "write_gibps": jitter(write[n]), "read_gibps": jitter(read[n])} for n in iw.PROBE_COUNTS]
    calls: list[tuple[int, str]] = []

    def measure(n: int) -> dict[str, float]:
        calls.append(n)
        return {"write_gibps": jitter(write[n]), "read_gibps": jitter(read[n])}

    return rows, measure, calls


FLAT = dict.fromkeys(iw.PROBE_COUNTS, 1.0)


def test_the_rule_finds_the_knee_of_a_noisy_plateau_whatever_the_noise_draws():
    """The rate rises to 4 workers, then a plateau, with +-4 % noise on every figure; one seed in three
    puts a spike at 32 (the best by 8 %, which only 32 reaches): the step-down in alternating pairs walks
    back to the knee in every draw, never below it (2 workers give 15 % less)."""
    knee = {1: 0.6, 2: 0.85, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}
    for seed in range(30):
        rows, measure, _ = _synthetic(knee, FLAT, 0.04, seed)
        if seed % 3 == 0:
            rows[-1]["write_gibps"] = 1.08
        count, pairs = iw.decide(rows, measure)
        assert count == 4, (seed, rows, pairs)


def test_the_rule_keeps_one_worker_where_the_rate_peaks_at_one_or_falls_with_more():
    falling = {1: 1.0, 2: 0.9, 4: 0.7, 8: 0.5, 16: 0.3, 32: 0.2}
    peak = {1: 1.0, 2: 0.8, 4: 0.8, 8: 0.8, 16: 0.8, 32: 0.8}
    for curve in (falling, peak):
        for seed in range(10):
            rows, measure, calls = _synthetic(curve, curve, 0.04, seed)
            assert iw.decide(rows, measure) == (1, []) and calls == []  # nothing to step down from


def test_the_rule_takes_the_larger_direction_and_does_not_step_below_a_real_knee():
    """Writes saturate at 2, reads only at 16 (a 25 % step from 8). The step-down checks both directions:
    checked on the one direction that set the count, a draw of the noisy-plateau case above (seed 15 at
    +-4 %: reads set 8) walked reads down to 1 worker, at 60 % of the write rate. At +-3 % noise: 16 in
    every draw;
    at +-5 %, never below 16 (a false stop keeps 32: more memory, never less bandwidth)."""
    write = {1: 0.5, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}
    read = {1: 0.2, 2: 0.4, 4: 0.6, 8: 0.8, 16: 1.0, 32: 1.0}
    for seed in range(30):
        rows, measure, _ = _synthetic(write, read, 0.03, seed)
        count, pairs = iw.decide(rows, measure)
        assert count == 16 and pairs[-1]["workers"] == 8 and pairs[-1]["vs"] == 16, (seed, pairs)
        rows, measure, _ = _synthetic(write, read, 0.05, seed)
        assert iw.decide(rows, measure)[0] in (16, 32), seed


def test_a_step_down_with_no_figure_keeps_the_count():
    rows, _, _ = _synthetic(FLAT, FLAT, 0.0, 1)
    rows[-1]["write_gibps"] = 2.0  # only 32 reaches the best
    assert iw.decide(rows, lambda n: {}) == (32, [])


def test_the_steady_rate_counts_each_operation_for_its_share_of_the_span():
    """Three threads do one GiB per 0.1 s; the fourth's first operation ends late (0.999 s), then it keeps
    their pace. The span where all four run is (0.999, 1.0]: counted whole by their end time, the three
    operations ending in it gave 3 GiB in 1 ms, 3000 GiB/s (the probe once read 59 GiB/s from a disk that
    does 1.5); pro rata, the truth: four threads at 10 GiB/s each."""
    g = 1 << 30
    regular = [[(round(0.1 * k, 3), g) for k in range(1, 11)] for _ in range(3)]
    late = [(0.999, g), (1.099, g)]
    assert iw.steady_rate([*regular, late]) == pytest.approx(40.0)
    assert iw.steady_rate(regular) == pytest.approx(30.0)  # no late thread: the plain rate
    assert iw.steady_rate([[(0.1, g)], late]) == 0.0  # a thread with its first operation only: no figure


def test_the_probe_keeps_to_its_time_budget_and_says_what_it_left_out(tmp_path):
    """MIN_OPS per thread made each step on a slow tier long (moto at 0.05 GiB/s: minutes of probe before a
    120 s window). A count whose steps, estimated from the count before it, do not fit in what is left of
    the budget is not probed; the first always is."""
    assert iw.probe_budget_s(120) == pytest.approx(12.0) and iw.probe_budget_s(3600) == iw.PROBE_BUDGET_MAX_S
    assert iw.step_estimate(32, 0.05, 16 * MIB, 0.3) == pytest.approx(32 * 3 * 16 / 1024 / 0.05)
    assert iw.step_estimate(1, 0.0, MIB, 0.3) == float("inf")
    with FileStore(tmp_path, 64 * 1024, fsync=False, io_mode="buffered") as store:
        c = iw.choose(0, users=20, limit_allocs=0, chunk_bytes=64 * 1024, mem=BIG, strict=False, notes=[],
                      store=store, probe_seconds=0.01, budget_s=0.0)
        assert [r["workers"] for r in c.probe] == [1] and c.count == 1
        assert "budget left out 2 workers and more" in c.how
        assert store.keys() == []


def test_run_threads_joins_every_thread_before_raising_the_first_error():
    import threading as _t

    from kv_cache.core.pool import run_threads

    ran, gate = [], _t.Event()

    def target(i: int) -> None:
        if i == 0:
            raise ValueError("zero")
        gate.wait(5)
        ran.append(i)

    _t.Timer(0.05, gate.set).start()
    with pytest.raises(ValueError, match="zero"):
        run_threads(target, 3)
    assert sorted(ran) == [1, 2]  # the others had ended when the error was raised
