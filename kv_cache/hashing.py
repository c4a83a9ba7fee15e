"""Stable ids from text: the same on every machine and in every process (unlike Python's `hash()`)."""

from __future__ import annotations

import hashlib


def stable_id(text: str) -> int:
    """64-bit id of `text`: blake2b (8-byte digest) of its UTF-8, little-endian."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
