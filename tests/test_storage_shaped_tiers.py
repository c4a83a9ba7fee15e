"""Per-tier shaping: `--tier-bandwidth cpu=50,storage=8` (a bare number: the storage tier alone) parsed once
(settings/shaping.py) for both commands, one ShapedStore per shaped tier, and the per-tier stats recorded."""

import io
import json

import pytest

from kv_cache.benchmarks.sessions.tier_checks import tier_flags
from kv_cache.cli import main, parse_sessions_settings, parse_settings
from kv_cache.errors import UsageError
from kv_cache.serving.build import shape_tiers
from kv_cache.serving.cache import Tier
from kv_cache.serving.tiers import TierSet
from kv_cache.settings.shaping import TierSpecError, shaping_fields, tier_values
from kv_cache.storage import BLOCK, FileStore, MemoryStore
from kv_cache.storage.shaped import ShapedStore, Shaping

CHUNK = 4 * BLOCK
UNSHAPED = {"tier_bandwidth_gbps": 0.0, "tier_latency_ms": 0.0, "cpu_tier_bandwidth_gbps": 0.0,
            "cpu_tier_latency_ms": 0.0}


@pytest.mark.parametrize(("value", "parsed"), [
    ("3", {"storage": 3.0}), (2.5, {"storage": 2.5}), (0.0, {"storage": 0.0}), (None, {}),
    ("cpu=50,storage=8", {"cpu": 50.0, "storage": 8.0}), ("dram=0.5", {"cpu": 0.5}),
    (" DRAM = 1 , storage=0 ", {"cpu": 1.0, "storage": 0.0}), ({"dram": 4}, {"cpu": 4.0}),
])
def test_a_bare_number_is_the_storage_tier_and_a_list_names_each_tier(value, parsed):
    assert tier_values("--tier-bandwidth", value) == parsed


@pytest.mark.parametrize(("value", "message"), [
    ("gpu=3", "the GPU tier is not shaped"), ("nvm=1", "unknown tier 'nvm'"),
    ("cpu=1,dram=2", "the cpu tier is given twice"), ("cpu=-1", r"\(cpu tier\) cannot be negative"),
    ("-0.5", "cannot be negative"), ("nan", "must be finite"), ("storage=inf", "must be finite"),
    ("fast", "must be a number or TIER=VALUE"), ("cpu=x", "must be a number"), ("cpu", "must be a number"),
    ("=3", "each item of a per-tier list is TIER=VALUE"), ("cpu=1,", "each item"),
])
def test_bad_specs_are_refused_with_one_line(value, message):
    with pytest.raises(TierSpecError, match=message) as exc:
        tier_values("--tier-bandwidth", value)
    assert "\n" not in str(exc.value) and isinstance(exc.value, UsageError)


def test_the_two_flags_fill_the_storage_settings_fields():
    assert shaping_fields(None, None) == UNSHAPED
    assert shaping_fields("6", "0.5") == {**UNSHAPED, "tier_bandwidth_gbps": 6.0, "tier_latency_ms": 0.5}
    assert shaping_fields("dram=2,storage=8", "cpu=0.1") == {
        "tier_bandwidth_gbps": 8.0, "tier_latency_ms": 0.0, "cpu_tier_bandwidth_gbps": 2.0, "cpu_tier_latency_ms": 0.1}


def test_both_commands_parse_the_per_tier_list_the_same_way():
    run = parse_settings(["--model", "llama3.1-8b", "--tier-bandwidth", "cpu=50,storage=8", "--tier-latency", "cpu=1"])
    ls = parse_sessions_settings(["--tier-bandwidth", "dram=50,storage=8", "--tier-latency", "dram=1"]).ladder_settings
    assert run.storage.tier_shaping() == ls.storage.tier_shaping() == {"cpu": (50.0, 1.0), "storage": (8.0, 0.0)}
    assert (ls.storage.tier_bandwidth_gbps, ls.storage.cpu_tier_bandwidth_gbps) == (8.0, 50.0)
    bare = parse_settings(["--model", "llama3.1-8b", "--tier-bandwidth", "4"]).storage
    assert bare.tier_shaping() == {"storage": (4.0, 0.0)} and bare.cpu_tier_bandwidth_gbps == 0.0
    assert parse_settings(["--model", "llama3.1-8b"]).storage.tier_shaping() == {}


@pytest.mark.parametrize("spec", ["gpu=1", "cpu=1,cpu=2", "cpu=-1", "inf", "x=1", "cpu=nan"])
def test_a_bad_spec_exits_2_before_anything_runs(spec, capsys, tmp_path):
    out = tmp_path / "never.json"
    assert main(["--model", "llama3.1-8b", "--tier-bandwidth", spec, "--output", str(out)]) == 2
    run_err = capsys.readouterr().err
    assert main(["sessions", "--tier-latency", spec, "--output", str(out)]) == 2
    sessions_err = capsys.readouterr().err
    for err, flag in ((run_err, "--tier-bandwidth"), (sessions_err, "--tier-latency")):
        assert err.count("\n") == 1 and flag in err, err
    assert not out.exists()


def _stores(tmp_path):
    m = MemoryStore(1 << 20, slab_bytes=2 * BLOCK)
    f = FileStore(tmp_path, CHUNK, io_mode="buffered")
    return TierSet([Tier("cpu", m, 1 << 20), Tier("nvme", f, 1 << 30)], file_store=f, memory_store=m), m, f


def test_the_builder_wraps_each_shaped_tier_in_its_own_store(tmp_path):
    stores, m, f = _stores(tmp_path)
    shape_tiers(stores, {"cpu": Shaping(bandwidth_gbps=5.0)})  # the CPU tier only
    cpu = stores.tiers[0].store
    assert isinstance(cpu, ShapedStore) and cpu.inner is m and stores.tiers[1].store is f
    assert stores.shaped == {"cpu": cpu} and stores.memory_store is m
    assert stores.notes == ["the cpu (DRAM) tier's real I/O is shaped: 5 GB/s (10^9 B/s) per direction "
                            "(token bucket per direction; the sleeps count as I/O time)"]
    stores.close()
    both, m, f = _stores(tmp_path / "b")
    shape_tiers(both, {"cpu": Shaping(2.0), "storage": Shaping(0.0, 1.0), "gpu": Shaping(9.0)})
    cpu, storage = both.tiers[0].store, both.tiers[1].store
    assert isinstance(cpu, ShapedStore) and isinstance(storage, ShapedStore) and storage.inner is f
    assert cpu.read_bucket is not storage.read_bucket and cpu.write_bucket is not storage.write_bucket
    assert (cpu.read_bucket.rate_bps, storage.read_bucket.rate_bps) == (2e9, 0.0)
    assert set(both.shaped) == {"cpu", "storage"} and len(both.notes) == 2
    both.close()


def _rung_block(shaping: dict, read_gbps: float = 200.0) -> dict:
    tiers = [{"tier": t, "limit_gib": 1.0, "peak_gib": 1.0, "evictions": 3, "filled": True,
              "read_gbps_workers": read_gbps} for t in ("cpu", "storage")]
    return {"storage": {"filesystem": "ext4", "ram_backed": False, "shaping": shaping.get("storage")},
            "tiers": tiers, "shaping": shaping}


def test_the_host_link_check_reads_each_tiers_shaped_rate():
    # both tiers measured at 200 GB/s: a shaped DRAM tier at 5 GB/s is not faster than a 64 GB/s link
    flags = tier_flags(_rung_block({"cpu": {"bandwidth_gbps": 5.0}}), 64.0, 1, 0, 10)
    assert not any("cpu tier" in f for f in flags)
    assert any("storage tier (measured 200.0 GB/s)" in f for f in flags)
    fast = tier_flags(_rung_block({"cpu": {"bandwidth_gbps": 100.0}}, read_gbps=1.0), 64.0, 1, 0, 10)
    assert any("cpu tier (shaped to 100.0 GB/s)" in f for f in fast) and not any("storage tier (" in f for f in fast)


@pytest.mark.slow  # a real run (wall clock)
def test_a_standard_run_with_a_cpu_rate_shapes_the_cpu_tier_only(quick_settings):
    from kv_cache.benchmarks.standard.run import execute

    out = io.StringIO()
    results, _ = execute(quick_settings("--cpu-mem-gb", "0.05", "--tier-bandwidth", "cpu=0.5"), out)
    shaping = results["measurement"]["tier_shaping"]
    assert set(shaping) == {"cpu"} and shaping["cpu"]["bandwidth_gbps"] == 0.5
    assert shaping["cpu"]["write_bytes"] > 0 and shaping["cpu"]["write_held_s"] > 0  # the bucket paced real bytes
    assert "Note: the cpu (DRAM) tier's real I/O is shaped: 0.5 GB/s" in out.getvalue()
    cpu_section = out.getvalue().split("### CPU TIER")[1].split("###")[1]
    assert "  Shaped: 0.5 GB/s (10^9 B/s) per direction; held back" in cpu_section
    assert not any("storage tier's real I/O is shaped" in n for n in results["measurement"]["notes"])
    json.dumps(results["measurement"]["tier_shaping"])  # JSON-safe


@pytest.fixture
def sessions_settings(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_configs:\n  micro:\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n"
                   "    kv_heads: 1\n")

    def make(*extra):
        return parse_sessions_settings(["--config", str(cfg), "--model", "micro", "--gpu", "l40s",
                                        "--gpu-mem-gb", "0.012", "--cpu-mem-gb", "0.05", "--cache-dir",
                                        str(tmp_path / "cache"), "--output", str(tmp_path / "o.json"), *extra])

    return make


@pytest.mark.slow  # runs a rung in real time
def test_a_sessions_rung_with_dram_shaping_records_it(sessions_settings):
    from kv_cache.benchmarks.sessions.ladder import RungRun
    from kv_cache.results.sessions_document import tier_shaping
    from kv_cache.workload.session_supply import script_supply

    s = sessions_settings("--window", "1", "--warmup", "0.5", "--pace", "fixed:0.2", "--io-workers", "2",
                          "--io-chunk-mb", "1", "--no-fsync", "--tier-bandwidth", "dram=0.05")
    ls = s.ladder_settings
    params = tier_shaping(ls)
    assert params["bandwidth_gbps"] is None and params["tiers"] == {
        "cpu": {"bandwidth_gbps": 0.05, "latency_ms": None, "described": "0.05 GB/s (10^9 B/s) per direction"}}
    result = RungRun(ls, "dram", 4, script_supply(None, s.sessions, ls.seed)).run()
    block = result["offload_tier"]
    assert [t["tier"] for t in block["tiers"]] == ["cpu"] and set(block["shaping"]) == {"cpu"}
    cpu = block["shaping"]["cpu"]
    assert cpu["bandwidth_gbps"] == 0.05 and cpu["write_bytes"] > 0 and cpu["write_held_s"] > 0
    assert any("cpu (DRAM) tier's real I/O is shaped" in n for n in result["tier_notes"])


def test_a_merge_of_ranks_sums_each_tiers_shares_and_held_seconds():
    from kv_cache.results.measurement import merge_shaping

    rank = {"cpu": {"bandwidth_gbps": 0.5, "latency_ms": None, "read_held_s": 1.5, "write_held_s": 0.25,
                    "read_bytes": 100, "write_bytes": 10, "described": "0.5 GB/s (10^9 B/s) per direction"}}
    merged = merge_shaping([rank, rank])
    assert set(merged) == {"cpu"}
    cpu = merged["cpu"]
    assert (cpu["bandwidth_gbps"], cpu["read_held_s"], cpu["write_held_s"], cpu["read_bytes"]) == (1.0, 3.0, 0.5, 200)
    assert cpu["described"] == "1 GB/s (10^9 B/s) per direction" and merge_shaping([]) == {}


def test_the_sessions_report_names_a_shaped_dram_tier():
    from kv_cache.render.sessions import _storage_table

    lat = {"load": {"ops": 2, "p50_ms": 50.0, "p95_ms": 51.0, "p99_ms": 52.0}, "store": {"ops": 0}}
    block = {"storage": None, "tiers": [{"tier": "cpu", "peak_gib": 0.5, "evictions": 0, "latency_ms": lat}],
             "shaping": {"cpu": {"bandwidth_gbps": 0.5, "described": "0.5 GB/s (10^9 B/s) per direction"}}}
    out = io.StringIO()
    _storage_table([{"tiers": "dram", "sessions": 4, "offload_tier": block}], out)
    assert "DRAM tier (cpu): shaped: 0.5 GB/s (10^9 B/s) per direction\n" in out.getvalue()
    assert "cpu load 50.00/51.00/52.00 store -" in out.getvalue()
