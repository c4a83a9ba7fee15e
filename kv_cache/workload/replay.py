"""Trace replay: turns TraceRequest rows into request plans, paced as the trace says.

Two shapes, decided by the format:
- sessionless, timestamped rows (Mooncake, BurstGPT): open loop, each row at its recorded arrival time
  divided by `--trace-speedup` (0 = as fast as the workers take them, with back-pressure, no rejections);
- sessions (WEKA agentic-coding, AIPerf, Bailian, ShareGPT): closed loop per session, each session a
  "user" whose next turn is issued after its previous answer completed plus its think time (recorded, or
  from `--think-time`), scaled by `--trace-speedup`.

KV layout (`--kv-block-tokens`): 0 = one entry per request holding its new tokens, earlier turns re-read
(the MLPerf tool's layout); N > 0 = entries of N tokens keyed by the prefix hash chain, each request looks
its blocks up in order (present = load, absent = compute and store).
"""

from __future__ import annotations

import glob
import os
import random
from collections.abc import Iterator

from kv_cache.settings.pacing import ThinkTime
from kv_cache.workload.grouping import group_sessions
from kv_cache.workload.qos import draw_qos_level
from kv_cache.workload.request import Phase, RequestPlan, phase_for_context
from kv_cache.workload.traces import (
    ReplayTally,
    TraceError,
    TraceRequest,
    TraceSource,
    kv_block_keys,
    open_trace,
)


def resolve_burst_paths(path: str) -> list[str]:
    """As the MLPerf tool's --burst-trace-path: a file, a directory (all *.csv, sorted) or a glob (sorted)."""
    if any(c in path for c in "*?["):
        files = sorted(glob.glob(path))
    elif os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.csv")))
    else:
        files = [path]
    if not files:
        raise TraceError(path, "no CSV file matched").about("burst_trace_path")
    return files


def open_sources(paths: list[str], fmt: str, max_rows: int, max_conversations: int,
                 **limits: float) -> list[TraceSource]:
    """Open (and check) every trace file before the run starts; a bad file raises TraceError. `limits`:
    open_trace's max_context_tokens, chars_per_token, sharegpt_max_context, sharegpt_max_generation."""
    return [open_trace(p, fmt, max_rows=max_rows, max_conversations=max_conversations, **limits) for p in paths]


class TracePlanner:
    """Builds the request plan of one trace row.

    Replay cycle c > 0 replays the trace as fresh sessions: every key gets a `c<c>:` prefix (new entries
    are written, as the first pass wrote them), and a turn's history is the earlier turns of its session
    in the same cycle only (the trace's own history, never the previous passes')."""

    def __init__(self, kv_block_tokens: int, multi_turn: bool, qos_distribution, qos_profiles, seed: int,
                 namespace: str = "") -> None:
        self.kv_block_tokens = kv_block_tokens
        self.multi_turn = multi_turn
        self.dist = qos_distribution
        self.prios = {level: int(p.priority) for level, p in qos_profiles.items()}
        self.seed = seed
        self.namespace = namespace
        self._history: dict[str, tuple[int, list[str]]] = {}  # session -> (cycle, keys of its turns so far)

    def plan(self, req: TraceRequest, cycle: int = 0) -> RequestPlan:
        rng = random.Random(f"kv-cache-trace-qos:{self.seed}:{cycle}:{req.index}")
        qos = draw_qos_level(rng, self.dist.interactive_probability, self.dist.responsive_threshold)
        user = req.session_id if req.session_id is not None else f"trace_user_{req.index % 1000}"
        common = dict(user_id=user, request_id=f"trace_req_{cycle}_{req.index:08d}", seq=req.index + 1,
                      qos_level=qos, priority=self.prios[qos], generate_tokens=req.output_tokens,
                      conversation_id=req.session_id, turn_number=req.turn)
        namespace = self.namespace if cycle == 0 else f"{self.namespace}c{cycle}:"
        if self.kv_block_tokens > 0:
            blocks = tuple(kv_block_keys(req, self.kv_block_tokens, namespace))
            return RequestPlan(context_tokens=req.input_tokens, phase=Phase.PREFILL,
                               cache_key=blocks[-1][0] if blocks else f"trace_empty_{req.index}",
                               blocks=blocks, **common)
        if req.session_id is not None:
            key = f"{namespace}{req.session_id}_turn_{req.turn}"
            history: tuple[str, ...] = ()
            if self.multi_turn:
                seen_cycle, seen = self._history.get(req.session_id, (cycle, []))
                if seen_cycle != cycle:  # a new pass of this session: its own history starts again
                    seen = []
                self._history[req.session_id] = (cycle, seen)
                history = tuple(seen)
                seen.append(key)
            tokens = max(1, req.new_tokens)
        else:
            key, history, tokens = f"{namespace}trace_req_{req.index:08d}", (), max(1, req.input_tokens)
        return RequestPlan(context_tokens=tokens, phase=phase_for_context(tokens), cache_key=key,
                           history_keys=history, **common)


class OpenLoopTrace:
    """Timestamped rows in order: yields (arrival seconds, plan), over `replay_cycles` passes (0 = endless)."""

    def __init__(self, sources: list[TraceSource], planner: TracePlanner, replay_cycles: int, max_requests: int) -> None:
        self.sources = sources
        self.planner = planner
        self.replay_cycles = replay_cycles
        self.max_requests = max_requests
        self.rows = 0

    def __iter__(self) -> Iterator[tuple[float, RequestPlan]]:
        offset = 0.0
        cycle = 0
        while self.replay_cycles == 0 or cycle < self.replay_cycles:
            produced = 0
            for source in self.sources:
                last = 0.0
                tally = source.replay
                tally.passes += 1
                for req in source:
                    if self.max_requests and self.rows >= self.max_requests:
                        return
                    t = req.arrival_s if req.arrival_s is not None else last
                    last = max(last, t)
                    self.rows += 1
                    produced += 1
                    tally.rows += 1
                    yield offset + last, self.planner.plan(req, cycle)
                tally.passes_complete += 1
                offset += last  # the next file (or pass) continues where this one ended
            if produced == 0:
                return
            cycle += 1


class SessionUser:
    """One trace session replayed closed-loop (a `kv_cache.workload.users.User`)."""

    def __init__(self, turns: list[TraceRequest], planner: TracePlanner, think: ThinkTime, speedup: float,
                 seed: int, tally: ReplayTally | None = None) -> None:
        self.turns = turns
        self.tally = tally  # what is replayed of the session's file (its first row's), when known
        self.planner = planner
        self.think = think
        self.speedup = speedup
        self.user_id = turns[0].session_id or f"session_{turns[0].index}"
        self.rng = random.Random(f"kv-cache-think:{seed}:{self.user_id}")
        self.cursor = 0
        self.cycle = 0
        self.requests_issued = 0

    def _scale(self, seconds: float) -> float:
        return 0.0 if self.speedup == 0 else seconds / self.speedup

    def first_wake_s(self) -> float:
        return self._scale(self.turns[0].arrival_s or 0.0)

    def has_next(self) -> bool:
        return self.cursor < len(self.turns)

    def restart(self) -> None:
        """Next replay cycle: same turns as a fresh session (new keys, its own history only), new QoS draws."""
        self.cursor, self.cycle = 0, self.cycle + 1

    def next_request(self) -> RequestPlan:
        req = self.turns[self.cursor]
        self.cursor += 1
        self.requests_issued += 1
        if self.tally is not None:
            self.tally.session_turn(self.cycle, self.cursor == 1, self.cursor == len(self.turns))
        return self.planner.plan(req, self.cycle)

    def think_time(self) -> float:
        """Pause after the turn just issued (recorded, or per --think-time), divided by the speed-up."""
        recorded = self.turns[self.cursor - 1].think_time_s if self.cursor else None
        return self._scale(self.think.pick(recorded, self.rng))


def load_sessions(sources: list[TraceSource], planner: TracePlanner, think: ThinkTime, speedup: float, seed: int,
                  max_requests: int) -> list[SessionUser]:
    """One closed-loop user per session (sessions may interleave in the file), turns in trace order. What
    each user replays is counted in the `replay` tally of the file its session starts in."""
    first_file: dict[str | None, int] = {}  # session id -> the source its first row came from

    def rows() -> Iterator[TraceRequest]:
        for i, source in enumerate(sources):
            for req in source:
                first_file.setdefault(req.session_id, i)
                yield req

    grouped = group_sessions(rows(), infer_sessionless=False, max_rows=max_requests)
    users = []
    for g in grouped.sessions:
        tally = sources[first_file.get(g.rows[0].session_id, 0)].replay
        tally.sessions += 1
        users.append(SessionUser(g.rows, planner, think, speedup, seed, tally))
    return users
