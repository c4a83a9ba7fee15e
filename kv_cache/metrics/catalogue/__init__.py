"""The metric catalogue: derived output metrics, found by a registry.

Each module of this package registers one or more :class:`Metric` entries. An entry says everything about
its figure: the key it has in the results (``summary.metrics.<key>``), its unit, the console label, how it
is computed from the run's recorder (RunMetrics, whose window it is measured over) and how a merge of
ranks combines it. The results builder, the console report, the spreadsheet and the merged document all
iterate over :func:`all_metrics`, so adding a metric is adding one module here (and its test): no list
anywhere else changes.

Merge rules (``Metric.merge``):
- ``RECOMPUTE`` (the default): the merge adds the ranks' recorders up and runs the single-run summary on
  the sum, so the figure is computed again, from the merged recorder, by the same function. Use it for
  every figure that reads only what a recorder's ``state()`` carries (operation and byte counts, busy
  time, counters, retries) or the per-request lists, which a merge holds whole.
- ``SUM`` / ``MAX``: the sum or the maximum of the ranks' own values (``summary.metrics`` of each rank's
  document), for a figure the merged recorder cannot give again.

Entries are loaded on the first lookup, by importing every module of this package once, in name order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.registry import Registry

__all__ = ["MAX", "MERGE_RULES", "MIN_RATE_WINDOW_S", "RECOMPUTE", "SUM", "Metric", "all_metrics", "get",
           "merged_values", "per_second", "register", "values"]

RECOMPUTE = "recompute"
SUM = "sum"
MAX = "max"
MERGE_RULES = (RECOMPUTE, SUM, MAX)
# A window shorter than this gives no rate (null): a count over a few milliseconds is no throughput.
MIN_RATE_WINDOW_S = 1.0


def per_second(amount: float, window_s: float) -> float:
    """`amount` / `window_s`, or 0.0 when the window was shorter than MIN_RATE_WINDOW_S (undefined: the
    results say why beside it, `rates_undefined_reason`; a rate key is always a number)."""
    return amount / window_s if window_s >= MIN_RATE_WINDOW_S else 0.0


def rates_undefined_reason(window_s: float) -> str | None:
    """Why the window's rates are 0.0 rather than measured (None when they are measured)."""
    if window_s >= MIN_RATE_WINDOW_S:
        return None
    return f"window {window_s:.3g} s is under {MIN_RATE_WINDOW_S:g} s: its rates are undefined, written as 0.0"


@dataclass(frozen=True)
class Metric:
    """One registry entry.

    `key`: its name in ``summary.metrics`` (snake case, ending in its unit as the other keys do: ``_mib``,
    ``_ms``, ``_ratio``); `label`: the console's text before the value; `unit`: what follows the value
    on the console ("" for a ratio); `compute`: the value from the recorder of the measured window (its
    window is ``metrics.window_seconds``), or None where it is undefined (nothing of that kind happened),
    never a made-up 0; `merge`: one of MERGE_RULES; `spec`: the console's format of the value; `summary`:
    what it means, for a reader who meets the key."""

    key: str
    label: str
    unit: str
    compute: Callable[[RunMetrics], float | None]
    summary: str
    merge: str = RECOMPUTE
    spec: str = ".2f"

    def __post_init__(self) -> None:
        if self.merge not in MERGE_RULES:
            raise ValueError(f"metric {self.key!r}: merge rule {self.merge!r} is not one of {', '.join(MERGE_RULES)}")
        if not self.key.isidentifier() or self.key != self.key.lower():
            raise ValueError(f"metric key {self.key!r}: use snake case, as every key of the results")


_REGISTRY: Registry[Metric] = Registry("metric", __name__, __path__, key=lambda e: e.key,
                                       missing="no {what} {name!r} in the catalogue (known: {known})")
_ENTRIES = _REGISTRY.entries  # (tests register a toy entry into it)
register = _REGISTRY.register
all_metrics = _REGISTRY.all  # in the order of the entry's module's name, then of registration within a module
get = _REGISTRY.get


def values(metrics: RunMetrics, entries: Iterable[Metric] | None = None) -> dict[str, float | None]:
    """``summary.metrics``: every entry's value from this recorder (None where undefined)."""
    out: dict[str, float | None] = {}
    for m in all_metrics() if entries is None else entries:
        v = m.compute(metrics)
        out[m.key] = None if v is None else float(v)
    return out


def merged_values(recomputed: Mapping[str, float | None], ranks: Iterable[Mapping[str, Any] | None],
                  entries: Iterable[Metric] | None = None) -> dict[str, float | None]:
    """``summary.metrics`` of a merge: `recomputed` (the values from the merged recorder) with the SUM and
    MAX entries replaced by the sum / maximum of the ranks' own values (`ranks`: each rank's
    ``summary.metrics``, None for a document without one); None where no rank has a value."""
    out = dict(recomputed)
    blocks = [b or {} for b in ranks]
    for m in all_metrics() if entries is None else entries:
        if m.merge == RECOMPUTE:
            continue
        got = [float(b[m.key]) for b in blocks if b.get(m.key) is not None]
        out[m.key] = (sum(got) if m.merge == SUM else max(got)) if got else None
    return out
