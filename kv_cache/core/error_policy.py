"""One storage-error policy for a run: a fatal error (no space, read-only, no permission) stops the run at
once; other errors left after the cache's retries are tolerated up to a threshold, then stop it too.

The policy only decides; the cache counts every error per tier and operation and the driver's event loop
turns the alarm into the stop reason "storage error" (exit 3, full results written).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kv_cache.storage.faults import StorageFault, is_fatal


class ErrorPolicy:
    """Called by the cache with every storage error left after retries (any thread)."""

    def __init__(self, max_errors: int, alarm: Callable[[str], None]) -> None:
        """`max_errors`: storage errors tolerated before the run stops (0: stop at the first)."""
        self.max_errors = max_errors
        self.alarm = alarm
        self.errors = 0
        self._lock = threading.Lock()

    def __call__(self, fault: StorageFault) -> None:
        with self._lock:
            self.errors += 1
            n = self.errors
        if is_fatal(fault):
            self.alarm(str(fault))
        elif n > self.max_errors:
            self.alarm(f"{n} storage errors, more than the {self.max_errors} tolerated "
                       f"(storage.max_storage_errors); last: {fault}")
