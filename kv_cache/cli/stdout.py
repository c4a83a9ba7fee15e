"""stdout and stderr that a gone reader cannot stop: `kv-cache ... | head -1` still runs its whole window.

A pipe whose reader has gone makes every write fail with EPIPE (Python ignores SIGPIPE, so it is a
BrokenPipeError, raised wherever the write or flush happened: in the banner, between two rungs, inside a
run). Left alone, that error would end the benchmark part-way and lose its results. `TolerantStream`
wraps the stream: on EPIPE it marks itself closed, points the file descriptor at /dev/null (so neither a
later flush, the interpreter's final one included, nor a child process that inherits it fails again), and
drops every later write. The command goes on, measures, writes its files and removes its run files; the
CLI then turns "stdout was closed" into status 141 (`kv_cache/cli/exits.py`). A terminal that hung up
(its writes fail with EIO) is a reader gone too. A closed stderr is treated the same way (logging, progress lines and error messages are dropped) and does not change the status.

Only the standard library here (the launcher's fallback imports nothing heavy either).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["CLOSED_PIPE", "StdStreams", "TolerantStream", "install", "point_at_devnull", "tolerant_stdio"]

# Exit status when stdout's reader went away (128 + SIGPIPE, as for a process the signal ended).
CLOSED_PIPE = 128 + int(getattr(signal, "SIGPIPE", 13))


def point_at_devnull(stream: Any) -> None:
    """Point the file descriptor under `stream` at /dev/null; nothing when it has none (a StringIO)."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):  # not a real file, or already closed
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


# EPIPE: a pipe's reader went away. EIO: the terminal hung up (an ssh session lost: every later write to
# it fails so), which also sends the SIGHUP that ends a run as Ctrl-C does; its results must still be
# written, so the output after it is dropped the same way instead of ending the command part-way.
_GONE = (errno.EPIPE, errno.EIO)


def _reader_gone(exc: BaseException) -> bool:
    return isinstance(exc, BrokenPipeError) or isinstance(exc, OSError) and exc.errno in _GONE


class TolerantStream:
    """A text stream that drops its output, instead of raising, once its reader has gone (EPIPE).

    Everything else (fileno, isatty, encoding, buffer, ...) is the wrapped stream's, so rich on a terminal,
    logging handlers and `print(file=...)` see the stream they expect."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream
        self.reader_gone = False  # True after a write or flush met EPIPE: later output is dropped

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self.wrapped.write(text)
            except OSError as exc:
                self._on_error(exc)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.reader_gone:
            return
        try:
            self.wrapped.flush()
        except OSError as exc:
            self._on_error(exc)

    def _on_error(self, exc: OSError) -> None:
        if not _reader_gone(exc):
            raise exc
        self.reader_gone = True
        point_at_devnull(self.wrapped)
        with contextlib.suppress(OSError, ValueError):
            self.wrapped.flush()  # what was still buffered goes to /dev/null, never again to the pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


@dataclass
class StdStreams:
    """The process's tolerant stdout and stderr while `tolerant_stdio` is in force."""

    stdout: TolerantStream
    stderr: TolerantStream

    @property
    def stdout_closed(self) -> bool:
        """Whether stdout's reader went away (after a last flush, so that buffered output is tried)."""
        self.stdout.flush()
        return self.stdout.reader_gone


def _tolerant(stream: TextIO | None) -> TolerantStream:
    if isinstance(stream, TolerantStream):
        return stream
    if stream is None:  # started with the descriptor closed (`>&-`): output goes nowhere, and a file
        stream = open(os.devnull, "w")  # noqa: SIM115  opened later cannot land on that descriptor
    return TolerantStream(stream)


def install() -> StdStreams:
    """Make sys.stdout and sys.stderr tolerant of a gone reader for the rest of the process (a process
    the run spawns calls this first thing); idempotent."""
    sys.stdout, sys.stderr = _tolerant(sys.stdout), _tolerant(sys.stderr)
    return StdStreams(sys.stdout, sys.stderr)


@contextlib.contextmanager
def tolerant_stdio() -> Iterator[StdStreams]:
    """sys.stdout and sys.stderr tolerant of a gone reader inside the block; the previous ones after it."""
    previous = sys.stdout, sys.stderr
    try:
        yield install()
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stdout.flush()
        sys.stdout, sys.stderr = previous
