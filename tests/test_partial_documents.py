"""A rank's periodic INCOMPLETE document: the recorder's snapshot, the atomic rewrite, the writer's
schedule and end, and the merge of a rank that left only its periodic document."""

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from test_merge import _doc, _metrics, _write_ranks

from kv_cache.benchmarks.standard.partial import PartialDocuments, Snapshot
from kv_cache.cli import main
from kv_cache.core.observe import Tick
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render.merged_table import merged_table
from kv_cache.results.merge import CUT_SHORT, PERIODIC, merge_documents
from kv_cache.results.partial import PARTIAL_STOP, is_partial, mark_partial
from kv_cache.results.verdict import INCOMPLETE
from kv_cache.results.write import dumps, replace_document, write_document
from kv_cache.storage.base import IOResult


def _record_until(m, stop, n=None):
    i = 0
    while not stop.is_set() and (n is None or i < n):
        t = 1_000 + i
        m.record_io("storage", "read", IOResult(4096, 4096, t + 10, t, 10), t, "decode")
        m.record_request("interactive", t, t * 3, t * 2, 0, None, None, 10, 100)
        m.count("cache_hits", end_ns=t)
        i += 1


def _consistent(s: RunMetrics) -> int:
    """The invariants every state of the recorder keeps: within one recording call (an operation's count,
    bytes, samples and histogram; a request's count, samples and QoS list) they agree exactly, and across
    the three calls of one loop turn they are at most one apart. Returns the operation count."""
    rd = s.io.get(("storage", "read"))
    ops = rd.ops if rd else 0
    assert (rd.bytes if rd else 0) == 4096 * ops
    assert (len(rd.total_ns.values) if rd else 0) == ops == (rd.total_ns.count if rd else 0)
    h = s.histograms.get(("storage", "read", "device"))
    assert (h.get_total_count() if h else 0) == ops
    done = s.requests.completed
    assert done == s.requests.e2e_ns.count == len(s.requests.e2e_ns.values) == len(s.qos_e2e_ns["interactive"].values)
    assert ops - 1 <= done <= ops and done - 1 <= s.counters.get("cache_hits", 0) <= done
    return ops


def test_a_snapshot_is_one_consistent_state_while_another_thread_records():
    """Snapshots taken while a thread records: every one holds one state (no operation half in it: its
    count, bytes, samples, histogram, request and counter agree), later recording does not change it, and
    its window is closed at the snapshot."""
    m = RunMetrics()
    m.open_window(0)
    stop = threading.Event()
    writer = threading.Thread(target=_record_until, args=(m, stop))
    writer.start()
    try:
        snaps = []
        while len(snaps) < 40:
            snaps.append((m.snapshot(at_ns=5_000_000_000), None))
            ops = _consistent(snaps[-1][0])
            snaps[-1] = (snaps[-1][0], ops)
    finally:
        stop.set()
        writer.join()
    assert snaps[-1][1] > 0 and [o for _, o in snaps] == sorted(o for _, o in snaps)
    assert all(_consistent(s) == ops for s, ops in snaps)  # unchanged by what was recorded after
    assert all(s.window_end_ns == 5_000_000_000 and s.window_seconds == 5.0 for s, _ in snaps)
    assert m.window_end_ns is None  # the recorder's own window stays open


def test_a_snapshot_builds_the_same_document_blocks_as_the_recorder():
    m = _metrics(np.random.default_rng(3), 40, 30, 10, 4.0)
    snap = m.snapshot()
    assert json.loads(dumps(snap.state())) == json.loads(dumps(m.state()))  # (its lists: arrays, as written)
    assert (json.loads(dumps(_doc(snap, 0, 1, 0.0, 4.0)["latency_samples"]))
            == json.loads(dumps(_doc(m, 0, 1, 0.0, 4.0)["latency_samples"])))
    assert _doc(snap, 0, 1, 0.0, 4.0)["latency_histograms"] == _doc(m, 0, 1, 0.0, 4.0)["latency_histograms"]


def test_the_rewrite_is_atomic_a_reader_never_sees_a_torn_file(tmp_path):
    """One thread rewrites the document 150 times, alternating 2 MB and tiny ones; another reads and
    parses it all the while: every read is a whole document (it parses, and its payload has the length it
    says), and no temporary file is left."""
    path = tmp_path / "X_rank0.json"
    replace_document(path, {"n": 0, "payload": []})
    done, seen, torn = threading.Event(), [], []

    def read():
        while not done.is_set():
            try:
                doc = json.loads(path.read_bytes())
            except ValueError as exc:
                torn.append(str(exc))
                continue
            if len(doc["payload"]) != doc["n"]:
                torn.append(f"payload {len(doc['payload'])} != {doc['n']}")
            seen.append(doc["n"])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(150):
            n = 250_000 if i % 2 else 3
            replace_document(path, {"n": n, "payload": np.arange(n)})
    finally:
        done.set()
        reader.join()
    assert not torn and seen and set(seen) <= {0, 3, 250_000}
    assert [p.name for p in tmp_path.iterdir()] == ["X_rank0.json"]


def test_a_rewrite_that_fails_leaves_the_previous_document_whole(tmp_path):
    path = tmp_path / "X_rank0.json"
    replace_document(path, {"n": 1})
    with pytest.raises(TypeError):
        replace_document(path, {"n": 2, "bad": object()})  # not serialisable: raised before the file is touched
    assert json.loads(path.read_text()) == {"n": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["X_rank0.json"]


def _writer(tmp_path, interval=2.0, build=None):
    taken = []

    def take(elapsed, sequence):
        taken.append((elapsed, sequence))
        return Snapshot(RunMetrics(), None, {}, elapsed, sequence)

    return PartialDocuments(str(tmp_path / "X_rank0.json"), interval, 10.0, take,
                            build or (lambda snap: {"measurement": {"notes": []}, "requests_completed": snap.sequence})), taken


def _tick(t):
    return Tick(float(t), 10.0, 0, 0, {})


def _settle(writer):
    """Until the writer's thread has taken and written the snapshot handed to it (a tick hands it over and
    returns at once; close() drops one not yet started, the final document coming next)."""
    while writer._thread is not None and (writer._job is not None or writer._busy):
        threading.Event().wait(0.001)


def test_the_writer_takes_a_snapshot_every_interval_and_its_thread_ends_at_close(tmp_path):
    (tmp_path / "X_rank0.json").write_text('{"an": "earlier run"}')
    writer, taken = _writer(tmp_path)
    threads = threading.active_count()
    for t in range(1, 6):
        writer.tick(_tick(t))
        _settle(writer)  # (each document written before the next tick comes)
    writer.done()
    writer.tick(_tick(6))  # the window is over: no more
    writer.close()
    assert [s for _, s in taken] == [1, 2] and [e for e, _ in taken] == [2.0, 4.0]
    assert threading.active_count() <= threads and not writer._thread.is_alive()
    doc = json.loads((tmp_path / "X_rank0.json").read_text())
    assert is_partial(doc) and doc["partial_document"]["sequence"] == 2 and doc["verdict"] == INCOMPLETE
    assert writer.kept_as == str(tmp_path / "X_rank0.json.1")  # the earlier file kept once, by the first write
    assert json.loads((tmp_path / "X_rank0.json.1").read_text()) == {"an": "earlier run"}
    assert any("kept as" in n for n in doc["measurement"]["notes"])
    record = writer.record()
    assert record["written"] == 2 and record["snapshot_ms"]["count"] == 2 and record["failed"] == 0
    # the final document replaces the periodic one, unkept (write_outputs keep=not owns())
    assert writer.owns()
    write_document(str(tmp_path / "X_rank0.json"), {"final": True}, keep=not writer.owns())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X_rank0.json", "X_rank0.json.1"]


def test_the_hook_runs_once_per_document_after_it_is_freed(tmp_path):
    """after_write (the run's malloc trim) comes once per document written, or failed, on the writer's
    thread, when the document and its snapshot are no longer held."""
    alive = []
    calls = []

    def take(elapsed, sequence):
        snap = Snapshot(RunMetrics(), None, {}, elapsed, sequence)
        alive.append(weakref.ref(snap))
        return snap

    def hook():
        gc.collect()  # (a reference cycle would be freed here too; a reference held would not)
        calls.append(sum(r() is not None for r in alive))

    writer = PartialDocuments(str(tmp_path / "X_rank0.json"), 1.0, 10.0, take,
                              lambda snap: {"measurement": {"notes": []}}, after_write=hook)
    for t in range(1, 4):
        writer.tick(_tick(t))
        _settle(writer)
        while len(calls) < t:
            threading.Event().wait(0.001)
    writer.close()
    assert writer.written == 3 and calls == [0, 0, 0]


def test_a_tick_while_the_previous_document_is_written_is_skipped_not_queued(tmp_path):
    release, started = threading.Event(), threading.Event()

    def slow(snap):
        started.set()
        release.wait(30)
        return {"measurement": {"notes": []}}

    writer, taken = _writer(tmp_path, interval=1.0, build=slow)
    try:
        writer.tick(_tick(1))
        assert started.wait(30)
        writer.tick(_tick(2))
        writer.tick(_tick(3))
    finally:
        release.set()
        writer.close()
    assert [s for _, s in taken] == [1] and writer.cost.skipped_busy == 2 and writer.written == 1


def test_a_document_that_cannot_be_built_is_counted_and_the_run_goes_on(tmp_path):
    def broken(snap):
        raise KeyError("a bug")

    writer, _ = _writer(tmp_path, interval=1.0, build=broken)
    writer.tick(_tick(1))
    _settle(writer)
    writer.close()
    assert writer.written == 0 and writer.cost.failed == 1 and "KeyError" in writer.cost.last_error
    assert not writer.owns() and not (tmp_path / "X_rank0.json").exists()

    def no_snapshot(elapsed, sequence):
        raise RuntimeError("a bug in the snapshot")

    writer = PartialDocuments(str(tmp_path / "X_rank0.json"), 1.0, 10.0, no_snapshot, lambda snap: {})
    writer.tick(_tick(1))  # (on the scheduler thread: it must not raise into the driver's loop)
    writer.close()
    assert writer.cost.failed == 1 and "RuntimeError" in writer.cost.last_error and writer._thread is None


def _periodic(rank, world, measured_s, start):
    """Rank `rank`'s periodic document: its recorder's snapshot at `measured_s` (the rank went on recording
    after it, and died before its final document)."""
    m = RunMetrics()
    m.open_window(0)
    rng = np.random.default_rng(rank)
    for i in range(30):
        end = int((i + 1) * 1e8)  # one operation and request every 0.1 s
        m.record_io("storage", "read", IOResult(1 << 20, 1 << 20, int(rng.integers(1e5, 1e6)), 90_000, 10_000),
                    end, "decode")
        m.record_request("interactive", end, 2_000_000, 1_000_000, 0, None, None, 10, 100)
        if i == int(measured_s * 10) - 1:
            snap = m.snapshot(at_ns=int(measured_s * 1e9))
    doc = _doc(snap, rank, world, start, start + measured_s)
    return mark_partial(doc, measured_s, 3.0, start + measured_s, 1.0, int(measured_s)), snap


def test_a_periodic_rank_merges_as_incomplete_measured_until_its_last_document():
    """Rank 0 whole (3 s), rank 1 only its periodic document at 1 s: the merge (no --allow-missing-ranks:
    no rank is missing) is INCOMPLETE, names rank 1 as incomplete up to 1 s from its periodic document, adds
    only what that document measured, and does not call the window common."""
    whole = _metrics(np.random.default_rng(1), 30, 30, 0, 3.0)
    rank0 = _doc(whole, 0, 2, 1000.0, 1003.0)
    rank0.update(verdict="PASS", window_fraction=1.0)
    rank1, snap = _periodic(1, 2, 1.0, 1000.0)
    assert rank1["stop_reason"] == PARTIAL_STOP and rank1["window_fraction"] == pytest.approx(1 / 3)
    assert snap.requests.completed == 10  # (the 20 recorded after the snapshot are not in it)
    m = merge_documents([rank0, rank1])
    assert m["missing_ranks"] == [] and m["verdict"] == INCOMPLETE and m["overall_passed"] is False
    assert m["window_fraction"] == pytest.approx(1 / 3)
    [cut] = m["incomplete_ranks"]
    assert cut["rank"] == 1 and cut["document"] == PERIODIC and cut["sequence"] == 1
    assert cut["measured_s"] == pytest.approx(1.0) and cut["measured_until_unix"] == pytest.approx(1001.0)
    assert m["totals"]["requests_completed"] == 30 + 10
    assert m["totals"]["storage_read_bytes"] == whole.tier_op("storage", "read").bytes + 10 * (1 << 20)
    assert "rank(s) 1 incomplete" in m["window"]["kind"] and not m["window"]["kind"].startswith("common")
    assert [(x["rank"], x["status"]) for x in m["ranks_not_to_average"]] == [(1, "incomplete")]
    assert "INCOMPLETE rank 1: measured 1.0 s of the window (its last periodic document" in merged_table(m)
    # a rank cut short by a signal (its final document) is named too, as such
    rank0.update(verdict=INCOMPLETE, window_fraction=0.9)
    assert [x["document"] for x in merge_documents([rank0, rank1])["incomplete_ranks"]] == [CUT_SHORT, PERIODIC]


def test_kv_cache_merge_of_a_periodic_rank_says_how_it_treats_it(tmp_path, capsys):
    whole = _metrics(np.random.default_rng(1), 30, 30, 0, 3.0)
    rank0 = _doc(whole, 0, 2, 1000.0, 1003.0)
    rank1, _ = _periodic(1, 2, 2.0, 1000.0)
    _write_ranks(tmp_path, [rank0, rank1])
    assert main(["merge", str(tmp_path)]) == 0  # not missing: merged without --allow-missing-ranks
    out = capsys.readouterr().out
    assert "INCOMPLETE rank 1: measured 2.0 s of the window (its last periodic document" in out
    os.remove(tmp_path / "kvcache_merged.json")
    assert main(["merge", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["verdict"] == INCOMPLETE and [x["rank"] for x in printed["incomplete_ranks"]] == [1]


@pytest.mark.slow
def test_a_one_process_run_sigkilled_in_its_window_leaves_its_periodic_document(tmp_path, capsys):
    """An OOM kill of a one-process run (SIGKILL: no handler runs) once its first periodic document is there
    (looked for, then killed: no timing race): the document at --output is whole, INCOMPLETE, says up to
    when it measured, and `kv-cache report` reads it as an INCOMPLETE run."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "micro.yaml").write_text("model_configs:\n  micro:\n    name: Micro\n    num_layers: 1\n"
                                         "    hidden_dim: 512\n    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")
    out = tmp_path / "X.json"
    proc = subprocess.Popen([sys.executable, str(root / "kv-cache.py"), "--config", str(tmp_path / "micro.yaml"),
                             "--model", "micro", "--num-users", "4", "--duration", "60", "--gpu-mem-gb", "0",
                             "--cpu-mem-gb", "0", "--generation-mode", "none", "--io-chunk-mb", "1",
                             "--cache-dir", str(tmp_path / "cache"), "--output", str(out),
                             "--partial-results-interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), "no periodic document was written"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    doc = json.loads(out.read_text())
    assert is_partial(doc) and doc["verdict"] == INCOMPLETE and doc["overall_passed"] is False
    assert doc["partial_document"]["measured_until_s"] >= 1 and doc["requests_completed"] == doc["total_requests"]
    assert doc["recorder"]["requests"]["completed"] == doc["requests_completed"]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "STORAGE PERFORMANCE ASSESSMENT: INCOMPLETE" in capsys.readouterr().out


def test_a_snapshot_has_every_attribute_a_recorder_has():
    """RunMetrics.snapshot lists the recorder's state field by field: a field added to the recorder and
    not to the snapshot would be missing from every periodic document (AttributeError at build, or a
    figure silently absent). The snapshot's attributes are the recorder's, none missing."""
    m = RunMetrics()
    m.open_window()
    assert set(vars(m.snapshot())) >= set(vars(m))


def test_audit_says_a_periodic_document_is_not_a_finished_run_and_skips_a_killed_writes_temporary_file(
        tmp_path, capsys):
    """`kv-cache audit` of a rank's periodic document: its checks judge the figures it holds (they may be ok),
    and it says, in the text and in --json, that they are a run's first seconds and not a finished run.
    A SIGKILL while a document was being written leaves its temporary file (`.NAME.XXXXXXXX.tmp.json`, whole
    JSON when the kill came at the fsync): audited as a directory it was taken as one more result, and
    could read OK beside the real file; it is left out and named."""
    from kv_cache.host.files import atomic_target

    doc, _ = _periodic(1, 2, 2.0, 1000.0)
    (tmp_path / "r_rank1.json").write_text(dumps(doc))
    whole = _doc(_metrics(np.random.default_rng(1), 30, 30, 0, 3.0), 0, 2, 1000.0, 1003.0)
    whole.update(verdict="PASS", window_fraction=1.0)
    with pytest.raises(KeyboardInterrupt), atomic_target(tmp_path / "r_rank0.json") as tmp:
        Path(tmp).write_text(dumps(whole))
        leftover = Path(tmp).name
        os.link(tmp, tmp_path / (leftover + ".keep"))  # (as a SIGKILL would leave it: the clean-up does not run)
        raise KeyboardInterrupt
    os.rename(tmp_path / (leftover + ".keep"), tmp_path / leftover)
    assert main(["audit", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"skipped {leftover}: the temporary file of a write killed before its rename" in out
    assert f"{leftover}:" not in out.replace(f"skipped {leftover}:", "") and "(1 file(s)" in out
    assert ("[incomplete] document: a periodic document (verdict INCOMPLETE): its run ended, or was still running, "
            "without its final document; measured until 2.0 s of the 3 s window") in out
    assert main(["audit", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["skipped_temporary_files"] == [leftover]
    assert "a periodic document" in printed["files"]["r_rank1.json"]["document"]
    # a whole run's document says nothing of the kind; a named temporary file is audited (it was asked for)
    (tmp_path / "whole.json").write_text(dumps(whole))
    assert main(["audit", str(tmp_path / "whole.json")]) == 0
    assert "[incomplete]" not in capsys.readouterr().out
    assert main(["audit", str(tmp_path / leftover)]) == 0
    assert "Overall:" in capsys.readouterr().out


def test_the_atomic_write_reads_the_umask_without_changing_it(tmp_path, monkeypatch):
    """The periodic document is written on its own thread while the I/O workers create files: the
    os.umask(0)-then-restore idiom would give a file created by another thread in that moment mode 0666
    & ~0. On Linux the umask is read from /proc/self/status; the file still gets the ordinary mode."""
    from kv_cache.host import files

    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status")
    old = os.umask(0o027)
    try:
        monkeypatch.setattr(files.os, "umask", lambda *_: pytest.fail("os.umask was called"))
        with files.atomic_target(tmp_path / "r.json") as tmp:
            Path(tmp).write_text("{}")
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640


def test_periodic_bytes_on_the_storage_tiers_device_are_said_beside_its_counters(tmp_path, monkeypatch):
    """--output on the storage tier's block device: the periodic documents' bytes, written there during the
    window, are in that device's counters; the results say so (`block_device.periodic_document_bytes`, a
    note) and so does the console's block-device line. On another device, or with none written, nothing."""
    from types import SimpleNamespace

    from kv_cache.benchmarks.standard import run as run_mod
    from kv_cache.render.measurement_section import _block_device_line

    devices = {str(tmp_path / "same"): "vdz", str(tmp_path / "other"): "vdy"}
    monkeypatch.setattr(run_mod.BlockDeviceCounter, "for_path",
                        staticmethod(lambda p: SimpleNamespace(name=devices[str(p)]) if str(p) in devices else None))
    tier = SimpleNamespace(name="vdz")

    def measurement(written):
        return {"block_device": {"name": "vdz", "bytes_read": 0, "bytes_written": 3 << 30, "tool_bytes_read": 0,
                                 "tool_bytes_written": 1 << 30},
                "partial_documents": {"bytes_total": written, "written": 4}, "notes": []}
    m = measurement(48 << 20)
    run_mod._periodic_bytes_on_the_device(m, str(tmp_path / "same" / "r.json"), tier)
    assert m["block_device"]["periodic_document_bytes"] == 48 << 20
    assert "4 of them, 48.0 MiB in all" in m["notes"][0] and "on vdz, the storage tier's block device" in m["notes"][0]
    assert "48.0 MiB are this run's periodic results documents" in "\n".join(_block_device_line(m["block_device"]))
    for path, written in ((tmp_path / "other" / "r.json", 48 << 20), (tmp_path / "same" / "r.json", 0),
                          (tmp_path / "tmpfs" / "r.json", 48 << 20)):
        m = measurement(written)
        run_mod._periodic_bytes_on_the_device(m, str(path), tier)
        assert "periodic_document_bytes" not in m["block_device"] and not m["notes"]
        assert "periodic" not in "\n".join(_block_device_line(m["block_device"]))


def test_compare_warns_that_a_periodic_document_is_not_a_finished_run(tmp_path, capsys):
    """`kv-cache compare` of a finished run and a killed run's periodic document compares them (a new check
    warns and carries on), and says on stderr which one covers only the first seconds of its window."""
    whole = _doc(_metrics(np.random.default_rng(1), 30, 30, 0, 3.0), 0, 1, 1000.0, 1003.0)
    whole.update(verdict="PASS", window_fraction=1.0)
    part, _ = _periodic(0, 1, 2.0, 1000.0)
    (tmp_path / "a.json").write_text(dumps(whole))
    (tmp_path / "b.json").write_text(dumps(part))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    err = capsys.readouterr().err
    assert f"kv-cache compare: warning: {tmp_path / 'b.json'} is a periodic document (verdict INCOMPLETE)" in err
    assert "measured until 2.0 s of the 3 s window" in err and str(tmp_path / "a.json") not in err
