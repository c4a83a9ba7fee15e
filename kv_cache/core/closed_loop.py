"""Closed-loop users on the event loop: a user issues its next request only after the previous one
completed and its think time elapsed. Shared by the standard run (requests to the cache workers) and the
sessions ladder (turns to engine replicas); only the `issue` callback differs.

The first `active` users take part; a load shape (autoscaler, ladder rung) moves that boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kv_cache.core.events import EventLoop
from kv_cache.workload.users import User

WAKE = "wake"


class ClosedLoop:
    def __init__(self, loop: EventLoop, users: Sequence[User], issue: Callable[[User, int], None],
                 make_user: Callable[[int], User] | None = None) -> None:
        self.loop = loop
        self.users: list[User] = list(users)  # index i = user i; grows when a load shape asks for more
        self.active = len(self.users)
        self.issue = issue
        self.make_user = make_user
        self._index = {u.user_id: i for i, u in enumerate(self.users)}
        self.waiting: set[str] = set()  # users with a pending wake
        loop.handlers[WAKE] = self.on_wake

    def user(self, user_id: str) -> User | None:
        i = self._index.get(user_id)
        return self.users[i] if i is not None else None

    def is_active(self, user: User) -> bool:
        return self._index[user.user_id] < self.active

    def _wake_at(self, user: User, when: int) -> None:
        self.waiting.add(user.user_id)
        self.loop.push(when, WAKE, user)

    def start(self, now: int) -> None:
        """Every active user's first request after its first pause."""
        for user in self.users[:self.active]:
            self._wake_at(user, now + int(user.first_wake_s() * 1e9))

    def on_wake(self, when: int, user: User) -> None:
        self.waiting.discard(user.user_id)
        if self.is_active(user) and user.has_next():
            self.issue(user, when)

    def after(self, user_id: str, when: int) -> None:
        """The user's request ended at `when`: it thinks, then issues its next (if still active)."""
        user = self.user(user_id)
        if user is None or not user.has_next():
            return
        if self.is_active(user) and user.user_id not in self.waiting:
            self._wake_at(user, when + int(user.think_time() * 1e9))

    def set_active(self, target: int, now: int, wake: bool = True) -> None:
        """Start or stop users so that `target` are active (a load shape's decision, applied)."""
        while len(self.users) < target and self.make_user is not None:
            user = self.make_user(len(self.users))
            self._index[user.user_id] = len(self.users)
            self.users.append(user)
        target = min(target, len(self.users))
        if target > self.active and wake:
            for user in self.users[self.active:target]:
                if user.user_id not in self.waiting:
                    self._wake_at(user, now + int(user.think_time() * 1e9))
        self.active = target

    def all_done(self) -> bool:
        """Every active user ran out of requests (synthetic users never do)."""
        return all(not u.has_next() for u in self.users[:self.active])

    def restart(self, now: int) -> None:
        """Next replay cycle: every active user starts again from its first request."""
        for user in self.users[:self.active]:
            user.restart()
            self._wake_at(user, now + int(user.first_wake_s() * 1e9))
