"""Real-trace workloads: parsers that turn public LLM serving traces into one normalized, streamable
request model (``TraceRequest``), plus block-level helpers for KV-cache replay.

Formats: Mooncake and AIPerf/Bailian JSON Lines, WEKA agentic-coding JSON (file or directory), BurstGPT
CSV, ShareGPT JSON. See each reader module's docstring for the format's fields and the choices made.
"""

from __future__ import annotations

from .blocks import block_reuse, kv_block_keys
from .detect import detect_format
from .model import BLOCK_TOKENS, FORMATS, TraceError, TraceRequest, TraceStats
from .source import TraceSource, open_trace

__all__ = [
    "BLOCK_TOKENS",
    "FORMATS",
    "TraceError",
    "TraceRequest",
    "TraceSource",
    "TraceStats",
    "block_reuse",
    "detect_format",
    "kv_block_keys",
    "open_trace",
]
