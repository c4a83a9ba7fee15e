"""Synthetic users (MLPerf personas) that decide, from their own seeded generator, what to ask next.

Users are closed-loop: the driver asks a user for its next request only after the previous one has
completed and the user's think time has elapsed. No thread per user.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from kv_cache.workload.conversation import Conversation, ConversationManager
from kv_cache.workload.prefix import SystemPrefix
from kv_cache.workload.qos import draw_qos_level
from kv_cache.workload.rag import RagCorpus
from kv_cache.workload.request import Phase, RequestPlan, phase_for_context
from kv_cache.workload.traces import TraceRequest, kv_block_keys

PERSONAS = ("chatbot", "coding", "document")


class User(Protocol):
    """What the driver asks of a closed-loop user (synthetic persona, trace session, sessions slot)."""

    @property
    def user_id(self) -> str: ...

    def next_request(self): ...  # the user's next request (RequestPlan, or an engine turn)

    def think_time(self) -> float: ...  # seconds to pause after a request completed

    def has_next(self) -> bool: ...  # False once the user has nothing left to ask

    def first_wake_s(self) -> float: ...  # seconds before the user's first request

    def restart(self) -> None: ...  # start again from the first request (trace replay cycles)


@dataclass(frozen=True, slots=True)
class UserProfile:
    user_id: str
    persona: str
    qos_level: str
    priority: int
    context_length: int
    generation_length: int
    think_time: float


def user_rng(seed: int, user_id: str) -> random.Random:
    """The user's private generator: derived from the run seed and the user id only."""
    return random.Random(f"kv-cache:{seed}:{user_id}")


def generate_profiles(num_users: int, config, seed: int, first_index: int = 0) -> list[UserProfile]:
    """MLPerf-compatible draws: persona uniform, QoS by the configured distribution,
    context/generation lengths and think time drawn from the persona's ranges."""
    prios = {level: int(p.priority) for level, p in config.qos_profiles.items()}
    dist = config.qos_distribution
    profiles = []
    for i in range(first_index, first_index + num_users):
        user_id = f"user_{i:04d}"
        rng = random.Random(f"kv-cache-profile:{seed}:{user_id}")
        persona = rng.choice(PERSONAS)
        tmpl = config.user_templates[persona]
        qos = draw_qos_level(rng, dist.interactive_probability, dist.responsive_threshold)
        profiles.append(
            UserProfile(
                user_id=user_id,
                persona=persona,
                qos_level=qos,
                priority=prios[qos],
                context_length=rng.randint(*tmpl.context_range),
                generation_length=rng.randint(*tmpl.generation_range),
                think_time=rng.uniform(*tmpl.think_time_range),
            )
        )
    return profiles


class SyntheticUser:
    """One simulated user. Not thread-safe: the driver calls it from its scheduler thread only."""

    def __init__(
        self,
        profile: UserProfile,
        seed: int,
        conversations: ConversationManager | None,
        end_conversation_probability: float,
        prefixes: tuple[SystemPrefix, ...],
        prefix_probability: float,
        decode_only_entries: int = 0,
        rag: RagCorpus | None = None,
        rag_probability: float = 0.0,
        kv_block_tokens: int = 0,
    ) -> None:
        self.profile = profile
        self.rng = user_rng(seed, profile.user_id)
        self._conversations = conversations
        self._end_probability = end_conversation_probability
        self._prefixes = prefixes
        self._prefix_probability = prefix_probability if prefixes else 0.0
        self._decode_only_entries = decode_only_entries
        self._kv_block_tokens = kv_block_tokens
        self._rag = rag
        self._rag_probability = rag_probability if rag is not None else 0.0
        self._conversation: Conversation | None = None
        self._conversations_started = 0
        self.requests_issued = 0

    @property
    def user_id(self) -> str:
        return self.profile.user_id

    def think_time(self) -> float:
        """Pause before the next request: think_time x uniform(0.8, 1.2), as in the MLPerf tool."""
        return self.profile.think_time * self.rng.uniform(0.8, 1.2)

    def first_wake_s(self) -> float:
        """A synthetic user thinks before its first request too (one draw from its generator)."""
        return self.think_time()

    def has_next(self) -> bool:
        return True  # a synthetic user never runs out

    def restart(self) -> None:
        """Nothing to replay: the user's stream simply continues."""

    def next_request(self) -> RequestPlan:
        rng = self.rng
        p = self.profile
        self.requests_issued += 1
        seq = self.requests_issued

        conv = None
        if self._conversations is not None:
            conv = self._conversation
            if conv is not None and (
                rng.random() < self._end_probability
                or conv.turn_number >= self._conversations.max_turns_per_conv
                or not self._conversations.is_live(conv)
            ):
                self._conversations.end(conv)
                conv = None
            if conv is None:
                self._conversations_started += 1
                conv = self._conversations.start(p.user_id, self._conversations_started)
            self._conversation = conv

        context = rng.randint(max(1, p.context_length // 4), p.context_length)
        generate = rng.randint(max(1, p.generation_length // 4), p.generation_length)

        prefix = None
        if self._prefix_probability > 0 and rng.random() < self._prefix_probability:
            prefix = rng.choice(self._prefixes)
            context = max(1, context - prefix.tokens)

        rag_chunks: tuple[tuple[str, int], ...] = ()
        if self._rag_probability > 0 and rng.random() < self._rag_probability:
            rag_chunks = self._rag.retrieve(rng)
        decode_key = (f"prepop_{rng.randrange(self._decode_only_entries)}"
                      if self._decode_only_entries else None)

        history_tokens = conv.cumulative_tokens if conv is not None else 0
        if conv is not None:
            turn, key, history = self._conversations.add_turn(conv, context, generate)
            conv_id = conv.conversation_id
        else:
            turn, key, history, conv_id = 1, f"{p.user_id}_req_{seq:06d}", (), None

        blocks: tuple[tuple[str, int], ...] = ()
        if self._kv_block_tokens > 0:
            # Block layout: the request's context is the conversation so far plus the new prompt, stored as
            # prefix-chained blocks, so earlier turns' blocks are reused instead of re-read as whole entries.
            session = conv_id or f"{p.user_id}_req_{seq:06d}"
            req = TraceRequest(index=seq, session_id=session, turn=turn, arrival_s=None, think_time_s=None,
                               input_tokens=history_tokens + context, new_tokens=context, output_tokens=generate,
                               hash_ids=None, block_tokens=None)
            blocks = tuple(kv_block_keys(req, self._kv_block_tokens))
            history = ()

        return RequestPlan(
            user_id=p.user_id,
            request_id=f"req_{p.user_id}_{seq:06d}",
            seq=seq,
            qos_level=p.qos_level,
            priority=p.priority,
            context_tokens=context,
            generate_tokens=generate,
            phase=Phase.PREFILL if blocks else phase_for_context(context),  # blocks are loaded once, no re-reads
            cache_key=key,
            conversation_id=conv_id,
            turn_number=turn,
            history_keys=history,
            prefix_key=prefix.key if prefix else None,
            prefix_tokens=prefix.tokens if prefix else 0,
            decode_key=decode_key,
            rag_chunks=rag_chunks,
            blocks=blocks,
        )
