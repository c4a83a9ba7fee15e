"""The settle waits around a run (--start-delay / --end-delay, the Rules' settle time: 90 s under
mlperf_wrapper.py, 0 for the plain tool).

Both waits are interruptible. A Ctrl-C during the start delay ends the command cleanly before anything ran
(nothing created, nothing to lose: exit 130). A Ctrl-C during the end delay only cuts the wait short: the
run's results are already written, and its exit status stands.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from kv_cache.errors import ExitCode

__all__ = ["around"]


WAIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what ends a wait (Ctrl-C, a harness's kill)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt for the wait, whatever they were before, which is put back
    after: once its results are written a run ignores stop signals to the process's exit (host/signals.py
    ignore_to_exit), and the end delay's "Ctrl-C ends the wait" then waited its 90 s out under mlperf_wrapper."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in WAIT_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait(seconds: float, what: str, out: TextIO, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait `seconds` (none when 0), saying so on `out`; False when a Ctrl-C (or SIGTERM) cut the wait short."""
    if seconds <= 0:
        return True
    try:  # (from the announcement on: a Ctrl-C right after it is the wait's too)
        with _interruptible():
            out.write(f"Waiting {seconds:g} s {what} (the Rules' settle time; Ctrl-C ends the wait)\n")
            out.flush()
            sleep(seconds)
    except KeyboardInterrupt:
        return False
    return True


def around(run: Callable[[], int], start_delay: float, end_delay: float, out: TextIO | None = None,
           err: TextIO | None = None, sleep: Callable[[float], None] = time.sleep, prog: str = "kv-cache") -> int:
    """`run()` between the two waits; its exit status (130 when the start delay was interrupted)."""
    out, err = out or sys.stdout, err or sys.stderr
    if not wait(start_delay, "before the run (--start-delay)", out, sleep):
        err.write(f"{prog}: interrupted during the start delay; nothing was run\n")
        return int(ExitCode.INTERRUPTED)
    code = run()
    if not wait(end_delay, "after the run (--end-delay)", out, sleep):
        err.write(f"{prog}: end delay cut short by an interrupt; the run's results are written and stand\n")
    return code
