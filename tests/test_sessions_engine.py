"""The modelled replica (kv_cache.serving.engine.replica) and the rung's model settings: HBM eviction order, TP
bytes, DRAM fraction, replica assignment, the absolute-deadline clock, load policy and I/O priorities."""

import dataclasses
import threading

import numpy as np
import pytest

from kv_cache.benchmarks.sessions.ladder import RungRun, replica_of
from kv_cache.cli import parse_sessions_settings
from kv_cache.serving.engine.io_pool import LOAD_PRIORITY, STORE_PRIORITY, IOPool
from kv_cache.serving.engine.replica import Replica, TurnRequest
from kv_cache.settings.sections import EvictionConfig
from kv_cache.workload.session_supply import script_supply


def turn(keys, needed=None, input_keys=None, tokens_per_block=1, output_tokens=1):
    input_keys = keys if input_keys is None else input_keys
    return TurnRequest(slot=0, session_id="s", turn_index=0, turn_class="return", issue_ns=0,
                       input_tokens=len(input_keys) * tokens_per_block, new_tokens=1, output_tokens=output_tokens,
                       input_keys=list(input_keys), final_keys=list(keys),
                       needed_slots=len(keys) if needed is None else needed)


def idle_replica(capacity, io=None, **kw):
    """A replica whose batching thread has already stopped: admission and completion are driven by hand."""
    stop = threading.Event()
    stop.set()
    r = Replica(0, capacity, 1, lambda *a: 0.0, io, lambda *a: None, lambda *a: None, lambda *a: None, 8, stop, **kw)
    r.thread.join()
    return r


def test_hbm_evicts_a_finished_turns_tail_first_so_its_prefix_survives():
    # The issue's case: a session's 6 blocks, then another turn needs 3 slots of a 6-block HBM. vLLM frees
    # the tail first, so the returning session still finds its first 3 blocks (front-first eviction: 0 hits).
    r = idle_replica(6)
    a = turn([f"a{i}" for i in range(6)])
    assert r._try_admit(a)
    r._complete(a)
    assert list(r.hbm) == ["a5", "a4", "a3", "a2", "a1", "a0"]  # LRU first: the tail goes first
    b = turn(["b0", "b1", "b2"])
    assert r._try_admit(b)
    r._complete(b)
    assert set(r.hbm) == {"a0", "a1", "a2", "b0", "b1", "b2"}
    back = turn([f"a{i}" for i in range(6)])
    assert r._try_admit(back)
    assert back.hbm_hit_blocks == 3 and back.recomputed_tokens == 3


def test_lru_across_turns_the_least_recent_turn_goes_first():
    r = idle_replica(4)
    for keys in (["x0", "x1"], ["y0", "y1"]):
        t = turn(keys)
        r._try_admit(t)
        r._complete(t)
    z = turn(["z0", "z1"])
    r._try_admit(z)  # evicts x (older), not y
    assert {"y0", "y1"} <= set(r.hbm) and not {"x0", "x1"} & set(r.hbm)


@pytest.fixture
def settings(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_configs:\n  micro:\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n"
                   "    kv_heads: 1\n")

    def make(*extra):
        return parse_sessions_settings(["--config", str(cfg), "--model", "micro", "--gpu", "l40s",
                                        "--gpu-mem-gb", "0.012", "--cpu-mem-gb", "0.05", "--cache-dir",
                                        str(tmp_path / "cache"), "--output", str(tmp_path / "o.json"), *extra])

    return make


def test_tensor_parallel_offloads_whole_blocks_and_reports_the_per_gpu_share(settings):
    one = settings().ladder_settings
    tp4 = settings("--num-gpus", "4", "--tensor-parallel", "4").ladder_settings
    assert tp4.block_bytes == one.block_bytes == one.block_tokens * one.model.bytes_per_token
    assert tp4.block_bytes_per_gpu * 4 == tp4.block_bytes


def test_dram_has_the_same_usable_fraction_alone_and_above_storage(settings):
    ls = settings().ladder_settings
    limits = {}
    for tiers in ("dram", "dram+storage"):
        rung = RungRun(ls, tiers, 1, script_supply(None, settings().sessions, ls.seed))
        rung._build()
        try:
            cpu = rung.cache.tier("cpu")
            last = rung.cache.tiers[-1] is cpu
            limits[tiers] = cpu.limit * (1.0 if last else ls.eviction.target_usage_ratio)
        finally:
            rung._teardown()
    assert limits["dram"] == pytest.approx(limits["dram+storage"]) == pytest.approx(
        ls.dram_bytes * EvictionConfig().target_usage_ratio)


def test_replica_assignment_is_stable_and_seeded():
    # fixed values: hashlib, not hash() (which changes with PYTHONHASHSEED from one process to the next)
    assert [replica_of(f"sess_{i}", 42, 4) for i in range(8)] == [replica_of(f"sess_{i}", 42, 4) for i in range(8)]
    spread = {replica_of(f"sess_{i}", 42, 4) for i in range(64)}
    assert spread == {0, 1, 2, 3}
    assert [replica_of(f"sess_{i}", 1, 4) for i in range(16)] != [replica_of(f"sess_{i}", 42, 4) for i in range(16)]
    assert replica_of("sess_0", 42, 4) == int.from_bytes(
        __import__("hashlib").blake2b(b"42:sess_0", digest_size=8).digest(), "big") % 4


@pytest.mark.slow  # the replica thread sleeps through 16 ms of modelled time
def test_modelled_time_runs_on_absolute_deadlines():
    # 8 prefill chunks of 8 tokens at 2 ms each: every iteration is reported exactly 2 ms after the previous
    # one, whatever the thread's wake-up delays (they are kept as lateness, not added to the clock)
    stamps = []
    done = threading.Event()
    stop = threading.Event()
    r = Replica(0, 100, 1, lambda *a: 0.002, None, lambda *a: None, lambda req, now: done.set(),
                lambda now, *a: stamps.append(now), 8, stop)
    try:
        req = turn([f"k{i}" for i in range(64)], output_tokens=1)
        req.issue_ns = 0
        r.submit(req)
        assert done.wait(10)
    finally:
        r.close()
    assert len(stamps) == 8
    assert [b - a for a, b in zip(stamps, stamps[1:], strict=False)] == [2_000_000] * 7
    assert len(r.late_ns) == 8 and all(x >= 0 for x in r.late_ns) and r.modelled_ns == 16_000_000
    assert r.late_ns.cap < 10**6  # bounded, whatever the rung's length


class FakeIO:
    block_bytes = 1000

    def __init__(self, bandwidth):
        self.bandwidth = bandwidth
        self.cache = self
        self.loaded = []

    def contains(self, key):
        return key.startswith("off")

    def read_bandwidth(self, tier):
        return self.bandwidth

    def tier_of(self, key):
        return "nvme"

    def load(self, key, done):
        self.loaded.append(key)

    def store(self, key):
        pass


@pytest.mark.parametrize("bandwidth, loads", [(1e12, True), (1.0, False), (None, True)])
def test_cost_policy_recomputes_when_loading_is_slower_than_prefill(bandwidth, loads):
    # prefill of 4 tokens is modelled at 1 s; 4 blocks of 1000 B take 4e-9 s at 1 TB/s (load) or 4000 s at
    # 1 B/s (recompute); before any read was measured the policy loads
    io = FakeIO(bandwidth)
    r = idle_replica(10, io=io, load_policy="cost", prefill_seconds=lambda new, cached: 1.0)
    req = turn([f"off{i}" for i in range(4)] + ["new0"])
    r._try_admit(req)
    assert bool(io.loaded) is loads
    assert req.skipped_load_blocks == (0 if loads else 4)
    assert req.load_bytes == (4000 if loads else 0)


def test_a_prefix_stopped_by_a_queued_store_is_counted():
    io = FakeIO(1e12)
    io.storing = {"evicted1"}  # evicted from HBM, its store not done: not in any tier yet
    r = idle_replica(10, io=io)
    req = turn(["off0", "evicted1", "off2"])
    r._try_admit(req)
    assert req.queued_store_miss and req.load_keys == ["off0"]  # the rest is recomputed
    other = turn(["off0", "gone1"])
    r._try_admit(other)
    assert not other.queued_store_miss  # a plain miss is not counted


def test_iopool_tracks_the_stores_in_flight():
    from kv_cache.serving.engine.io_pool import IOPool

    class Cache:
        def allocate(self, *a, **k):
            assert "k1" in pool.storing  # queued or running: in the set until it is done

    class Inline:
        def submit(self, job, priority=0):
            job(None)

    pool = IOPool(Cache(), Inline(), 1000, 1, threading.Event())
    pool.store("k1")
    assert pool.storing == set() and pool.snapshot()["store"].completed_ops == 1


def test_load_policy_is_checked():
    with pytest.raises(ValueError):
        idle_replica(4, load_policy="sometimes")


class RecordingExecutor:
    def __init__(self):
        self.jobs = []

    def submit(self, job, priority=0):
        self.jobs.append(priority)

    def close(self):
        pass


def test_loads_run_ahead_of_stores_and_are_counted_as_offered():
    ex = RecordingExecutor()
    io = IOPool(cache=None, executor=ex, block_bytes=4096, block_tokens=16, stop=threading.Event())
    io.store("a")
    io.load("b", lambda k, ok: None)
    assert LOAD_PRIORITY > STORE_PRIORITY and ex.jobs == [STORE_PRIORITY, LOAD_PRIORITY]
    snap = io.snapshot()
    assert snap["load"].submitted_bytes == snap["store"].submitted_bytes == 4096
    assert snap["load"].backlog_ops == 1 and io.read_bandwidth("cpu") is None


def test_full_settings_dataclass_keeps_the_default_policy(settings):
    ls = settings().ladder_settings
    assert ls.load_policy == "always" and dataclasses.replace(ls, load_policy="cost").load_policy == "cost"
    assert settings("--load-policy", "cost").ladder_settings.load_policy == "cost"


def test_article_grid_models_resolve_with_their_sourced_shapes(settings):
    from kv_cache.errors import UsageError
    from kv_cache.specs.models import MODEL_CONFIGS

    assert "llama3.1-405b" not in MODEL_CONFIGS  # the standard run keeps the reference's nine models
    ls = parse_sessions_settings(["--model", "llama3.1-405b", "--gpu", "h200", "--num-gpus", "8",
                                  "--tensor-parallel", "8"]).ladder_settings
    assert ls.model.bytes_per_token == 126 * 8 * 128 * 2 * 2 and ls.hbm_capacity_blocks() > 0
    assert ls.block_bytes_per_gpu * 8 == ls.block_bytes
    assert parse_sessions_settings(["--model", "qwen3-32b"]).ladder_settings.model.bytes_per_token == 262144
    with pytest.raises(UsageError, match="does not fit"):
        parse_sessions_settings(["--model", "llama3.1-405b", "--gpu", "h100"])


# ---------------------------------------------------------------------------------------------
# --steady-state
# ---------------------------------------------------------------------------------------------


def make_slots(n, settings_obj, block_tokens):
    from kv_cache.benchmarks.sessions.session_slots import Slot
    from kv_cache.workload.sessions import apply_pace

    ls = settings_obj.ladder_settings
    supply = script_supply(None, settings_obj.sessions, ls.seed)()
    return [Slot(i, block_tokens, 1.0, lambda: apply_pace(next(supply), ls.pace, ls.seed)) for i in range(n)]


def test_steady_start_fills_hbm_by_lru_and_prestores_the_rest(settings):
    from kv_cache.benchmarks.sessions.steady_state import prepare_steady_start

    s = settings("--pace", "fixed:2")
    slots = make_slots(12, s, 512)

    class StoreCounter:
        block_bytes = 1

        def __init__(self):
            self.stored = []
            self.cache = self

        def store(self, key):
            self.stored.append(key)

        def contains(self, key):
            return key in self.stored

    io = StoreCounter()
    replicas = [idle_replica(20, io=io), idle_replica(20, io=io)]
    start = prepare_steady_start(slots, replicas, lambda sid: replica_of(sid, 42, 2), seed=7, stagger_cap_s=3.0,
                                 drain=None)
    assert start.hbm_occupancy == 1.0 and all(len(r.hbm) == 20 for r in replicas)  # HBM full, as in a long run
    assert start.prestored_blocks == len(io.stored) > 0  # what HBM could not hold went to the tiers
    assert sum(1 for t in start.start_turns if t > 0) > 0  # sessions start mid-way, their context processed
    for slot, t in zip(slots, start.start_turns, strict=True):
        assert slot.turn == t and not slot.outstanding
        assert 0.0 <= slot.first_wake <= (2.0 if t else 3.0)  # staggered within the turn's pause
        if t:
            assert slot.next_request().turn_index == t  # the first issued turn is the drawn one
    again = make_slots(12, s, 512)
    same = prepare_steady_start(again, [idle_replica(20), idle_replica(20)], lambda sid: replica_of(sid, 42, 2),
                                seed=7, stagger_cap_s=3.0, drain=None)
    assert same.start_turns == start.start_turns  # seeded


def test_warmup_waits_a_turn_cycle_and_for_no_trend():
    from kv_cache.benchmarks.sessions.steady_state import StationarityDetector, mann_kendall_z

    assert mann_kendall_z(range(8)) > 1.96 and mann_kendall_z([3, 1, 4, 1, 5, 9, 2, 6][::-1]) < 1.96
    ramp = [(0.5 * k, 100.0 * min(k, 20), [0.1 * min(k, 20)]) for k in range(1, 81)]  # rises for 10 s, then flat
    d = StationarityDetector(min_s=3.0)
    steady_at = next(t for t, tok, ttft in ramp if d.add(t, tok, ttft))
    assert steady_at > 10.0  # not during the ramp, although the cycle (3 s) was over
    assert d.last["relative_slope"] is not None and "Mann-Kendall" in d.rule(30.0)
    flat = StationarityDetector(min_s=6.0)
    assert next(t for t, tok, ttft in [(0.5 * k, 100.0 + (k % 3), [0.2]) for k in range(1, 60)]
                if flat.add(t, tok, ttft)) >= 6.0  # at least one turn cycle even when steady from the start


def _ticks(rng, turns_in_span, ramp, n_ticks=40):
    """Per-tick turn counts over a warm-up of n_ticks ticks (0.25 s) whose latest half holds `turns_in_span`
    turns on average: flat, or rising linearly by x`ramp` over that half (from 1 to ramp times the rate)."""
    t = np.arange(1, n_ticks + 1) * 0.25
    half = t > t[-1] / 2
    base = turns_in_span / half.sum() / ((1 + ramp) / 2)
    frac = np.clip((t - t[-1] / 2) / (t[-1] / 2), 0, 1)
    rate = np.where(half, base * (1 + (ramp - 1) * frac), base)
    return t, rng.poisson(rate)


@pytest.mark.parametrize("turns", [16, 40, 100, 200])
def test_the_warmup_test_detects_a_2x_ramp_at_real_turn_counts(turns):
    # issue 29 item 4: the Mann-Kendall test over 8 sub-windows detected a 2x ramp 2.5-9 % of the time. The
    # slope bound must call a 2x ramp over the tested span steady at most 20 % of the time at any turn count
    # (by construction < 10 %; simulated here, 400 seeded warm-ups per count)
    from kv_cache.benchmarks.sessions.steady_state import StationarityDetector

    rng = np.random.default_rng(turns)
    steady = 0
    for _ in range(400):
        t, counts = _ticks(rng, turns, 2.0)
        d = StationarityDetector(min_s=float(t[-1]) - 1e-9, sessions=4)
        verdicts = [d.add(float(ti), 100.0 * c, [], turns=float(c)) for ti, c in zip(t, counts, strict=True)]
        steady += verdicts[-1]
    assert steady / 400 <= 0.2


def test_the_warmup_passes_a_flat_throughput_with_enough_turns_and_lasts_a_loaded_cycle():
    from kv_cache.benchmarks.sessions.steady_state import StationarityDetector

    rng = np.random.default_rng(1)
    passed = 0
    for _ in range(200):
        t, counts = _ticks(rng, 600, 1.0)
        d = StationarityDetector(min_s=float(t[-1]) - 1e-9, sessions=4)
        passed += [d.add(float(ti), 100.0 * c, [], turns=float(c)) for ti, c in zip(t, counts, strict=True)][-1]
    assert passed / 200 >= 0.8  # a flat throughput with 600 turns in the span is steady
    # the loaded cycle measured so far holds it back: 64 slots, 2 turns per 0.25 s tick = a cycle of 8 s
    d = StationarityDetector(min_s=1.0, sessions=64)
    first = next((k * 0.25 for k in range(1, 200) if d.add(k * 0.25, 200.0, [], turns=2.0)), None)
    assert first is not None and first >= 8.0


def test_window_shorter_than_three_turn_cycles_is_flagged():
    from kv_cache.benchmarks.sessions.steady_state import window_cycles

    assert window_cycles(64, 60.0, 640) == (6.0, None)  # 10 cycles of 6 s
    cycle, flag = window_cycles(64, 60.0, 64)  # one turn per slot: one 60 s cycle
    assert cycle == 60.0 and "1.0 turn cycles" in flag
    assert window_cycles(8, 5.0, 0)[0] is None


def _long_run_state(scripts, service, rng, samples):
    """A slot running `scripts` back to back, observed at uniform times: (context before the current turn,
    turn index) at each observation. The ground truth the steady start must reproduce."""
    from kv_cache.benchmarks.sessions.steady_state import session_seconds

    ends, states, t = [], [], 0.0
    for sc in scripts:
        ctx = sc.contexts()
        for i, (p, s) in enumerate(session_seconds(sc, service)):
            t += p + s  # the pause before turn i, then its service: the slot holds the context before turn i
            ends.append(t)
            states.append((ctx[i][0] if i else 0, i))
    import numpy as np

    idx = np.searchsorted(np.array(ends), rng.uniform(0, t, samples), side="right")
    return [states[int(k)] for k in idx]


def test_steady_start_is_length_biased_as_a_long_run():
    import numpy as np

    from kv_cache.benchmarks.sessions.session_slots import Slot
    from kv_cache.benchmarks.sessions.steady_state import prepare_steady_start
    from kv_cache.settings.schema import load_config
    from kv_cache.workload.sessions import generate_sessions

    cfg = load_config(None).sessions

    def service(script, i):  # a deterministic stand-in for the roofline: 1 s + 20 ms per output token
        return 1.0 + 0.02 * script.turns[i].output_tokens

    supply = generate_sessions(cfg, 42)
    n = 400
    slots = [Slot(i, cfg.block_tokens, 1.0, lambda: next(supply)) for i in range(n)]

    class Sink:
        def install(self, keys):
            return 0

        def occupancy(self):
            return 1.0

    start = prepare_steady_start(slots, [Sink()], lambda sid: 0, seed=7, stagger_cap_s=0.0, drain=None,
                                 draw=lambda: next(supply), service=service)
    long_run = [s for s, _ in zip(generate_sessions(cfg, 43), range(6000), strict=False)]
    truth = _long_run_state(long_run, service, np.random.default_rng(1), 20000)
    long_mean = float(np.mean([c for c, _ in truth]))
    long_turn0 = float(np.mean([i == 0 for _, i in truth]))
    got = start.to_dict()
    assert got["mean_installed_context_tokens"] == pytest.approx(long_mean, rel=0.10)
    assert got["fraction_at_turn_0"] == pytest.approx(long_turn0, abs=0.03)
    # the naive start (a session as drawn, a turn uniform among its turns) is what this replaced: far off
    naive = [s for s, _ in zip(generate_sessions(cfg, 44), range(2000), strict=False)]
    rng = np.random.default_rng(2)
    naive_ctx = [(lambda t: sc.contexts()[t][0] if t else 0)(int(rng.integers(0, len(sc.turns)))) for sc in naive]
    assert abs(float(np.mean(naive_ctx)) - long_mean) > 0.15 * long_mean
    assert all(slot.script is not None and slot.turn == t for slot, t in zip(slots, start.start_turns, strict=True))


@pytest.mark.slow  # runs a rung in real time
def test_steady_state_rung_starts_full_and_detects_its_warmup(settings):
    s = settings("--steady-state", "--window", "1", "--warmup", "2", "--pace", "fixed:0.3", "--io-workers", "2",
                 "--io-chunk-mb", "1", "--no-fsync")
    ls = s.ladder_settings
    result = RungRun(ls, "dram+storage", 6, script_supply(None, s.sessions, ls.seed)).run()
    st = result["steady_state"]
    assert st["hbm_occupancy_at_start"] == 1.0 and st["prestored_blocks"] > 0 and st["started_mid_session"] > 0
    assert 0 < result["warmup_end_s"] <= 2.0 and result["window_s"] == 1.0
    assert result["offload_io"]["storage_write_gib"] + result["offload_io"]["dram_write_gib"] < 1  # not counted


@pytest.mark.slow  # runs a rung in real time
def test_a_shaped_rung_names_its_storage_and_its_shaping(settings):
    s = settings("--window", "1", "--warmup", "0.5", "--pace", "fixed:0.2", "--io-workers", "2", "--io-chunk-mb", "1",
                 "--no-fsync", "--tier-bandwidth", "50", "--tier-latency", "0.5")
    ls = s.ladder_settings
    result = RungRun(ls, "dram+storage", 4, script_supply(None, s.sessions, ls.seed)).run()
    block = result["offload_tier"]
    assert block["storage"]["filesystem"] and block["storage"]["io_mode"] in ("direct", "buffered")
    assert block["storage"]["shaping"]["bandwidth_gbps"] == 50.0 and block["storage"]["shaping"]["latency_ms"] == 0.5
    assert [t["tier"] for t in block["tiers"]] == ["cpu", "storage"]
    assert set(block["tiers"][1]["latency_ms"]) == {"load", "store"}
    assert any("shaped" in n for n in result["tier_notes"]) and "queued_store_recomputed_turns" in result
    assert result["turn_cycle_s"] is None or result["turn_cycle_s"] > 0


def test_a_replicas_lateness_is_kept_in_bounded_memory_and_engine_clock_reads_it_past_the_cap():
    """One int an iteration went into a list for as long as a rung ran (a day of 10 ms iterations: 8.6
    million per replica); now a LatencySamples (count, sum, max of all; values while they fit)."""
    from kv_cache.benchmarks.sessions.rung_results import engine_clock
    from kv_cache.metrics.reservoir import LatencySamples

    class R:
        modelled_ns = 0

        def __init__(self, values, cap):
            self.late_ns = LatencySamples(cap, histogram=True)
            self.late_ns.extend(values)

    small = [R(range(1, 101), 1000), R([1_000_000], 1000)]
    exact = engine_clock(small)
    union = list(range(1, 101)) + [1_000_000]
    assert exact["iterations"] == 101 and exact["late_ms_max"] == 1.0
    assert abs(exact["late_ms_mean"] - sum(union) / 101 / 1e6) < 1e-12
    big = [R(range(1, 5001), 100), R(range(1, 5001), 100)]
    c = engine_clock(big)
    assert c["iterations"] == 10_000 and c["late_ms_max"] == 5000 / 1e6
    assert abs(c["late_ms_p99"] * 1e6 - 4950) <= 4950 / 1024 + 1
    assert all(len(r.late_ns.values) == 100 for r in big)  # memory: the cap, not the iterations
