"""`--tier-bandwidth` and `--tier-latency`: which offload tiers are shaped, and to what (the one parser of
both flags, for the standard run and for `sessions`).

Each flag takes either a bare number, which shapes the storage tier alone (the meaning it always had), or a
per-tier list such as ``cpu=50,storage=8``. The tiers are the offload tiers: ``cpu`` (alias ``dram``, the
name `sessions` gives it) and ``storage``; the GPU tier is not shaped. A value is a finite number >= 0
(0 = that tier unshaped); a tier named twice, an unknown tier or a value that is not a number is refused.
The shaping itself is storage/shaped.py's (a ShapedStore per shaped tier).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kv_cache.errors import UsageError

__all__ = ["BANDWIDTH_HELP", "LATENCY_HELP", "SHAPED_TIERS", "TierSpecError", "shaping_fields", "spec_errors",
           "tier_values"]

SHAPED_TIERS = ("cpu", "storage")  # the offload tiers a run can shape, by their statistics names
_ALIASES = {"cpu": "cpu", "dram": "cpu", "storage": "storage"}
BANDWIDTH_HELP = ("Shape the offload tiers' real reads and writes to this many GB/s (10^9 bytes/s) per direction, "
                  "a token bucket each for reads and writes; the sleeps count as I/O time. A bare number shapes "
                  "the storage tier; TIER=GB/s,... shapes each tier named (cpu or dram, storage), e.g. "
                  "cpu=50,storage=8. 0 = unshaped.")
LATENCY_HELP = ("Add this many ms to every read and write operation of the offload tiers (counted as I/O time): a "
                "bare number for the storage tier, or TIER=ms,... (cpu or dram, storage).")
# StorageSettings field of each (flag, tier): a bare number keeps meaning the storage tier's fields
_FIELDS = {("--tier-bandwidth", "storage"): "tier_bandwidth_gbps", ("--tier-latency", "storage"): "tier_latency_ms",
           ("--tier-bandwidth", "cpu"): "cpu_tier_bandwidth_gbps", ("--tier-latency", "cpu"): "cpu_tier_latency_ms"}


class TierSpecError(UsageError):
    """A --tier-bandwidth / --tier-latency value that is not a number nor a TIER=VALUE list (one line)."""


def _number(flag: str, text: Any, tier: str | None = None) -> float:
    where = f" ({tier} tier)" if tier else ""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise TierSpecError(f"{flag}{where} must be a number or TIER=VALUE,... (tiers: cpu or dram, storage), "
                            f"got {text!r}") from None
    if not math.isfinite(value):
        raise TierSpecError(f"{flag}{where} must be finite, got {value}")
    if value < 0:
        raise TierSpecError(f"{flag}{where} cannot be negative, got {value:g}")
    return value


def _tier(flag: str, name: str) -> str:
    key = name.strip().lower()
    if key not in _ALIASES:
        what = "the GPU tier is not shaped" if key == "gpu" else f"unknown tier {name.strip()!r}"
        raise TierSpecError(f"{flag}: {what}; shape cpu (or dram) and storage, e.g. {flag} cpu=50,storage=8")
    return _ALIASES[key]


def tier_values(flag: str, value: Any) -> dict[str, float]:
    """{tier: value} of one flag's value: a number (or a numeric string) is the storage tier's; a string
    ``TIER=VALUE,...`` names each tier (``dram`` = ``cpu``); a mapping is taken as such; None: no tier. Raises
    TierSpecError (one line naming `flag`) for anything else (module docstring)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str) and "=" in value:
        items = []
        for part in value.split(","):
            name, eq, number = part.partition("=")
            if not eq or not name.strip():
                raise TierSpecError(f"{flag}: each item of a per-tier list is TIER=VALUE, got {part.strip()!r}")
            items.append((name, number.strip()))
    else:
        return {"storage": _number(flag, value.strip() if isinstance(value, str) else value)}
    out: dict[str, float] = {}
    for name, number in items:
        tier = _tier(flag, name)
        if tier in out:
            raise TierSpecError(f"{flag}: the {tier} tier is given twice")
        out[tier] = _number(flag, number, tier)
    return out


def spec_errors(bandwidth: Any, latency: Any) -> list[str]:
    """The problems with the two flags' values (empty: both parse), for a caller's list of errors."""
    errors = []
    for flag, value in (("--tier-bandwidth", bandwidth), ("--tier-latency", latency)):
        try:
            tier_values(flag, value)
        except TierSpecError as exc:
            errors.append(str(exc))
    return errors


def shaping_fields(bandwidth: Any, latency: Any) -> dict[str, float]:
    """StorageSettings' shaping fields from the two flags' values (unnamed tiers: 0, unshaped); raises
    TierSpecError on a bad value (see spec_errors to collect them first)."""
    out = dict.fromkeys(_FIELDS.values(), 0.0)
    for flag, value in (("--tier-bandwidth", bandwidth), ("--tier-latency", latency)):
        for tier, number in tier_values(flag, value).items():
            out[_FIELDS[flag, tier]] = number
    return out
