"""The signals that end a run the way Ctrl-C does, and how a run takes them over.

SIGINT, SIGTERM and SIGHUP (a terminal that hung up: an ssh session lost) stop a run with what it
measured written. A SIGHUP that the process was started ignoring (`nohup kv-cache ...`, whose whole
point is to outlive the terminal) stays ignored: the run goes on to the end of its window.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ABANDON_IO", "STOP_SIGNALS", "catch_stop_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Set by a run's stop signal (Ctrl-C in the window, or the second one after it): the remote tiers' operations
# waiting on a server give up at once (storage/remote.py RunDeadline), so a frozen server cannot hold a stop;
# cleared when a run takes the signals over (catch_stop_signals).
ABANDON_IO = threading.Event()


def catch_stop_signals(handler: Callable[..., Any] | int,
                       signals: tuple[int, ...] = STOP_SIGNALS) -> dict[int, Any]:
    """Install `handler` for each of `signals` (main thread only) and return the previous handlers, to
    restore; a SIGHUP ignored at the time (nohup) is left ignored and not in the returned dict."""
    previous: dict[int, Any] = {}
    ABANDON_IO.clear()
    for sig in signals:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, handler)
    return previous
