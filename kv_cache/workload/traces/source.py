"""``open_trace``: a streaming, re-iterable source of ``TraceRequest`` for any supported trace."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import formats
from ._options import Options
from .detect import detect_format
from .model import ReplayTally, TraceError, TraceRequest, TraceStats
from .tokenizer import CHOICES


class TraceSource:
    """An iterable of ``TraceRequest`` read lazily from the trace (one line / CSV row / array item / WEKA
    file at a time). Each iteration re-reads the trace and starts a fresh ``stats`` (filled as it goes;
    final once the iteration ends). A pass that yields no row raises TraceError.

    ``whole_stats`` is what the file holds, whatever pass the run was in when it stopped: the first pass
    read to the end, else the pass that read furthest (its ``complete`` false). ``replay`` is what the
    replay sent of the file over every pass (updated by the replayer, workload/replay.py).
    """

    def __init__(self, path: Path, fmt: str, max_rows: int, options: Options) -> None:
        self.path = path
        self.format = fmt
        self.max_rows = max_rows
        self.options = options
        self.block_tokens: int | None = formats.get(fmt).block_tokens
        self.stats = TraceStats(format=fmt, path=str(path), block_tokens=self.block_tokens)
        self._whole: TraceStats | None = None  # the best pass before the current one (whole_stats)
        self.replay = ReplayTally()

    @property
    def whole_stats(self) -> TraceStats:
        """The file's own rows and skips: the first pass read to its end, else the one that read furthest."""
        best = self._whole
        current = self.stats
        if best is None or (not best.complete and (current.complete or current.read > best.read)):
            return current
        return best

    def summary(self) -> dict[str, Any]:
        """The file's stats (``whole_stats``) with what was replayed of it over the passes (``replayed``)."""
        return {**self.whole_stats.to_dict(), "replayed": self.replay.to_dict()}

    def __repr__(self) -> str:
        return f"TraceSource({str(self.path)!r}, format={self.format!r}, max_rows={self.max_rows})"

    def __iter__(self) -> Iterator[TraceRequest]:
        self._whole = self.whole_stats  # (the pass before this one, when it is the best so far)
        stats = TraceStats(format=self.format, path=str(self.path), block_tokens=self.block_tokens)
        self.stats = stats
        reader = formats.get(self.format).read(self.path, stats, self.options)
        sessions: set[str] = set()
        index = 0
        try:
            limit = self.options.max_context_tokens
            for row in reader:
                if limit and row.input_tokens + row.output_tokens > limit:
                    stats.skip("beyond_context_window", malformed=False)
                    continue
                req = TraceRequest(index, *row)
                index += 1
                stats.rows = index
                if req.session_id is not None and req.session_id not in sessions:
                    sessions.add(req.session_id)
                    stats.sessions = len(sessions)
                if req.turn > stats.turns_max:
                    stats.turns_max = req.turn
                stats.total_input_tokens += req.input_tokens
                stats.total_new_tokens += req.new_tokens
                stats.total_output_tokens += req.output_tokens
                if req.input_tokens > stats.max_input_tokens:
                    stats.max_input_tokens = req.input_tokens
                if req.hash_ids is not None:
                    stats.total_hash_blocks += len(req.hash_ids)
                if req.block_tokens is not None and index == 1:
                    stats.block_tokens = self.block_tokens = req.block_tokens
                if req.arrival_s is not None:
                    if stats.first_arrival_s is None or req.arrival_s < stats.first_arrival_s:
                        stats.first_arrival_s = req.arrival_s
                    if stats.last_arrival_s is None or req.arrival_s > stats.last_arrival_s:
                        stats.last_arrival_s = req.arrival_s
                yield req
                if self.max_rows and index >= self.max_rows:
                    return
            stats.complete = True
        except OSError as exc:
            raise TraceError(self.path, f"read error ({exc.strerror or exc})") from None
        finally:
            reader.close()
        if index == 0:
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats.skipped_reasons.items()))
            raise TraceError(self.path, f"no valid {self.format} rows" + (f" (skipped {reasons})" if reasons else ""))

    def check(self) -> None:
        """Read up to the first valid row: raises TraceError now for a trace that has none."""
        it = iter(self)
        try:
            next(it)
        except StopIteration:  # pragma: no cover - __iter__ raises before stopping empty
            raise TraceError(self.path, f"no valid {self.format} rows") from None
        finally:
            it.close()


def open_trace(
    path: str | os.PathLike,
    fmt: str = "auto",
    max_rows: int = 0,
    tokenizer: str = "auto",
    max_conversations: int = 0,
    lookahead_rows: int = 4096,
    max_context_tokens: int = 0,
    chars_per_token: float = 4.0,
    sharegpt_max_context: int = 0,
    sharegpt_max_generation: int = 0,
) -> TraceSource:
    """Open a trace for streaming as ``TraceRequest`` rows.

    ``fmt``: "auto" (``detect_format``) or the name of a registered format (formats.py). ``max_rows``: stop after that many rows (0 = all). ``tokenizer``: auto | tiktoken | chars
    (ShareGPT only). ``max_conversations``: keep only the first N conversations/sessions (ShareGPT items,
    WEKA files, AIPerf/Bailian/BurstGPT sessions; 0 = all). ``lookahead_rows``: AIPerf think-time
    look-ahead. ``max_context_tokens``: rows whose input + output tokens exceed it are rejected and counted
    (``beyond_context_window``; 0 = no limit). ``chars_per_token``, ``sharegpt_max_context`` and
    ``sharegpt_max_generation``: the config's ``sharegpt`` section (ShareGPT only). The trace is checked up to its first valid row before returning, so a missing,
    unreadable, empty, unrecognised or row-less trace raises TraceError (one line naming the file) here,
    before any run starts.
    """
    p = Path(path)
    if fmt == "auto":
        fmt = detect_format(p)
    else:
        formats.check_known(p, fmt)
    if not p.exists():
        raise TraceError(p, "no such file or directory")
    if not isinstance(max_rows, int) or max_rows < 0:
        raise TraceError(p, f"max_rows must be a non-negative integer, got {max_rows!r}")
    if not isinstance(max_conversations, int) or max_conversations < 0:
        raise TraceError(p, f"max_conversations must be a non-negative integer, got {max_conversations!r}")
    if tokenizer not in CHOICES:
        raise TraceError(p, f"unknown tokenizer {tokenizer!r} (expected one of {', '.join(CHOICES)})")
    if p.is_dir() and not formats.get(fmt).directory:
        readers = " or ".join(f.name for f in formats.all_formats() if f.directory)
        raise TraceError(p, f"is a directory (only the {readers} format reads a directory), not a {fmt} file")
    if not isinstance(max_context_tokens, int) or max_context_tokens < 0:
        raise TraceError(p, f"max_context_tokens must be a non-negative integer, got {max_context_tokens!r}")
    options = Options(max_conversations, tokenizer, lookahead_rows, max_context_tokens, float(chars_per_token),
                      sharegpt_max_context, sharegpt_max_generation)
    source = TraceSource(p, fmt, max_rows, options)
    source.check()
    return source
