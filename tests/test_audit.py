"""`kv-cache audit`: each integrity pattern flagged with its numbers (results/integrity.py, cli/audit.py).

Fixtures in tests/fixtures/mlperf/ are cut from the published MLPerf Storage v3.0 results
(mlcommons/storage_results_v3.0 @ 068d91f6): HPE K3000's rank 0 (option 1, trial 0) with its arrays
shortened (the longest end-to-end latency kept), and FarmGPU hickory's metadata `args.mpi_params`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kv_cache.cli import main
from kv_cache.cli.audit import audit_path
from kv_cache.host.preload import defined_functions, mapped_libraries, process_libraries
from kv_cache.results import integrity as integ
from kv_cache.results.documents import SCHEMA_VERSION

FIXTURES = Path(__file__).parent / "fixtures"
HPE = FIXTURES / "mlperf" / "hpe_k3000_run"
FARMGPU = FIXTURES / "mlperf" / "farmgpu_hickory_run"
HPE_RANK0 = next(HPE.rglob("kvcache_results_*.json"))
OURS = FIXTURES / "integrity" / "run.json"  # a 2 s O_DIRECT --verify run (tests/fixtures/integrity/make.py)
ROOT = Path(__file__).resolve().parent.parent


def _check(block: dict, name: str) -> dict:
    return next(c for c in block["checks"] if c["check"] == name)


def _hpe_facts(**params) -> integ.IntegrityFacts:
    return integ.facts_from_mlperf_tool(json.loads(HPE_RANK0.read_text()), params)


def test_hpe_write_device_time_is_impossible_for_its_bytes():
    block = integ.audit_facts(_hpe_facts(num_users=200))
    c = _check(block, "device_time")
    assert c["status"] == integ.INVALID and "fsync alone" in c["reason"]
    assert c["numbers"]["write_mean_bytes_per_op"] == 589962594  # 339228491776 B / 575 writes
    assert 500 < c["numbers"]["write_implied_gb_per_s"] < 600  # 590 MB in 1.03 ms
    assert c["numbers"]["read_implied_gb_per_s"] < 1  # reads: 473 MB in 64.5 s, possible


def test_ceiling_is_configurable():
    c = _check(integ.audit_facts(_hpe_facts(), ceiling=1e15), "device_time")
    assert c["status"] == integ.OK


def test_hpe_io_outside_the_window_and_corrected_bandwidth():
    block = integ.audit_facts(_hpe_facts(num_users=200))
    c = _check(block, "window")
    assert c["status"] == integ.INVALID
    n = c["numbers"]
    assert n["average_in_flight"] == pytest.approx(216.9, abs=0.1)  # 65071 s of storage time / 300 s > 200 users
    assert n["end_to_end_p95_s"] == pytest.approx(451.38, abs=0.01)
    assert n["span_s"] == pytest.approx(492.67, abs=0.01)  # the longest request: bytes moved until then at least
    assert n["reported_read_gib_per_s"] == pytest.approx(4.34, abs=0.005)
    assert n["corrected_read_gib_per_s"] == pytest.approx(2.64, abs=0.005)  # 1302.07 GiB / 492.67 s
    assert block["corrected_read_gib_per_s"] == n["corrected_read_gib_per_s"]


def test_window_without_worker_count_still_uses_the_longest_request():
    c = _check(integ.audit_facts(_hpe_facts()), "window")
    assert c["numbers"]["workers"] is None and c["numbers"]["corrected_read_gib_per_s"] == pytest.approx(2.64, abs=0.005)


def test_preload_in_recorded_mpi_params_is_named():
    meta = json.loads(next(FARMGPU.rglob("*_metadata.json")).read_text())
    params = integ.mlperf_run_params(meta, 1, 0)
    assert [Path(p).name for p in params["ld_preload"]] == ["libtcmalloc_minimal.so.4", "libnofadvise.so",
                                                           "libeatmydata.so"]
    assert params["num_users"] == 200
    c = _check(integ.audit_facts(integ.facts_from_mlperf_tool({}, params)), "interposers")
    assert c["status"] == integ.INVALID
    assert "libnofadvise.so" in c["reason"] and "libeatmydata.so" in c["reason"] and "allocator" in c["reason"]
    setup = _check(integ.audit_facts(integ.facts_from_mlperf_tool({}, params)), "io_setup")
    assert setup["status"] == integ.INVALID and setup["numbers"]["fsync_really_issued"] is False


def test_rank_file_alone_says_parameters_unknown():
    c = _check(integ.audit_facts(_hpe_facts()), "interposers")
    assert c["status"] == integ.UNKNOWN and "metadata" in c["reason"]


def test_mlperf_page_cache_and_io_setup():
    block = integ.audit_facts(_hpe_facts(num_users=200, host="C-FTC63-R2-06"))
    assert _check(block, "page_cache")["status"] == integ.NA  # the tool records no counters: said why
    setup = _check(block, "io_setup")  # buffered + fsync + fadvise(DONTNEED) is its design: the shims are the risk
    assert setup["status"] == integ.OK and setup["numbers"]["io_mode"] == "buffered"
    assert "posix_fadvise" in setup["reason"]
    assert setup["numbers"]["host"] == "C-FTC63-R2-06"


def _ours() -> dict:
    return {"schema_version": SCHEMA_VERSION, **json.loads(OURS.read_text())}


def test_our_fixture_is_ok():
    block = integ.audit_facts(integ.facts_from_ours(_ours()))
    assert block["verdict"] == integ.OK, block["reasons"]
    assert _check(block, "window")["numbers"]["corrected_read_gib_per_s"] == pytest.approx(
        block["reported_read_gib_per_s"], rel=1e-6)


def test_our_reads_not_seen_by_the_device_are_page_cache():
    doc = _ours()
    cs = doc["summary"]["cache_stats"]
    doc["measurement"]["process_io"]["read_bytes"] = cs["tier_storage_kv_bytes_read_gb"] * 2**30 / 4
    c = _check(integ.audit_facts(integ.facts_from_ours(doc)), "page_cache")
    assert c["status"] == integ.INVALID and c["numbers"]["source"] == "process"
    assert c["numbers"]["source_read_share"] == pytest.approx(0.25, abs=0.01)


def test_our_impossible_device_time_and_ram_filesystem():
    doc = _ours()
    doc["summary"]["cache_stats"]["storage_write_device_p95_ms"] = 1e-6
    doc["measurement"].update(filesystem="tmpfs", filesystem_kind="memory", fsync=False, io_mode="buffered")
    block = integ.audit_facts(integ.facts_from_ours(doc))
    assert block["verdict"] == integ.INVALID
    assert _check(block, "device_time")["status"] == integ.INVALID
    setup = _check(block, "io_setup")
    assert setup["status"] == integ.INVALID and "RAM" in setup["reason"] and "no fsync" in setup["reason"]


def test_facts_from_ours_reads_the_recorded_interposers():
    doc = _ours()
    doc["measurement"]["process_libraries"]["interposers"] = [{"path": "/x/libshim.so", "symbols": ["fsync"]}]
    f = integ.facts_from_ours(doc)
    assert f.interposers == (("/x/libshim.so", ("fsync",)),)
    assert dataclasses.replace(f, interposers=()).interposers == ()
    c = _check(integ.audit_facts(f), "interposers")
    assert c["status"] == integ.INVALID and "/x/libshim.so interposes fsync" in c["reason"]


def test_worst_verdict():
    assert integ.worst_verdict([integ.OK, integ.SUSPECT, integ.OK]) == integ.SUSPECT
    assert integ.worst_verdict([integ.OK, integ.INVALID, integ.SUSPECT]) == integ.INVALID


def test_audit_cli_run_directory_per_rank_and_overall(capsys):
    code = main(["audit", str(HPE)])
    out = capsys.readouterr().out
    assert code == 1  # an invalid file
    assert "rank_0/kvcache_results_20260807_155722.json: INVALID" in out
    assert "at most 2.64 corrected" in out and "4.34 GiB/s reported" in out
    assert "Overall: INVALID (1 file(s)" in out


def test_audit_cli_json_and_our_result(tmp_path, capsys):
    ours = tmp_path / "r.json"
    ours.write_text(json.dumps(_ours()))
    assert main(["audit", "--json", str(ours), str(FARMGPU)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == integ.INVALID
    assert data["files"][str(ours)]["verdict"] == integ.OK
    farm = [b for n, b in data["files"].items() if n != str(ours)][0]
    assert _check(farm, "interposers")["status"] == integ.INVALID


def test_audit_cli_bad_input(tmp_path, capsys):
    other = tmp_path / "x.json"
    other.write_text("{}")
    assert main(["audit", str(other)]) == 2
    assert "neither a kv-cache result" in capsys.readouterr().err


def test_audit_listed_in_help(capsys):
    main(["--help"])
    assert "audit" in capsys.readouterr().out


def test_elf_reader_finds_libc_fsync():
    libc = [p for p in mapped_libraries() if Path(p).name.startswith("libc.so")]
    if not libc:
        pytest.skip("no glibc mapped in this process")
    assert {"fsync", "fdatasync", "posix_fadvise", "open"} <= set(defined_functions(libc[0]))
    assert process_libraries()["interposers"] == [] or all(
        not Path(i["path"]).name.startswith("libc.so") for i in process_libraries()["interposers"])


def test_elf_reader_ignores_non_elf(tmp_path):
    p = tmp_path / "libnot.so"
    p.write_bytes(b"not an ELF file at all" * 10)
    assert defined_functions(str(p)) == []


SHIM = "int fsync(int fd) { (void)fd; return 0; }\nint fdatasync(int fd) { (void)fd; return 0; }\n"


@pytest.fixture
def fsync_shim(tmp_path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the LD_PRELOAD shim")
    src, lib = tmp_path / "shim.c", tmp_path / "libshim.so"
    src.write_text(SHIM)
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


def test_preloaded_fsync_shim_in_a_child_is_named(fsync_shim, tmp_path):
    """A child process under LD_PRELOAD records its mapped libraries as a run does; audit names the shim."""
    code = ("import json, sys; from kv_cache.host.preload import snapshot_at_start; "
            "json.dump(snapshot_at_start(), sys.stdout)")
    env = {"LD_PRELOAD": str(fsync_shim), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    libs = json.loads(done.stdout)
    assert libs["ld_preload"] == [str(fsync_shim)]
    assert {"path": str(fsync_shim), "symbols": ["fdatasync", "fsync"]} in libs["interposers"]
    doc = _ours()
    doc["measurement"]["process_libraries"] = libs
    result = tmp_path / "shimmed.json"
    result.write_text(json.dumps(doc))
    (_, block), = audit_path(str(result))
    c = _check(block, "interposers")
    assert block["verdict"] == integ.INVALID
    assert f"{fsync_shim} interposes fdatasync, fsync" in c["reason"]
    assert "libshim.so (unknown preloaded library)" in c["reason"]
    assert _check(block, "io_setup")["numbers"]["fsync_really_issued"] is False


def test_mlperf_params_default_to_first_command():
    meta = json.loads(next(HPE.rglob("*_metadata.json")).read_text())
    assert integ.mlperf_run_params(meta) == {"ld_preload": [], "num_users": 200}
    assert integ.mlperf_run_params(copy.deepcopy(meta), 2, 0) == {"ld_preload": []}  # no such command there


MICRO = ("model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")


@pytest.mark.slow  # a real 1 s run in a child process
def test_short_run_under_a_preloaded_shim_is_invalid(fsync_shim, tmp_path, capsys):
    """A real kv-cache run started with LD_PRELOAD of the fsync no-op: its own integrity block names the shim,
    its report says INVALID beside PASS/FAIL, and `audit` agrees."""
    config, out = tmp_path / "micro.yaml", tmp_path / "r.json"
    config.write_text(MICRO)
    argv = [sys.executable, "-m", "kv_cache", "--config", str(config), "--model", "micro", "--num-users", "2",
            "--duration", "1", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "42",
            "--cache-dir", str(tmp_path / "cache"), "--output", str(out), "--io-chunk-mb", "1"]
    env = {**os.environ, "LD_PRELOAD": str(fsync_shim), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.exists(), done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["integrity"]["verdict"] == integ.INVALID
    assert any(f"{fsync_shim} interposes fdatasync, fsync" in r for r in doc["integrity"]["reasons"])
    assert "Integrity: INVALID" in done.stdout
    assert main(["audit", str(out)]) == 1
    assert f"{fsync_shim} interposes fdatasync, fsync" in capsys.readouterr().out


def test_merge_carries_each_ranks_integrity_and_audit_counts_it(tmp_path, capsys):
    from kv_cache.results.merge import merge_documents  # noqa: PLC0415

    docs = [json.loads(p.read_text()) for p in sorted((FIXTURES / "results" / "ranks").glob("x_rank*.json"))]
    docs[1]["integrity"] = {"verdict": integ.INVALID, "reasons": ["interposers: /x/libshim.so interposes fsync"]}
    merged = merge_documents(docs)
    block = merged["integrity"]
    assert block["verdict"] == integ.INVALID
    assert block["per_rank"]["0"]["verdict"] == integ.UNVERIFIABLE  # written before the block existed
    assert "rank 1: interposers: /x/libshim.so interposes fsync" in block["reasons"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(merged))
    assert main(["audit", str(path)]) == 1
    assert "  rank 1: invalid; interposers: /x/libshim.so interposes fsync" in capsys.readouterr().out
    (_, audited), = audit_path(str(path))
    assert audited["verdict"] == integ.INVALID and "rank 1: interposers: /x/libshim.so interposes fsync" in audited["reasons"]


def test_longest_request_from_qos_maxima_when_the_array_is_cut():
    raw = json.loads(HPE_RANK0.read_text())
    raw["end_to_end_latencies"] = []
    raw["summary"]["qos_metrics"] = {"batch": {"latency_ms": {"max": 492674.63916447014}},
                                     "interactive": {"latency_ms": {"max": 491049.777594395}}}
    f = integ.facts_from_mlperf_tool(raw, {"num_users": 200})
    assert f.e2e_max_s == pytest.approx(492.6746, abs=1e-4)
    assert _check(integ.audit_facts(f), "window")["numbers"]["corrected_read_gib_per_s"] == pytest.approx(2.64, abs=0.005)
