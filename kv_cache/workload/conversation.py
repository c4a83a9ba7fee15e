"""Multi-turn conversation state: which earlier turns a new turn re-reads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class Conversation:
    conversation_id: str
    user_id: str
    turn_number: int = 0
    turn_keys: list[str] = field(default_factory=list)
    cumulative_tokens: int = 0


class ConversationManager:
    """Bounded LRU of live conversations (config `conversation.max_conversations`).

    Evicting a conversation never breaks its user: the user simply starts a new conversation on its next
    turn.
    """

    def __init__(self, max_conversations: int, max_turns_per_conv: int) -> None:
        self.max_conversations = max(1, max_conversations)
        self.max_turns_per_conv = max_turns_per_conv
        self._live: OrderedDict[str, Conversation] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0

    def start(self, user_id: str, ordinal: int) -> Conversation:
        conv = Conversation(conversation_id=f"conv_{user_id}_{ordinal}", user_id=user_id)
        with self._lock:
            while len(self._live) >= self.max_conversations:
                self._live.popitem(last=False)
                self.evicted += 1
            self._live[conv.conversation_id] = conv
        return conv

    def is_live(self, conv: Conversation) -> bool:
        with self._lock:
            return conv.conversation_id in self._live

    def end(self, conv: Conversation) -> None:
        with self._lock:
            self._live.pop(conv.conversation_id, None)

    def add_turn(self, conv: Conversation, user_tokens: int, assistant_tokens: int) -> tuple[int, str, tuple[str, ...]]:
        """Record a new turn; returns (turn number, its cache key, keys of all earlier turns)."""
        with self._lock:
            if conv.conversation_id in self._live:
                self._live.move_to_end(conv.conversation_id)
        previous = tuple(conv.turn_keys)
        conv.turn_number += 1
        key = f"{conv.conversation_id}_turn_{conv.turn_number}"
        conv.turn_keys.append(key)
        conv.cumulative_tokens += user_tokens + assistant_tokens
        return conv.turn_number, key, previous

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)
