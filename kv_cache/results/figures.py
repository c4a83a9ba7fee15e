"""The summary's figures as a small tree of frozen dataclasses, typed once.

results/summary.py builds the tree from a run's recorder (the request counts, rates and latency blocks;
`Figures.cache`, the `cache_stats` block: per tier and direction the bytes, bandwidth, operations, demotion
traffic and latency percentiles, the storage tier's device and host time; the request-level totals; the
hit counts; the verdict) and writes it out at the edge with `to_json()`, which gives today's keys in
today's order (the documents stay byte for byte as they were: tests/test_figures.py against
tests/fixtures/golden/summary_figures.json). Readers take the tree back with `from_json` (documents.py:
`doc.figures`) rather than through the JSON's key names.

`from_json` reads documents of older versions and of the MLPerf tool: a key that is not there reads as
None (a percentile block with none of its keys: None), so each reader keeps its own default for a figure a
document lacks, as it had with `.get(key)`. Units are the MLPerf tool's: "gb" GiB, "gbps" GiB/s, "ms".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kv_cache.storage.tiername import TierName

__all__ = ["CacheStats", "Criterion", "Figures", "Hits", "LatencyBlock", "Percentiles", "RequestTotals",
           "StorageHealth", "TierFigures", "TierOp"]

TIERS = tuple(TierName)
OPS = ("read", "write")
_WORD = {"read": "read", "write": "written"}  # tier_<t>_kv_bytes_<word>_gb


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Percentiles:
    """One latency block in ms (PERCENTILES of metrics/recorder.py); a field a document lacks is None."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    p9999: float | None = None

    @classmethod
    def of(cls, values: Mapping[str, float]) -> Percentiles | None:
        """From RunMetrics.op_percentiles_ms ({} when there were no samples: None)."""
        return cls(**{k: values[k] for k in _PCT if k in values}) if values else None

    def items(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(`<prefix>_<pNN>_ms`, value) of each percentile held."""
        for k in _PCT:
            if (v := getattr(self, k)) is not None:
                yield f"{prefix}_{k}_ms", v

    @classmethod
    def from_json(cls, m: Mapping[str, Any], prefix: str) -> Percentiles | None:
        values = {k: m[f"{prefix}_{k}_ms"] for k in _PCT if f"{prefix}_{k}_ms" in m}
        return cls(**values) if values else None


_PCT = tuple(f.name for f in fields(Percentiles))


@dataclass(frozen=True)
class TierOp:
    """One tier and direction over the measured window (demotion I/O included in bytes and ops)."""

    bytes_gb: float | None = None  # tier_<t>_kv_bytes_{read,written}_gb
    bandwidth_gbps: float | None = None  # 0.0 for a window under MIN_RATE_WINDOW_S (null in older documents)
    demotion_gb: float | None = None
    demotion_ops: int | None = None
    ops_per_sec: float | None = None
    ops: int | None = None
    latency: Percentiles | None = None  # host + device ("total"); None without samples
    device: Percentiles | None = None  # the storage tier's device time (None for the other tiers)
    host: Percentiles | None = None  # the storage tier's host time

    def ms(self, k: str = "p95", part: str = "total") -> float | None:
        """Percentile `k` (p50 ... p9999) of `part` ("total", "device" or "host") in ms; None without it."""
        block = self.latency if part == "total" else getattr(self, part)
        return getattr(block, k) if block is not None else None


@dataclass(frozen=True)
class TierFigures:
    """One tier: the cache held on it at the end, and its two directions."""

    entries: int | None = None
    memory_used_gb: float | None = None
    read: TierOp = field(default_factory=TierOp)
    write: TierOp = field(default_factory=TierOp)

    def op(self, op: str) -> TierOp:
        return self.read if op == "read" else self.write


@dataclass(frozen=True)
class Hits:
    """Cache hits by what was read."""

    system_prompt: int | None = None
    common_phrase: int | None = None
    user_cache: int | None = None
    multi_turn: int | None = None


@dataclass(frozen=True)
class RequestTotals:
    """Request-level traffic: what requests asked for (demotion I/O is in the tier figures)."""

    read_bytes: int | None = None
    write_bytes: int | None = None
    read_gb: float | None = None
    write_gb: float | None = None
    read_write_ratio: float | None = None
    read_ops: int | None = None  # `read_iops`: the MLPerf tool's name for a COUNT, not a rate
    write_ops: int | None = None
    read_ops_per_sec: float | None = None
    write_ops_per_sec: float | None = None


@dataclass(frozen=True)
class Criterion:
    name: str | None = None
    target: Any = None
    actual: Any = None
    unit: str | None = None
    passed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target, "actual": self.actual, "unit": self.unit,
                "passed": self.passed}

    @classmethod
    def from_json(cls, m: Any) -> Criterion:
        m = _map(m)
        return cls(m.get("name"), m.get("target"), m.get("actual"), m.get("unit"), bool(m.get("passed")))


@dataclass(frozen=True)
class StorageHealth:
    """`storage_health`: the PASS / FAIL (or INCOMPLETE) and its criteria."""

    overall_status: str | None = None
    criteria: tuple[Criterion, ...] = ()
    passed_count: int = 0  # (as a document wrote it)
    total_count: int = 0

    @classmethod
    def of(cls, criteria: list[Criterion]) -> StorageHealth:
        passed = sum(1 for c in criteria if c.passed)
        return cls("PASS" if passed == len(criteria) else "FAIL", tuple(criteria), passed, len(criteria))

    def to_json(self) -> dict[str, Any]:
        return {"overall_status": self.overall_status, "criteria": [c.to_json() for c in self.criteria],
                "passed_count": self.passed_count, "total_count": self.total_count}

    @classmethod
    def from_json(cls, m: Any) -> StorageHealth | None:
        if not isinstance(m, Mapping):
            return None
        criteria = m.get("criteria")
        return cls(m.get("overall_status"),
                   tuple(Criterion.from_json(c) for c in criteria) if isinstance(criteria, list) else (),
                   m.get("passed_count", 0), m.get("total_count", 0))


@dataclass(frozen=True)
class CacheStats:
    """`cache_stats`: the MLPerf tool's keys plus ours."""

    hit_rate: float | None = None
    hits: int | None = None
    misses: int | None = None
    gpu: TierFigures = field(default_factory=TierFigures)
    cpu: TierFigures = field(default_factory=TierFigures)
    storage: TierFigures = field(default_factory=TierFigures)
    offloads_cpu: int | None = None
    offloads_storage: int | None = None
    evictions: int | None = None
    storage_deletions: int | None = None
    prefill_writes: int | None = None
    decode_reads: int | None = None
    hits_by_kind: Hits = field(default_factory=Hits)
    requests: RequestTotals = field(default_factory=RequestTotals)
    storage_tokens_processed: int | None = None
    rates_undefined_reason: str | None = None  # None: every rate is measured
    health: StorageHealth | None = None  # `storage_health` (None until judged, or in a document without it)

    def tier(self, name: str) -> TierFigures:
        """The tier called `name` in either vocabulary (gpu, cpu, storage or nvme)."""
        return getattr(self, TierName.of(name).value)

    def to_json(self) -> dict[str, Any]:
        """The `cache_stats` block, its keys in the order the documents have always had them."""
        t = {tier: self.tier(tier) for tier in TIERS}
        out: dict[str, Any] = {"cache_hit_rate": self.hit_rate, "cache_hits": self.hits, "cache_misses": self.misses}
        out |= {f"{tier}_entries": t[tier].entries for tier in TIERS}
        out |= {f"{tier}_memory_used_gb": t[tier].memory_used_gb for tier in TIERS}
        out |= {"offloads_cpu": self.offloads_cpu, "offloads_storage": self.offloads_storage,
                "evictions": self.evictions, "storage_deletions": self.storage_deletions,
                "prefill_writes": self.prefill_writes, "decode_reads": self.decode_reads}
        out |= {f"tier_{tier}_kv_bytes_{_WORD[op]}_gb": t[tier].op(op).bytes_gb for tier in TIERS for op in ("write", "read")}
        out |= {f"tier_{tier}_{op}_bandwidth_gbps": t[tier].op(op).bandwidth_gbps for tier in TIERS for op in OPS}
        for tier in TIERS:
            for op in OPS:
                s = t[tier].op(op)
                out |= {f"tier_{tier}_demotion_{op}_gb": s.demotion_gb, f"tier_{tier}_demotion_{op}_ops": s.demotion_ops,
                        f"tier_{tier}_{op}_ops_per_sec": s.ops_per_sec, f"tier_{tier}_{op}_ops": s.ops}
        h, r = self.hits_by_kind, self.requests
        out |= {"system_prompt_hits": h.system_prompt, "common_phrase_hits": h.common_phrase,
                "user_cache_hits": h.user_cache, "multi_turn_hits": h.multi_turn,
                "total_read_bytes": r.read_bytes, "total_write_bytes": r.write_bytes, "total_read_gb": r.read_gb,
                "total_write_gb": r.write_gb, "read_write_ratio": r.read_write_ratio, "read_iops": r.read_ops,
                "write_iops": r.write_ops, "read_ops_per_sec": r.read_ops_per_sec,
                "write_ops_per_sec": r.write_ops_per_sec, "storage_tokens_processed": self.storage_tokens_processed,
                "rates_undefined_reason": self.rates_undefined_reason}
        for tier in TIERS:
            for op in OPS:
                out |= (t[tier].op(op).latency or Percentiles()).items(f"{tier}_{op}")
        for op in OPS:
            for part in ("device", "host"):
                out |= (getattr(self.storage.op(op), part) or Percentiles()).items(f"storage_{op}_{part}")
        if self.health is not None:
            out["storage_health"] = self.health.to_json()
        return out

    @classmethod
    def from_json(cls, m: Any) -> CacheStats:
        """A `cache_stats` block as written (by any version, or the MLPerf tool): a key it lacks reads None."""
        m = _map(m)
        g = m.get

        def tier_op(tier: TierName, op: str) -> TierOp:
            storage = tier is TierName.STORAGE
            return TierOp(g(f"tier_{tier}_kv_bytes_{_WORD[op]}_gb"), g(f"tier_{tier}_{op}_bandwidth_gbps"),
                          g(f"tier_{tier}_demotion_{op}_gb"), g(f"tier_{tier}_demotion_{op}_ops"),
                          g(f"tier_{tier}_{op}_ops_per_sec"), g(f"tier_{tier}_{op}_ops"),
                          Percentiles.from_json(m, f"{tier}_{op}"),
                          Percentiles.from_json(m, f"storage_{op}_device") if storage else None,
                          Percentiles.from_json(m, f"storage_{op}_host") if storage else None)

        tiers = {tier.value: TierFigures(g(f"{tier}_entries"), g(f"{tier}_memory_used_gb"), tier_op(tier, "read"),
                                         tier_op(tier, "write")) for tier in TIERS}
        return cls(g("cache_hit_rate"), g("cache_hits"), g("cache_misses"), **tiers,
                   offloads_cpu=g("offloads_cpu"), offloads_storage=g("offloads_storage"), evictions=g("evictions"),
                   storage_deletions=g("storage_deletions"), prefill_writes=g("prefill_writes"),
                   decode_reads=g("decode_reads"),
                   hits_by_kind=Hits(g("system_prompt_hits"), g("common_phrase_hits"), g("user_cache_hits"),
                                     g("multi_turn_hits")),
                   requests=RequestTotals(g("total_read_bytes"), g("total_write_bytes"), g("total_read_gb"),
                                          g("total_write_gb"), g("read_write_ratio"), g("read_iops"), g("write_iops"),
                                          g("read_ops_per_sec"), g("write_ops_per_sec")),
                   storage_tokens_processed=g("storage_tokens_processed"),
                   rates_undefined_reason=g("rates_undefined_reason"),
                   health=StorageHealth.from_json(g("storage_health")))

    @property
    def storage_gb_moved(self) -> float:
        """GiB read plus written by the storage tier inside the measured window (0 where a document lacks them)."""
        return float(self.storage.read.bytes_gb or 0.0) + float(self.storage.write.bytes_gb or 0.0)


@dataclass(frozen=True)
class LatencyBlock:
    """A per-request latency block in ms (`end_to_end_latency_ms`, ...): mean and percentiles; a merge adds
    the request count and the longest."""

    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    p9999: float | None = None
    count: int | None = None  # (merged documents)
    max: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("mean", *_PCT)}
        return out | {k: v for k in ("count", "max") if (v := getattr(self, k)) is not None}

    @classmethod
    def from_json(cls, m: Any) -> LatencyBlock:
        m = _map(m)
        return cls(**{f.name: m.get(f.name) for f in fields(cls)})


_LATENCY = {"e2e": "end_to_end_latency_ms", "storage_io": "storage_io_latency_ms", "generation": "generation_latency_ms"}


@dataclass(frozen=True)
class Figures:
    """A summary's figures: the request-level ones, its three latency blocks and `cache` (its `cache_stats`).
    The summary's other blocks (QoS, prefix cache, autoscaling, per turn, ...) are still mappings beside it."""

    total_requests: int | None = None
    total_tokens: int | None = None
    elapsed_time: float | None = None  # the measured window, s
    tokens_per_sec: float | None = None  # `avg_throughput_tokens_per_sec`
    storage_io_s: float | None = None  # `total_storage_io_time`: the requests' storage seconds summed
    storage_tokens_per_sec: float | None = None  # generated tokens / storage_io_s (the MLPerf tool's formula)
    requests_per_second: float | None = None
    rates_undefined_reason: str | None = None
    e2e: LatencyBlock = field(default_factory=LatencyBlock)
    storage_io: LatencyBlock = field(default_factory=LatencyBlock)
    generation: LatencyBlock = field(default_factory=LatencyBlock)
    cache: CacheStats = field(default_factory=CacheStats)

    def to_json(self) -> dict[str, Any]:
        """The summary's keys these figures make, in the summary's order (its first keys, to `cache_stats`)."""
        return {"total_requests": self.total_requests, "total_tokens": self.total_tokens,
                "elapsed_time": self.elapsed_time, "avg_throughput_tokens_per_sec": self.tokens_per_sec,
                "total_storage_io_time": self.storage_io_s,
                "storage_throughput_tokens_per_sec": self.storage_tokens_per_sec,
                "requests_per_second": self.requests_per_second, "rates_undefined_reason": self.rates_undefined_reason,
                **{key: getattr(self, name).to_json() for name, key in _LATENCY.items()},
                "cache_stats": self.cache.to_json()}

    @classmethod
    def from_json(cls, summary: Any) -> Figures:
        """The figures of a document's `summary` mapping (None or a non-mapping: every figure None)."""
        m = _map(summary)
        return cls(m.get("total_requests"), m.get("total_tokens"), m.get("elapsed_time"),
                   m.get("avg_throughput_tokens_per_sec"), m.get("total_storage_io_time"),
                   m.get("storage_throughput_tokens_per_sec"), m.get("requests_per_second"),
                   m.get("rates_undefined_reason"),
                   **{name: LatencyBlock.from_json(m.get(key)) for name, key in _LATENCY.items()},
                   cache=CacheStats.from_json(m.get("cache_stats")))
