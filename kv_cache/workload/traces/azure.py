"""Azure LLM inference traces (Azure/AzurePublicDataset): ``AzureLLMInferenceTrace_{code,conv}.csv`` of
2023 and ``AzureLLMInferenceTrace_{code,conv}_1week.csv`` of 2024, a CSV of ``TIMESTAMP``,
``ContextTokens``, ``GeneratedTokens``.

Every row is a sessionless request without hash ids: ``ContextTokens`` is its whole input (``new_tokens``
too), ``GeneratedTokens`` its output. ``TIMESTAMP`` is a wall-clock time, ``2023-11-16 18:15:46.6805900``
in 2023 (naive, seven fractional digits: .NET ticks), ``2024-05-10 00:00:00.009930+00:00`` in 2024 (an
offset, the fraction sometimes left out); a ``T`` separator or a ``Z`` is read too. Arrival is seconds
after the first row's time, computed in integer nanoseconds (a float of the epoch seconds would round the
ticks away); a row earlier than the first is malformed (``negative_value:TIMESTAMP``), as a negative time
is in every format. Columns are found by name, in any order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from ._common import Bad, Row, csv_rows, tokens
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceStats

TIMESTAMP = "TIMESTAMP"
CONTEXT = "ContextTokens"
GENERATED = "GeneratedTokens"
COLUMNS = (TIMESTAMP, CONTEXT, GENERATED)

_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?")
_DAY_NS = 86_400 * 10**9


def timestamp_ns(text: str) -> int:
    """Nanoseconds since 0001-01-01 (UTC where the text gives an offset) of one ``TIMESTAMP``; digits of
    the fraction past the ninth are dropped. ValueError for anything else."""
    m = _TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(text)
    y, mo, d, h, mi, s, frac, zone = m.groups()
    if int(h) > 23 or int(mi) > 59 or int(s) > 60:  # (60: a leap second)
        raise ValueError(text)
    ns = date(int(y), int(mo), int(d)).toordinal() * _DAY_NS  # ValueError for a day that is none
    ns += ((int(h) * 60 + int(mi)) * 60 + int(s)) * 10**9
    if frac:
        ns += int((frac + "00000000")[:9])
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        ns -= sign * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60) * 10**9
    return ns


def _refused(names: list[str]) -> str | None:
    missing = [c for c in COLUMNS if c not in names]
    return f"not an Azure LLM inference CSV (no {', '.join(missing)} column)" if missing else None


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    first_ns: int | None = None
    for row in csv_rows(path, _refused):
        try:
            inp = tokens(row, CONTEXT)
            out = tokens(row, GENERATED)
            stamp = row[TIMESTAMP]
            if not stamp:
                raise Bad(f"missing_field:{TIMESTAMP}")
            try:
                ns = timestamp_ns(stamp)
            except ValueError:
                raise Bad(f"bad_value:{TIMESTAMP}") from None
            if inp == 0:
                raise Bad("zero_input")
            if first_ns is None:
                first_ns = ns
            if ns < first_ns:
                raise Bad(f"negative_value:{TIMESTAMP}")
        except Bad as exc:
            stats.skip(exc.args[0])
            continue
        yield Row(None, 1, (ns - first_ns) / 1e9, None, inp, inp, out, None, None)


def _header(head: Head) -> bool:
    if head.kind != "text":
        return False
    names = {h.strip().strip('"').strip() for h in head.first_line.split(",")}  # (quoted names, as csv reads them)
    return set(COLUMNS) <= names


FORMAT = register(TraceFormat(
    name="azure", summary="an Azure LLM inference CSV (TIMESTAMP, ContextTokens)", read=read, block_tokens=None,
    sniff=(SniffRule(40, _header),), options=("max_context_tokens",),
))
