"""Real-trace workloads: parsers that turn public LLM serving traces into one normalized, streamable
request model (``TraceRequest``), plus block-level helpers for KV-cache replay.

Formats: Mooncake and AIPerf/Bailian JSON Lines, WEKA agentic-coding JSON (file or directory), BurstGPT
CSV, ShareGPT JSON, each a reader module that registers its descriptor (formats.py). See each reader
module's docstring for the format's fields and the choices made.
"""

from __future__ import annotations

from . import formats
from .blocks import block_reuse, kv_block_keys
from .detect import detect_format
from .model import ReplayTally, TraceError, TraceRequest, TraceStats
from .source import TraceSource, open_trace

__all__ = [
    "BLOCK_TOKENS",
    "FORMATS",
    "ReplayTally",
    "TraceError",
    "TraceRequest",
    "TraceSource",
    "TraceStats",
    "block_reuse",
    "detect_format",
    "formats",
    "kv_block_keys",
    "open_trace",
]


def __getattr__(name: str):
    """FORMATS (the registered format names) and BLOCK_TOKENS (each one's tokens per hash id), read from
    the registry when first asked for."""
    if name == "FORMATS":
        return formats.names()
    if name == "BLOCK_TOKENS":
        return {f.name: f.block_tokens for f in formats.all_formats()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
