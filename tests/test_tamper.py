"""The tamper suite: real documents of three kinds (a standard run, a merged run of 2 processes, a rank file in
the MLPerf tool's shape under its harness layout; tests/fixtures/integrity/make.py), each changed one way a
skeptic would, and audited. Every tampered copy is invalid or unverifiable; the clean ones are OK."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from kv_cache.cli.audit import audit_path
from kv_cache.results import integrity as integ

FX = Path(__file__).parent / "fixtures" / "integrity"
RUN, MERGED = json.loads((FX / "run.json").read_text()), json.loads((FX / "merged.json").read_text())
# the rank files the merge names are not shipped: by bare name they are looked for beside the audited copy
# only (a tmp_path), never at the absolute paths it was made at, which may hold anything on this machine
MERGED["merged_from"] = [Path(p).name for p in MERGED["merged_from"]]
TOOL_DIR = FX / "mlperf_run"
TOOL_RANK = next(TOOL_DIR.rglob("kvcache_results_*.json"))
NOT_OK = (integ.INVALID, integ.UNVERIFIABLE)


def _cs(d):
    return d["summary"]["cache_stats"]


def _m(d):
    return d["measurement"]


def _set(path: str, value):
    def change(d):
        *head, last = path.split(".")
        node = d
        for k in head:
            node = node[k]
        if value is _DROP:
            node.pop(last)
        else:
            node[last] = value(node[last]) if callable(value) else value
    return change


_DROP = object()

# (name, change, the check that must catch it)
OURS = [
    ("bandwidth set to 1000 GiB/s", _set("summary.cache_stats.tier_storage_read_bandwidth_gbps", 1000.0), "bandwidth"),
    ("window cut to 0.1 s", _set("measurement.window_seconds", 0.1), "bandwidth"),
    ("both windows cut to 0.1 s", lambda d: (_set("measurement.window_seconds", 0.1)(d),
                                             _set("summary.elapsed_time", 0.1)(d)), "bandwidth"),
    ("bytes read doubled", _set("summary.cache_stats.tier_storage_kv_bytes_read_gb", lambda v: 2 * v), "bandwidth"),
    ("device P95 0.001 ms", _set("summary.cache_stats.storage_read_device_p95_ms", 0.001), "device_time"),
    ("storage read ops removed", _set("summary.cache_stats.tier_storage_read_ops", _DROP), "device_time"),
    ("150 operations in flight at the edge", _set("measurement.window_edge.edge_ops", 150), "window"),
    ("queue depth 150 on 4 workers", _set("measurement.achieved_queue_depth.read", 150.0), "window"),
    ("150 requests in flight from 4 users", _set("measurement.requests_in_flight_at_stop", 150), "window"),
    ("window edge record removed", _set("measurement.window_edge", _DROP), "window"),
    ("edge bytes above the bytes counted", _set("measurement.window_edge.counted_bytes", 1 << 40), "window"),
    ("--verify mismatches", _set("measurement.verify.mismatches", 11), "verify"),
    ("verify record removed", _set("measurement.verify", _DROP), "verify"),
    ("process read bytes a quarter", _set("measurement.process_io.read_bytes", lambda v: v // 4), "page_cache"),
    ("every counter removed", lambda d: (_set("measurement.process_io", _DROP)(d),
                                         _set("measurement.block_device", {})(d)), "page_cache"),
    ("tmpfs", lambda d: _m(d).update(filesystem="tmpfs", filesystem_kind="memory"), "io_setup"),
    ("an fsync shim mapped", _set("measurement.process_libraries.interposers",
                                  [{"path": "/x/libeatmydata.so", "symbols": ["fsync", "fdatasync"]}]), "interposers"),
    ("mapped libraries removed", _set("measurement.process_libraries", _DROP), "interposers"),
    # a second review's: tamperings kept consistent with the other figures, or hidden in a missing or odd value
    ("bytes, bandwidth, ops and every counter x1000", lambda d: _scale_all(d, 1000), "window"),
    ("storage operation counts x1000", lambda d: _cs(d).update(tier_storage_read_ops=_cs(d)["tier_storage_read_ops"]
                                                             * 1000), "window"),
    ("I/O mode, fsync and filesystem removed", lambda d: [_m(d).pop(k, None) for k in
                                                          ("io_mode", "fsync", "filesystem", "filesystem_kind")],
     "io_setup"),
    ("the mapped-library scan's flag removed", _set("measurement.process_libraries.recorded", _DROP), "interposers"),
    ("process reads 0 beside a full own cgroup", lambda d: _m(d)["process_io"].update(
        read_bytes=0, cgroup={"read_bytes": 1 << 40, "write_bytes": 1 << 40, "own": True, "source": "x"}),
     "page_cache"),
    ("--verify off with mismatches", _set("measurement.verify", {"enabled": False, "mismatches": 5}), "verify"),
    ("bytes read infinite", lambda d: _cs(d).update(tier_storage_kv_bytes_read_gb=float("inf"),
                                                    tier_storage_read_bandwidth_gbps=float("inf")), "bandwidth"),
    ("negative edge bytes", _set("measurement.window_edge.unmeasured_bytes", -(1 << 30)), "window"),
    ("I/O workers x250 beside a queue depth of 150", lambda d: _m(d).update(
        io_workers=1000, io_workers_choice={"count": 4}, achieved_queue_depth={"read": 150.0, "write": 0.1}), "window"),
    ("a file tier relabelled a remote one, reads from memory", lambda d: _m(d).update(
        io_mode="network", tier_backends={"storage": "file"}, process_io={**_m(d)["process_io"], "read_bytes": 0},
        remote_tier={"network": {"interface": "lo", "bytes_received": 1 << 40, "tool_bytes_read": 1 << 30,
                                 "tool_bytes_written": 1 << 30}}), "page_cache"),
]


def _scale_all(d: dict, k: int) -> None:
    """Every byte, bandwidth, operation and device/process counter of the storage tier times k: bandwidth stays
    bytes / window and the mean operation size stays the same; only the device time no longer fits."""
    cs = _cs(d)
    for key in ("tier_storage_kv_bytes_read_gb", "tier_storage_kv_bytes_written_gb", "tier_storage_read_bandwidth_gbps",
                "tier_storage_write_bandwidth_gbps", "tier_storage_read_ops", "tier_storage_write_ops"):
        cs[key] *= k
    for key in ("read_bytes", "write_bytes", "run_read_bytes", "run_write_bytes"):
        if key in _m(d)["process_io"]:
            _m(d)["process_io"][key] *= k
    for key in ("bytes_read", "bytes_written", "tool_bytes_read", "tool_bytes_written"):
        if key in _m(d)["block_device"]:
            _m(d)["block_device"][key] *= k

MERGE = [
    ("bandwidth set to 1000 GiB/s", _set("summary.cache_stats.tier_storage_read_bandwidth_gbps", 1000.0), "bandwidth"),
    ("window cut to 0.1 s", _set("measurement.window_seconds", 0.1), "bandwidth"),
    ("device P95 0.001 ms", _set("summary.cache_stats.storage_read_device_p95_ms", 0.001), "device_time"),
    ("--verify mismatches", _set("measurement.verify.mismatches", 3), "verify"),
    ("window edge record removed", _set("measurement.window_edge", None), "window"),
    ("process read bytes a tenth", _set("measurement.process_io.read_bytes", lambda v: v // 10), "page_cache"),
    ("a rank's verdict invalid", _set("integrity.per_rank.1", {"verdict": "invalid", "reasons": ["x"]}), None),
    ("a rank's verdict removed", _set("integrity.per_rank.1", {"reasons": []}), None),
]


def _audit_doc(tmp_path: Path, doc: dict, limit=None) -> dict:
    p = tmp_path / "doc.json"
    p.write_text(json.dumps(doc))
    (_, block), = audit_path(str(p), limit=limit)
    return block


def _status(block: dict, check: str) -> str:
    return next(c["status"] for c in block["checks"] if c["check"] == check)


@pytest.mark.parametrize("doc", [RUN, MERGED], ids=["run", "merged"])
def test_clean_documents_of_ours_are_ok(tmp_path, doc):
    block = _audit_doc(tmp_path, doc)
    assert block["verdict"] == integ.OK, block["reasons"]


@pytest.mark.parametrize(("name", "change", "check"), OURS, ids=[t[0] for t in OURS])
def test_a_tampered_run_is_not_ok(tmp_path, name, change, check):
    doc = copy.deepcopy(RUN)
    change(doc)
    block = _audit_doc(tmp_path, doc)
    assert block["verdict"] in NOT_OK, (name, block["reasons"])
    assert _status(block, check) in NOT_OK, (name, block["reasons"])


@pytest.mark.parametrize(("name", "change", "check"), MERGE, ids=[t[0] for t in MERGE])
def test_a_tampered_merge_is_not_ok(tmp_path, name, change, check):
    doc = copy.deepcopy(MERGED)
    change(doc)
    block = _audit_doc(tmp_path, doc)
    assert block["verdict"] in NOT_OK, (name, block["reasons"])
    if check:
        assert _status(block, check) in NOT_OK, (name, block["reasons"])


def test_a_busy_merge_is_judged_against_every_rank_s_workers(tmp_path):
    """A merge's queue depth and edge operations are the ranks' sums, so 2 ranks x 2 I/O workers allow 4 in
    flight: 3.5 on average and 4 at the edge are honest (they were invalid against one rank's 2), 5 is not."""
    doc = copy.deepcopy(MERGED)
    _m(doc).update(achieved_queue_depth={"read": 3.0, "write": 0.5})
    _m(doc)["window_edge"]["edge_ops"] = 4
    block = _audit_doc(tmp_path, doc)
    assert _status(block, "window") == integ.OK, block["reasons"]
    _m(doc)["window_edge"]["edge_ops"] = 5
    assert _status(_audit_doc(tmp_path, doc), "window") == integ.INVALID


def test_a_device_limit_below_the_bandwidth_is_invalid(tmp_path):
    block = _audit_doc(tmp_path, RUN, limit=(0.01, "a 10 MB/s drive"))
    assert block["verdict"] == integ.INVALID
    assert any("above the 0.01 GB/s read limit" in r for r in block["reasons"])


def _tool_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    run = tmp_path / "mlperf_run"
    shutil.copytree(TOOL_DIR, run)
    rank = next(run.rglob("kvcache_results_*.json"))
    meta = next(run.rglob("*_metadata.json"))
    return run, rank, meta


def _edit(path: Path, change) -> None:
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


TOOL_RANK_TAMPER = [
    ("bandwidth set to 1000 GiB/s", _set("summary.cache_stats.tier_storage_read_bandwidth_gbps", 1000.0), "bandwidth"),
    ("elapsed cut to 0.1 s", _set("summary.elapsed_time", 0.1), "bandwidth"),
    ("device P95 0.000001 ms", _set("summary.cache_stats.storage_read_device_p95_ms", 1e-6), "device_time"),
    ("read_iops removed", _set("summary.cache_stats.read_iops", _DROP), "device_time"),
    ("bytes moved to the CPU tier", _set("summary.cache_stats.tier_cpu_kv_bytes_read_gb", 0.01), "bandwidth"),
    ("storage time x100", _set("total_storage_io_latency", lambda v: 100 * v), "window"),
    ("end-to-end latencies longer than the window", _set("end_to_end_latencies", [30.0]), "window"),
]

TOOL_META_TAMPER = [
    ("LD_PRELOAD as an environment mapping", lambda d: d["args"].update(
        mpi_params={"env": {"LD_PRELOAD": "/opt/libnofadvise.so"}}), "interposers"),
    ("-x LD_PRELOAD with no value", lambda d: d["args"].update(mpi_params="-x LD_PRELOAD --bind-to none"),
     "interposers"),
    ("an eatmydata wrapper", lambda d: d["commands"][0].update(
        command=d["commands"][0]["command"].replace("python3 mlperf_wrapper.py", "eatmydata python3 mlperf_wrapper.py")),
     "interposers"),
    # a second review's: the forms the first scan missed
    ("-x and LD_PRELOAD as two argv elements", lambda d: d["args"].update(mpi_params=["-x", "LD_PRELOAD"]),
     "interposers"),
    ("-genv LD_PRELOAD with a spaced value", lambda d: d["args"].update(
        mpi_params="-genv LD_PRELOAD /usr/lib/libeatmydata.so"), "interposers"),
    ("a quoted LD_PRELOAD list, the shim second", lambda d: d["commands"][0].update(
        command='LD_PRELOAD="/usr/lib/libtcmalloc.so /usr/lib/libeatmydata.so" ' + d["commands"][0]["command"]),
     "interposers"),
    ("LD_PRELOAD in a nested environment", lambda d: d.update(
        system={"environment": {"LD_PRELOAD": "/opt/libnofadvise.so"}}), "interposers"),
    ("an eatmydata wrapper inside sh -c '...'", lambda d: d["commands"][0].update(
        command="sh -c 'eatmydata " + d["commands"][0]["command"] + "'"), "interposers"),
]


def test_the_clean_tool_rank_file_is_ok():
    (_, block), = audit_path(str(TOOL_DIR))
    assert block["verdict"] == integ.OK, block["reasons"]


@pytest.mark.parametrize(("name", "change", "check"), TOOL_RANK_TAMPER, ids=[t[0] for t in TOOL_RANK_TAMPER])
def test_a_tampered_tool_rank_file_is_not_ok(tmp_path, name, change, check):
    run, rank, _ = _tool_copy(tmp_path)
    _edit(rank, change)
    (_, block), = audit_path(str(run))
    assert block["verdict"] in NOT_OK and _status(block, check) in NOT_OK, (name, block["reasons"])


@pytest.mark.parametrize(("name", "change", "check"), TOOL_META_TAMPER, ids=[t[0] for t in TOOL_META_TAMPER])
def test_a_tampered_tool_metadata_is_not_ok(tmp_path, name, change, check):
    run, _, meta = _tool_copy(tmp_path)
    _edit(meta, change)
    (_, block), = audit_path(str(run))
    assert block["verdict"] in NOT_OK and _status(block, check) in NOT_OK, (name, block["reasons"])


def test_a_preload_in_another_trial_s_command_is_not_this_trial_s(tmp_path):
    """The whole metadata is scanned, but a command that wrote another option or trial is that trial's."""
    run, _, meta = _tool_copy(tmp_path)
    _edit(meta, lambda d: d["commands"].append({"command": "LD_PRELOAD=/x/libeatmydata.so " + d["commands"][0][
        "command"].replace("trial_0", "trial_1")}))
    (_, block), = audit_path(str(run))
    assert _status(block, "interposers") == integ.OK, block["reasons"]


def test_the_suite_has_at_least_twelve_distinct_tamperings():
    names = {n for n, *_ in OURS + MERGE + TOOL_RANK_TAMPER + TOOL_META_TAMPER}
    assert len(names) >= 12


def _with_series(doc: dict) -> dict:
    """RUN with a time series that holds its window's bytes in one bucket, as a real run's rows do (their
    storage bytes sum to the totals, their seconds to the window)."""
    doc = copy.deepcopy(doc)
    w, cs = _m(doc)["window_seconds"], _cs(doc)
    doc["time_series"] = {"bucket_seconds": w, "rows": [
        {"t_s": w, "seconds": w, "storage_read_bytes": round(cs["tier_storage_kv_bytes_read_gb"] * integ.GIB),
         "storage_write_bytes": round(cs["tier_storage_kv_bytes_written_gb"] * integ.GIB)}]}
    return doc


def _scale_window(d: dict, k: float) -> None:
    """The window times k and every bandwidth over k: bytes / window still holds."""
    _m(d)["window_seconds"] *= k
    d["summary"]["elapsed_time"] = _m(d)["window_seconds"]
    for key, v in list(_cs(d).items()):
        if key.endswith("_bandwidth_gbps") and isinstance(v, (int, float)):
            _cs(d)[key] = v / k


@pytest.mark.parametrize(("name", "change"), [
    ("storage bytes and bandwidth x2", lambda d: [_cs(d).update({k: 2 * _cs(d)[k]}) for k in (
        "tier_storage_kv_bytes_read_gb", "tier_storage_read_bandwidth_gbps")]),
    ("window halved, bandwidths doubled", lambda d: _scale_window(d, 0.5)),
    ("window x10, bandwidths / 10", lambda d: _scale_window(d, 10)),
])
def test_the_time_series_records_the_window_a_second_time(tmp_path, name, change):
    doc = _with_series(RUN)
    assert _audit_doc(tmp_path, doc)["verdict"] == integ.OK
    change(doc)
    block = _audit_doc(tmp_path, doc)
    assert _status(block, "bandwidth") == integ.INVALID, (name, block["reasons"])


def test_a_merge_s_ranks_are_audited_again_from_their_files(tmp_path):
    """A merge's recorded rank verdicts are stored verdicts: a rank file still beside the merge is audited
    afresh, so rank 1's fsync shim shows even where the merge says 'ok' for it."""
    rank1 = copy.deepcopy(RUN)
    _m(rank1)["process_libraries"]["interposers"] = [{"path": "/x/libeatmydata.so", "symbols": ["fsync"]}]
    rank1.setdefault("run_parameters", {})["mpi_rank"] = 1
    (tmp_path / "r_rank1.json").write_text(json.dumps(rank1))
    doc = copy.deepcopy(MERGED)
    doc["merged_from"] = ["/elsewhere/r_rank0.json", "/elsewhere/r_rank1.json"]  # found beside the merge
    doc["integrity"]["per_rank"] = {"0": {"verdict": "ok", "reasons": []}, "1": {"verdict": "ok", "reasons": []}}
    block = _audit_doc(tmp_path, doc)
    assert block["per_rank"]["1"]["verdict"] == integ.INVALID and block["verdict"] == integ.INVALID


def test_a_merge_with_no_rank_verdict_and_no_rank_file_is_unverifiable(tmp_path):
    doc = copy.deepcopy(MERGED)
    doc["integrity"].pop("per_rank", None)
    doc["merged_from"] = ["/elsewhere/a.json", "/elsewhere/b.json"]
    assert _audit_doc(tmp_path, doc)["verdict"] == integ.UNVERIFIABLE


def test_a_sessions_document_s_verdict_is_recomputed_not_read(tmp_path):
    """A sessions document's integrity block is judged again from the libraries it records: its stored
    verdict flipped to 'ok' over an fsync shim stays invalid, and a block with no libraries is unverifiable."""
    block = integ.sessions_integrity({"ld_preload": [], "recorded": True,
                                      "interposers": [{"path": "/x/libeatmydata.so", "symbols": ["fsync"]}]})
    assert block["verdict"] == integ.INVALID
    doc = {"schema_version": "kv-cache-sessions/1", "rungs": [], "summary": {},
           "integrity": {**block, "verdict": "ok", "reasons": []}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    (_, got), = audit_path(str(p))
    assert got["verdict"] == integ.INVALID
    doc["integrity"]["checks"][0]["numbers"] = {}
    p.write_text(json.dumps(doc))
    (_, got), = audit_path(str(p))
    assert got["verdict"] == integ.UNVERIFIABLE
    clean = integ.sessions_integrity({"ld_preload": [], "recorded": True, "interposers": []})
    p.write_text(json.dumps({**doc, "integrity": clean}))
    (_, got), = audit_path(str(p))
    assert got["verdict"] == integ.OK


def test_an_operation_per_worker_in_the_unbucketed_tail_is_honest(tmp_path):
    """The driver leaves a tail under a tenth of a bucket out of the time series: the operations the workers
    finish there are in the totals only. One largest entry per worker there is honest; far more is not."""
    doc = _with_series(RUN)
    row = doc["time_series"]["rows"][0]
    per = _m(doc)["entry_size_mib"]["max"] * 2 ** 20
    row["storage_read_bytes"] -= round(_m(doc)["io_workers"] * per)
    assert _status(_audit_doc(tmp_path, doc), "bandwidth") == integ.OK
    row["storage_read_bytes"] //= 3
    assert _status(_audit_doc(tmp_path, doc), "bandwidth") == integ.INVALID
