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

__all__ = ["ABANDON_IO", "STOP_SIGNALS", "catch_stop_signals", "exit_follows", "ignore_to_exit",
           "process_exits_after_run"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Set by a run's stop signal (Ctrl-C in the window, or the second one after it): the remote tiers' operations
# waiting on a server give up at once (storage/remote.py RunDeadline), so a frozen server cannot hold a stop;
# cleared when a run takes the signals over (catch_stop_signals).
ABANDON_IO = threading.Event()

_EXIT_FOLLOWS = [False]  # set by the process's entry point: the run is the last thing before the exit


def exit_follows() -> None:
    """The process's entry point (launcher.py) says the process exits once the command returns: a run then
    ignores stop signals from its results to the exit (`ignore_to_exit`), instead of putting back handlers
    that the interpreter's shutdown replaces with SIG_DFL (a Ctrl-C in that moment ended a finished run
    with status -2). Called in-process (tests, a library), a run puts the previous handlers back."""
    _EXIT_FOLLOWS[0] = True


def process_exits_after_run() -> bool:
    return _EXIT_FOLLOWS[0]


def ignore_to_exit(signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    """Ignore the stop signals from here to the process's exit (main thread only); a SIGHUP already
    ignored (nohup) stays so."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


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
