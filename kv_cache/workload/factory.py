"""The run's workload from its settings: synthetic users (built on demand, deterministically), or a
replayed trace (closed-loop sessions, or timestamped arrivals for the open loop)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kv_cache.settings.pacing import ThinkTime
from kv_cache.workload.arrivals import PoissonArrivals
from kv_cache.workload.conversation import ConversationManager
from kv_cache.workload.prefix import build_system_prefixes
from kv_cache.workload.rag import RagCorpus
from kv_cache.workload.replay import (
    OpenLoopTrace,
    SessionUser,
    TracePlanner,
    load_sessions,
    open_sources,
)
from kv_cache.workload.traces import TraceSource, detect_format
from kv_cache.workload.traces import formats as trace_formats
from kv_cache.workload.users import SyntheticUser, generate_profiles

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.settings.run import RunSettings

__all__ = ["PREPOPULATION_PER_USER", "TraceWorkload", "UserFactory", "build_trace_workload", "open_trace_sources",
           "poisson_retimed"]

PREPOPULATION_PER_USER = 10  # decode-only: entries pre-populated per user (the MLPerf tool's count)


class UserFactory:
    """Builds user i deterministically (the autoscaler may ask for more users than the run started with)."""

    def __init__(self, settings: RunSettings, rag: RagCorpus | None) -> None:
        cfg = settings.config
        self.settings = settings
        self.seed = settings.effective_seed
        self.conversations = (ConversationManager(cfg.conversation.max_conversations,
                                                  cfg.conversation.max_turns_per_conv)
                              if settings.workload.multi_turn else None)
        self.prefixes = (build_system_prefixes(cfg.prefix_cache.min_prefix_length,
                                               cfg.prefix_cache.max_prefix_entries)
                         if settings.workload.prefix_caching else ())
        self.rag = rag
        self.decode_only_entries = settings.workload.num_users * PREPOPULATION_PER_USER if settings.driver.decode_only else 0

    def __call__(self, index: int) -> SyntheticUser:
        return self.build(index, 1)[0]

    def build(self, first: int, count: int) -> list[SyntheticUser]:
        cfg = self.settings.config
        return [
            SyntheticUser(p, self.seed, self.conversations, cfg.conversation.end_conversation_probability,
                          self.prefixes, cfg.prefix_cache.system_prompt_hit_probability,
                          decode_only_entries=self.decode_only_entries, rag=self.rag,
                          rag_probability=cfg.rag.request_probability,
                          kv_block_tokens=self.settings.workload.kv_block_tokens)
            for p in generate_profiles(count, cfg, self.seed, first_index=first)
        ]


@dataclass
class TraceWorkload:
    """What drives a trace run: closed-loop sessions, or timestamped arrivals (open loop)."""

    sources: list
    sessions: list[SessionUser] | None = None
    arrivals: object = None
    speedup: float = 1.0

    @property
    def format(self) -> str:
        return self.sources[0].format


def open_trace_sources(settings: RunSettings) -> list[TraceSource]:
    """Open and check every trace file of the run (raises TraceError); the run opens them only here."""
    paths, fmt = list(settings.workload.trace_paths), settings.workload.trace_format
    if fmt == "auto":  # detected first: the conversation limit applies to ShareGPT only
        fmt = detect_format(paths[0])
    max_conv = settings.workload.max_conversations if fmt == "sharegpt" else 0
    cfg = settings.config
    return open_sources(paths, fmt, 0, max_conv, max_context_tokens=cfg.validation_limits.max_trace_context_tokens,
                        chars_per_token=cfg.sharegpt.chars_per_token_estimate,
                        sharegpt_max_context=cfg.sharegpt.max_context_tokens,
                        sharegpt_max_generation=cfg.sharegpt.max_generation_tokens)


def build_trace_workload(settings: RunSettings, sources: list[TraceSource] | None = None) -> TraceWorkload:
    """The trace workload over `sources` (opened now when not given)."""
    cfg = settings.config
    sources = open_trace_sources(settings) if sources is None else sources
    planner = TracePlanner(settings.workload.kv_block_tokens, settings.workload.multi_turn, cfg.qos_distribution, cfg.qos_profiles,
                           settings.effective_seed)
    think = settings.workload.think_time or ThinkTime()
    if settings.driver.request_rate > 0:  # every source can be driven open-loop at a Poisson rate
        rows = OpenLoopTrace(sources, planner, settings.workload.replay_cycles, settings.driver.max_requests)
        return TraceWorkload(sources, arrivals=poisson_retimed(rows, settings.driver.request_rate, settings.effective_seed))
    if trace_formats.get(sources[0].format).sessions:  # rows form sessions: one user per session
        sessions = load_sessions(sources, planner, think, settings.workload.trace_speedup, settings.effective_seed,
                                 settings.driver.max_requests)
        return TraceWorkload(sources, sessions=sessions, speedup=settings.workload.trace_speedup)
    return TraceWorkload(sources, arrivals=OpenLoopTrace(sources, planner, settings.workload.replay_cycles,
                                                         settings.driver.max_requests),
                         speedup=settings.workload.trace_speedup)


def poisson_retimed(rows: Iterable[tuple[Any, Any]], rate: float, seed: int) -> Iterator[tuple[float, Any]]:
    """The rows in order, re-timed as a Poisson process of `rate` per second."""
    return PoissonArrivals(rate, seed).retime(rows)
