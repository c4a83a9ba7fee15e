"""Sessions held: closed-loop session replay against modelled replicas, one rung at a time.

A rung = (tier configuration, number of concurrent sessions): the engines, offload tiers and storage
files are built fresh, N session slots run closed loop (a session's next turn is issued only after its
previous answer completed and its pause elapsed; when a session ends the next one starts), and after a
warm-up the window is measured. Every configuration at a given rung replays the same sessions (same seed),
so their work is comparable; a work-equivalence control flags any that completed different work.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kv_cache.benchmarks.sessions.rung_results import (
    RemoteWatch,
    RungRecord,
    engine_clock,
    failure_flags,
    failure_inputs,
    io_rates,
    kv_sources,
    per_gpu_rates,
    rung_flags,
    ttft_breakdown,
    ttft_percentiles,
    window_rate_ci,
    work_summary,
)
from kv_cache.benchmarks.sessions.session_slots import Slot
from kv_cache.benchmarks.sessions.steady_state import (
    WARMUP_CAP_CYCLES,
    StationarityDetector,
    SteadyStart,
    modelled_service,
    prepare_steady_start,
    window_cycles,
)
from kv_cache.benchmarks.sessions.tier_checks import offload_tier, tier_flags
from kv_cache.core import pool as pools
from kv_cache.core import shapes
from kv_cache.core.autoscale import IntervalSample, LoadShape
from kv_cache.core.closed_loop import ClosedLoop
from kv_cache.core.error_policy import ErrorPolicy
from kv_cache.core.events import EventLoop, Stop
from kv_cache.core.pool import Stream
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.serving.build import open_cache
from kv_cache.serving.engine import roofline as gpumod
from kv_cache.serving.engine.io_pool import IOPool
from kv_cache.serving.engine.replica import Replica, TurnRequest
from kv_cache.serving.tiers import TierSet
from kv_cache.settings.sessions import LadderSettings
from kv_cache.storage.tiername import TierName
from kv_cache.workload.sessions import SessionScript, apply_pace

__all__ = ["RungRun", "replica_of"]

def replica_of(session_id: str, seed: int, replicas: int) -> int:
    """Stable, seeded session -> replica assignment (the same in every process, unlike hash())."""
    digest = hashlib.blake2b(f"{seed}:{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % replicas


class RungRun:
    """One rung: build, run closed loop for warm-up + window, measure, tear down."""

    def __init__(
        self, ls: LadderSettings, tiers: str, sessions: int, scripts: Callable[[], Iterator[SessionScript]],
        shape: LoadShape | None = None, planned_cycle_s: float | None = None,
    ) -> None:
        self.ls = ls
        self.planned_cycle_s = planned_cycle_s  # the loaded turn cycle expected (planned from the rung below)
        self.tiers = tiers
        self.sessions = sessions
        # A rung holds its session count; another shape may move it at monitor ticks (slots join or leave
        # when their current turn ends).
        self.shape = shape or shapes.build(
            "constant", shapes.ShapeRequest(sessions, interval_s=max(ls.window_s / ls.subwindows, 0.1)))
        self.scripts = scripts()
        self.stop = threading.Event()
        self.metrics = RunMetrics()
        self.loop = EventLoop({"open_window": self._on_open_window, "monitor": self._on_monitor,
                               "warmup_check": self._on_warmup_check})
        self.window_start_ns: int | None = None
        self.steady: SteadyStart | None = None
        self.warmup = StationarityDetector()
        self.cap_s = ls.warmup_s  # the latest the window opens (steady state: at least one turn cycle)
        self.tick_at = (0, 0)  # (completed turns, first tokens) seen by the last warm-up check
        self.lock = threading.Lock()
        self.first_tokens: list[tuple[float, str, float]] = []  # (t, class, ttft s)
        self.first_reqs: list[tuple[float, TurnRequest]] = []  # (t, turn) at its first token
        self.io_open = self.io_close = None  # offload-I/O counter snapshots at the window's start and end
        self.backlog: list[tuple[float, int, int]] = []  # (t, load ops, store ops) queued at monitor ticks
        self.iterations: list[tuple[float, int, int]] = []  # (t, prefill tokens, decode tokens)
        self.completed: list[tuple[float, TurnRequest]] = []
        self.offered: list[tuple[float, int]] = []  # (t, new tokens)
        self.issued_inputs: list[int] = []  # every issued turn's whole context (tokens), warm-up included
        self.violations = 0
        self.sessions_started = 0
        self.max_context_tokens = 0  # the largest context of the sessions this rung started (tier_checks)
        self.storage_error: str | None = None  # why the error policy stopped the rung (None: it did not)

    # -- engine callbacks (engine threads) ---------------------------------------------------
    def _first_token(self, req: TurnRequest, now: int) -> None:
        with self.lock:
            self.first_tokens.append(((now - self.t0) / 1e9, req.turn_class, req.ttft_ns / 1e9))
            self.first_reqs.append(((now - self.t0) / 1e9, req))

    def _iteration(self, now: int, prefill: int, decode: int, replica: int) -> None:
        with self.lock:
            self.iterations.append(((now - self.t0) / 1e9, prefill, decode))

    def _done(self, req: TurnRequest, now: int) -> None:
        self.loop.complete((now, req))

    # -- build / tear down ---------------------------------------------------------------------
    def _build(self) -> None:
        """The offload tiers, cache and I/O pool through the standard run's builder (the same backends,
        memory budget, leftovers sweep, retries, --verify), with the standard run's error policy: a storage
        error past the threshold, or a fatal one, ends the rung (and the ladder) as a storage error."""
        ls = self.ls
        self.stores = TierSet([])
        # as the last tier the cache would fill DRAM to 100 %, above storage to target_usage_ratio:
        # the same usable fraction in both configurations
        self.policy = ErrorPolicy(ls.storage.max_storage_errors, self.loop.raise_alarm)
        workers = pools.worker_count(ls.storage.io_workers, self.sessions)
        self.cache = open_cache(
            ls.tier_settings(self.tiers), ls.storage, ls.eviction, self.metrics, ls.model.bytes_per_token,
            self.stop, self.stores, workers=workers, largest_entry=ls.block_bytes,
            other_bytes=2 * ls.storage.chunk_bytes * workers, storage_tier=self.tiers == "dram+storage",
            last_ram_fraction=ls.dram_usable_fraction, on_fault=self.policy)
        self.file_store, self.memory_store = self.stores.file_store, self.stores.memory_store
        self.remote = RemoteWatch(self.file_store)
        self.io = None
        if self.cache is not None:
            pool = pools.open_pool(Stream.ENGINE_IO, workers, ls.storage.chunk_bytes, ls.seed)
            self.io = IOPool(self.cache, pool.start(), ls.block_bytes, ls.block_tokens, self.stop)

        def iteration_seconds(prefill: list[tuple[int, int]], batch: int, context: int) -> float:
            return gpumod.iteration_seconds(ls.gpu, ls.efficiency, ls.model, prefill, batch, context, tp=ls.tensor_parallel)

        def prefill_seconds(new: int, cached: int) -> float:
            return gpumod.prefill_seconds(ls.gpu, ls.efficiency, ls.model, new, cached, tp=ls.tensor_parallel)

        cap = ls.hbm_capacity_blocks()
        self.replicas = [
            Replica(i, cap, ls.block_tokens, iteration_seconds, self.io, self._first_token, self._done,
                    self._iteration, ls.prefill_chunk_tokens, self.stop,
                    load_policy=ls.load_policy if self.io is not None else "always",
                    prefill_seconds=prefill_seconds, write_through=ls.dram_write_through)
            for i in range(ls.replicas)
        ]

    def _teardown(self) -> None:
        """Safe on a partly built rung (an interrupt may arrive while it is being built)."""
        self.stop.set()
        for r in getattr(self, "replicas", []):
            r.close()
        if getattr(self, "io", None) is not None:
            self.io.close()
        if getattr(self, "stores", None) is not None:
            self.stores.close()

    # -- the closed loop ----------------------------------------------------------------------
    def _next_script(self) -> SessionScript:
        self.sessions_started += 1
        script = apply_pace(next(self.scripts), self.ls.pace, self.ls.seed)
        self.max_context_tokens = max(self.max_context_tokens, script.max_context_tokens)
        return script

    def _issue(self, slot: Slot, now: int) -> None:
        if slot.outstanding:  # the closed-loop invariant; counted, never expected
            self.violations += 1
            return
        req = slot.next_request()
        req.issue_ns = now
        with self.lock:
            self.offered.append(((now - self.t0) / 1e9, req.new_tokens))
            self.issued_inputs.append(req.input_tokens)
        self.replicas[replica_of(req.session_id, self.ls.seed, len(self.replicas))].submit(req)

    def _make_slot(self, index: int) -> Slot:
        return Slot(index, self.ls.block_tokens, self.ls.human_threshold_s, self._next_script)

    def _issue_slot(self, slot: Slot, when: int) -> None:
        self._issue(slot, self._now)  # turns are stamped when the loop gets to them, as they reach the engine

    def _on_turn_done(self, end_ns: int, req: TurnRequest) -> None:
        slot = self.closed.users[req.slot]
        slot.outstanding = False
        self.completed.append(((end_ns - self.t0) / 1e9, req))
        self.closed.after(slot.user_id, end_ns)  # its pause, or the next session at once

    def _on_open_window(self, when: int, _: object) -> None:
        """Open the measured window (once: at the fixed warm-up's end, or when steady occupancy is detected)."""
        if self.window_start_ns is not None:
            return
        self.window_start_ns = when
        self.window_end = when + int(self.ls.window_s * 1e9)
        self.metrics.open_window(when)
        if self.io is not None:
            self.io_open = self.io.snapshot()

    def _on_warmup_check(self, when: int, interval_ns: int) -> None:
        """Steady-state runs: one tick of the stationarity test; open the window once it passes."""
        if self.window_start_ns is not None:
            return
        with self.lock:
            ttfts = [x[2] for x in self.first_tokens[self.tick_at[1]:]]
            self.tick_at = (len(self.completed), len(self.first_tokens))
        done = self.completed[self._done_at:]
        self._done_at = len(self.completed)
        tokens = sum(r.input_tokens + r.output_tokens for _, r in done)
        if self.warmup.add((when - self.t0) / 1e9, tokens, ttfts, turns=len(done)):
            self._on_open_window(when, None)
        else:
            self.loop.push(when + interval_ns, "warmup_check", interval_ns)

    def _drain_io(self) -> None:
        """Wait until every queued block move is done (the steady-state start's pre-stored blocks)."""
        while any(c.backlog_ops for c in self.io.snapshot().values()):
            self.stop.wait(0.005)

    def _on_monitor(self, when: int, last: tuple[int, int]) -> Stop | None:
        """Sample the interval (turns and tokens completed) and apply the load shape's decision."""
        done = self.completed[last[1]:]
        dt = max(1e-9, (when - last[0]) / 1e9)
        queued = sum(len(r.waiting) for r in self.replicas)
        if self.io is not None:
            snap = self.io.snapshot()
            self.backlog.append(((when - self.t0) / 1e9, snap["load"].backlog_ops, snap["store"].backlog_ops))
        sample = IntervalSample(
            t_s=(when - self.t0) / 1e9, users=self.closed.active,
            tokens_per_sec=sum(r.input_tokens + r.output_tokens for _, r in done) / dt,
            requests_per_sec=len(done) / dt, storage_read_gbps=0.0, storage_write_gbps=0.0,
            read_p95_ms=None, write_p95_ms=None, queued_requests=queued)
        target = self.shape.tick(sample)
        if target is None:
            return Stop("load shape ended")
        self.closed.set_active(target, when)
        self.loop.push(when + int(self.shape.interval_s * 1e9), "monitor", (when, len(self.completed)))
        return None

    def _step(self, window_end: int) -> bool:
        """One pass of the scheduler; False once the window is over (or the load shape ended it)."""
        loop = self.loop
        self._now = now = loop.clock()
        if now >= window_end:
            return False
        if loop.alarm is not None:  # the error policy stopped the rung
            self.storage_error = loop.alarm
            return False
        for end_ns, req in loop.take_completions():
            self._on_turn_done(end_ns, req)
        if loop.run_due(now, window_end) is not None:
            return False
        loop.wait_next(window_end)
        return True

    def _prepare(self, ls: LadderSettings) -> None:
        """Slots, the steady-state start (which stores blocks before the clock starts) and the first events."""
        self.closed = ClosedLoop(self.loop, [self._make_slot(i) for i in range(self.sessions)], self._issue_slot,
                                 make_user=self._make_slot)
        if ls.steady_state:
            self.steady = prepare_steady_start(
                self.closed.users, self.replicas, lambda sid: replica_of(sid, ls.seed, len(self.replicas)),
                ls.seed + self.sessions, ls.warmup_s, self._drain_io if self.io is not None else None,
                draw=lambda: apply_pace(next(self.scripts), ls.pace, ls.seed), service=modelled_service(ls.gpu, ls.efficiency, ls.model, ls.tensor_parallel))
            cycle = max(self.steady.turn_cycle_s, self.planned_cycle_s or 0.0)  # the loaded one, where planned
            self.warmup.min_s, self.warmup.sessions = cycle, self.sessions
            self.cap_s = max(ls.warmup_s, WARMUP_CAP_CYCLES * cycle)
        self._done_at = 0
        self.t0 = self._now = self.loop.clock()
        window_start = self.t0 + int(self.cap_s * 1e9)  # steady state: the latest the window opens
        self.window_end = window_start + int(ls.window_s * 1e9)
        self.loop.push(window_start, "open_window")
        if ls.steady_state:
            interval = int(max(0.05, min(1.0, ls.window_s / 20, self.cap_s / 20)) * 1e9)  # >= 8 ticks by the cap
            self.loop.push(self.t0 + interval, "warmup_check", interval)
        self.loop.push(self.t0 + int(self.shape.interval_s * 1e9), "monitor", (self.t0, 0))

    def run(self) -> dict[str, Any]:
        ls = self.ls
        measuring = False
        try:  # one try from the first file to the last: an interrupt anywhere in between still tears down
            self._build()
            self._prepare(ls)
            measuring = True
            self.closed.start(self.t0)
            while self._step(self.window_end):
                pass
        finally:
            if measuring:
                self.metrics.close_window(self.window_end)
                if getattr(self, "io", None) is not None:
                    self.io_close = self.io.snapshot()
            self._teardown()
        w0 = ((self.window_start_ns or self.t0 + int(self.cap_s * 1e9)) - self.t0) / 1e9
        result = self._results(w0, w0 + ls.window_s)
        result["warmup_end_s"] = w0
        result["turn_cycle_s"], cycle_flag = window_cycles(self.sessions, ls.window_s, result["completed_turns"])
        if cycle_flag:
            result["flags"].append(cycle_flag)
        if self.steady is not None:
            detected = w0 < self.cap_s - 1e-9
            result["steady_state"] = {**self.steady.to_dict(), "warmup_detected": detected,
                                      "warmup_cap_s": self.cap_s, "warmup_rule": self.warmup.rule(self.cap_s),
                                      "warmup_test": self.warmup.last or None}
            if not detected:
                result["flags"].append(f"no stationary warm-up detected: the window opened at the cap "
                                       f"({self.cap_s:g} s)")
        return result

    # -- results ------------------------------------------------------------------------------
    def _results(self, w0: float, w1: float) -> dict[str, Any]:
        ls = self.ls
        k = ls.subwindows
        gpus = ls.replicas * ls.tensor_parallel
        window = (w0, w1)
        it = [(t, p, d) for t, p, d in self.iterations if w0 <= t < w1]
        done = [(t, r) for t, r in self.completed if w0 <= t < w1]
        offered = [(t, n) for t, n in self.offered if w0 <= t < w1]
        rec = RungRecord(window, k, gpus, ls.block_bytes, self.first_reqs, self.io_open, self.io_close, self.backlog)

        def per_gpu_rate(samples: list[tuple[float, float]]) -> list[float]:
            return per_gpu_rates(samples, window, k, gpus)

        # Served tokens (as vLLM counts throughput): prompt (whole context, cached or not) and generated tokens
        # of the turns completed in the window. Recomputing a context adds GPU work, not served tokens.
        self.throughput_samples = per_gpu_rate([(t, r.input_tokens + r.output_tokens) for t, r in done])
        total = window_rate_ci([(t, r.input_tokens + r.output_tokens) for t, r in done], window, k, gpus)
        prefill = window_rate_ci([(t, r.input_tokens) for t, r in done], window, k, gpus)
        decode = window_rate_ci([(t, r.output_tokens) for t, r in done], window, k, gpus)
        computed = window_rate_ci([(t, p) for t, p, _ in it], window, k, gpus)
        turns_rate = window_rate_ci([(t, 1.0) for t, _ in done], window, k, gpus)
        # percentiles of the pooled TTFTs of the window, bootstrap interval (seeded per rung)
        ttft = ttft_percentiles(rec, ls.seed + self.sessions)
        new_done = [r.new_tokens for _, r in done]
        new_offered = [n for _, n in offered]
        result = {
            "tiers": self.tiers,
            "sessions": self.sessions,
            "gpus": gpus,
            "window_s": w1 - w0,
            "subwindows": k,
            "seed": ls.seed,
            "load_policy": ls.load_policy,
            "throughput_tokens_per_s_per_gpu": total.to_dict(),
            "prefill_tokens_per_s_per_gpu": prefill.to_dict(),
            "decode_tokens_per_s_per_gpu": decode.to_dict(),
            "gpu_prefill_computed_tokens_per_s_per_gpu": computed.to_dict(),
            "completed_turns": len(done),
            "completed_turns_per_s_per_gpu": turns_rate.to_dict(),
            "ttft": ttft,
            "ttft_breakdown": ttft_breakdown(rec),
            "kv_sources": kv_sources(done, self.ls.block_tokens),
            "offload_io": self._offload_io(),
            "offload_io_rates": io_rates(rec),
            "storage_errors": self.metrics.storage_error_table(),
            "storage_error": self.storage_error,
            "verify": {"enabled": ls.storage.verify, "mismatches": self.metrics.verify_mismatches},
            "tier_notes": list(self.stores.notes) if getattr(self, "stores", None) is not None else [],
            "tier_backends": self.stores.backend_names() if getattr(self, "stores", None) is not None else {},
            "work": work_summary(done, offered, new_done, new_offered),
            "sessions_started": self.sessions_started,
            "closed_loop_violations": self.violations,
            "oversized_turns": sum(1 for _, r in done if r.oversized),
            "hbm_evictions": sum(r.evictions for r in self.replicas),
            "hbm_kv_capacity_blocks": ls.hbm_capacity_blocks(),
            "hbm_max_occupied_blocks": max(r.max_occupied for r in self.replicas),
            "engine_clock": engine_clock(self.replicas),
            **(self.remote.result(self.metrics) if getattr(self, "remote", None) is not None else {}),
        }
        filled = result["hbm_evictions"] > 0 or result["hbm_max_occupied_blocks"] >= result["hbm_kv_capacity_blocks"]
        result["flags"] = rung_flags(result, self.tiers, filled, self.throughput_samples)
        result["queued_store_recomputed_turns"] = sum(1 for _, r in done if r.queued_store_miss)
        result["offload_tier"] = offload_tier(getattr(self, "stores", None), self.cache, self.metrics,
                                              self.max_context_tokens, ls.model.bytes_per_token, self.io,
                                              ls.storage.io_workers)
        if self.tiers != "none":
            result["flags"] += tier_flags(result["offload_tier"], ls.gpu.host_link_gbs, ls.tensor_parallel,
                                          result["queued_store_recomputed_turns"], len(done))
        result["flags"] += failure_flags(result, self.tiers, failure_inputs(
            ls, self.issued_inputs, getattr(getattr(self, "closed", None), "users", []),
            getattr(getattr(self, "stores", None), "sizes", {}),
            lambda n: gpumod.prefill_seconds(ls.gpu, ls.efficiency, ls.model, n, 0, tp=ls.tensor_parallel)))
        return result

    def _offload_io(self) -> dict[str, Any]:
        """The offload tiers' bytes and operations in the window, in all and per GPU of a replica."""
        ls = self.ls
        storage, cpu = TierName.STORAGE.value, TierName.CPU.value
        st_r, st_w = self.metrics.tier_op(storage, "read"), self.metrics.tier_op(storage, "write")
        cpu_r, cpu_w = self.metrics.tier_op(cpu, "read"), self.metrics.tier_op(cpu, "write")
        return {
            "storage_read_gib": st_r.window_bytes / GIB,
            "storage_write_gib": st_w.window_bytes / GIB,
            "dram_read_gib": cpu_r.window_bytes / GIB,
            "dram_write_gib": cpu_w.window_bytes / GIB,
            "storage_read_ops": st_r.ops,
            "storage_write_ops": st_w.ops,
            "errors": int(sum(self.metrics.errors.values())),
            "block_bytes": ls.block_bytes,
            "block_bytes_per_gpu": ls.block_bytes_per_gpu,
            "storage_read_gib_per_gpu": st_r.window_bytes / GIB / ls.tensor_parallel,
            "storage_write_gib_per_gpu": st_w.window_bytes / GIB / ls.tensor_parallel,
        }
