"""The sessions rung's offload-tier block and its flags (tier_checks.py)."""

from kv_cache.benchmarks.sessions.tier_checks import tier_flags


def block(fs="ext4", shaped=None, tiers=None, ctx_gib=1.0):
    storage = {"path": "/x", "filesystem": fs, "io_mode": "direct", "io_mode_reason": "", "ram_backed": fs == "tmpfs",
               "shaping": {"bandwidth_gbps": shaped} if shaped else None}
    return {"storage": storage, "tiers": tiers or [], "max_context_tokens": 100_000, "max_context_gib": ctx_gib}


def tier(name, limit, peak, evictions=0, filled=False, read=None):
    return {"tier": name, "limit_gib": limit, "peak_gib": peak, "evictions": evictions, "filled": filled,
            "read_gbps_workers": read}


def test_ram_tier_unshaped_is_flagged_and_shaped_is_not():
    assert any("(RAM), unshaped" in f for f in tier_flags(block("tmpfs"), 64.0, 1, 0, 10))
    assert not any("unshaped" in f for f in tier_flags(block("tmpfs", shaped=5.0), 64.0, 1, 0, 10))
    assert not any("unshaped" in f for f in tier_flags(block("ext4"), 64.0, 1, 0, 10))


def test_tier_faster_than_the_host_link():
    fast = block(tiers=[tier("cpu", 8, 8, 5, True, read=120.0), tier("storage", 100, 50, 3, False, read=3.0)])
    flags = tier_flags(fast, 64.0, 1, 0, 10)
    assert any("cpu tier (measured 120.0 GB/s) is faster than the GPU's host link (64 GB/s" in f for f in flags)
    assert not any("storage tier (measured" in f for f in flags)
    shaped = block(shaped=100.0, tiers=[tier("storage", 100, 99, 3, True, read=3.0)])
    assert any("storage tier (shaped to 100.0 GB/s)" in f for f in tier_flags(shaped, 64.0, 1, 0, 10))
    assert not any("host link" in f for f in tier_flags(shaped, 64.0, 2, 0, 10))  # TP 2: two links, 128 GB/s


def test_never_filled_and_queued_stores():
    b = block(tiers=[tier("cpu", 0.5, 0.5, 4, True), tier("storage", 0.25, 0.1)], ctx_gib=24.4)
    flags = tier_flags(b, 64.0, 1, 7, 100)
    assert any("storage tier never filled nor evicted" in f for f in flags)
    assert not any("cpu tier never filled" in f for f in flags)
    assert not any("one session" in f for f in flags)  # said once, by rung_results.failure_flags
    assert any(f.startswith("7 of 100 turns recomputed") for f in flags)


def test_the_report_names_the_storage_and_its_latency_percentiles():
    import io

    from kv_cache.render.sessions import _storage_table

    lat = {"load": {"ops": 3, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}, "store": {"ops": 0}}
    b = block("tmpfs", shaped=4.0, tiers=[{**tier("storage", 10, 2, 1), "latency_ms": lat}])
    b["storage"]["shaping"]["described"] = "4 GB/s (10^9 B/s) per direction"
    out = io.StringIO()
    _storage_table([{"tiers": "dram+storage", "sessions": 8, "offload_tier": b}], out)
    text = out.getvalue()
    assert "Storage tier: tmpfs (RAM), direct I/O, shaped: 4 GB/s (10^9 B/s) per direction, at /x" in text
    assert "storage load 1.00/2.00/3.00 store -" in text and "p50/p95/p99" in text
