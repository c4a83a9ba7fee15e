"""The CPU of each per-operation bookkeeping step of the storage path, per GiB it rides on (run by hand).

`cpu_per_gib.py` measures the whole data path of the file tiers against fio; its noise on a shared machine
(10-30 % between pairs) hides a step that costs a fraction of a per cent. This measures the steps alone,
in a loop, as CPU time of the process (time.process_time: every thread, so a handoff's two sides count):

- ``chunk_marks``: ChunkMarks.begin (once an operation) and ChunkMarks.add (once a chunk): the window's
  edge accounting of the file and RAM tiers (storage/buffers.py);
- ``deadline_round_trip``: what the remote stores add to every round trip: RunDeadline.begin/end (a lock
  and a dict) and RemoteStats.failover around the call (RunDeadline.state, and the answered_at stamp),
  against calling the same no-op directly (storage/remote.py; Redis: kvstore._call, S3: PartWriter.attempts);
- ``s3_handoff``: an S3 call handed to the store's DaemonPool and waited for with RunDeadline.result (so a
  frozen server cannot hold the worker), against calling it in the worker's thread.

Each is printed in microseconds of CPU a call and in CPU-seconds per GiB at the bytes one call carries
(a `--chunk-mb` chunk; a Redis round trip carries `--pipeline` chunks), beside the data path's own cost
from `cpu_per_gib.py` when its --out file is given (--cpu-json).

    python benchmarks/per_op_costs.py --chunk-mb 16 --cpu-json cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_cache.storage.buffers import ChunkMarks  # noqa: E402
from kv_cache.storage.remote import DaemonPool, RemoteStats, RunDeadline  # noqa: E402

GIB = float(1 << 30)


def cpu_per_call(fn, n: int, repeats: int = 5) -> float:
    """Least CPU seconds a call over `repeats` loops of `n` calls (the least: the machine's other load
    only adds)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn(n)
        best = min(best, (time.process_time() - t) / n)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--pipeline", type=int, default=1, help="chunks a Redis round trip carries")
    ap.add_argument("-n", type=int, default=200_000, help="calls a loop")
    ap.add_argument("--cpu-json", type=Path, default=None, help="cpu_per_gib.py's --out: its figures beside these")
    a = ap.parse_args()
    chunk = a.chunk_mb << 20
    marks = ChunkMarks()

    def begin_loop(n: int) -> None:
        for _ in range(n):
            marks.begin()

    def add_loop(n: int) -> None:
        add = marks.add
        for i in range(n):
            add(i)

    deadline = RunDeadline()
    deadline.opening = False
    deadline.watch(threading.Event())
    stats = RemoteStats()

    def noop() -> None:
        return None

    def direct_loop(n: int) -> None:
        for _ in range(n):
            noop()

    def deadline_loop(n: int) -> None:  # kvstore._call / PartWriter.attempts around a call
        for _ in range(n):
            first = deadline.begin()
            try:
                stats.failover(noop, "x", deadline)
            finally:
                if first:
                    deadline.end()

    pool = DaemonPool(max_workers=1)
    pool.submit(noop).result()  # its thread started

    def handoff_loop(n: int) -> None:  # s3.S3Store._call's waited()
        for _ in range(n):
            deadline.result(pool.submit(noop), "x", stats)

    direct = cpu_per_call(direct_loop, a.n)
    rows = [
        ("chunk_marks.begin (an operation)", cpu_per_call(begin_loop, a.n), chunk),
        ("chunk_marks.add (a chunk)", cpu_per_call(add_loop, a.n), chunk),
        ("deadline + failover (a round trip)", cpu_per_call(deadline_loop, a.n) - direct, chunk * a.pipeline),
        ("s3 handoff to the pool (a call)", cpu_per_call(handoff_loop, max(1000, a.n // 20)) - direct, chunk),
    ]
    pool.shutdown()
    print(f"per-call CPU (least of 5 loops), at {a.chunk_mb} MiB a chunk / part, {a.pipeline} chunk(s) a Redis round trip")
    print("| step | CPU us a call | CPU-s per GiB |")
    print("|---|---|---|")
    out = []
    for name, s, nbytes in rows:
        per_gib = s * GIB / nbytes
        out.append({"step": name, "cpu_us": s * 1e6, "cpu_s_per_gib": per_gib, "bytes_per_call": nbytes})
        print(f"| {name} | {s * 1e6:.2f} | {per_gib:.2e} |")
    if a.cpu_json is not None:
        print("\nthe data path's own (cpu_per_gib.py, kv-cache):")
        for r in json.loads(a.cpu_json.read_text()):
            share = ", ".join(f"{o['step'].split(' (')[0]} {100 * o['cpu_s_per_gib'] / r['kv_cpu_s_per_gib']:.3f} %"
                              for o in out[:2])
            print(f"  {r['dir']} {r['op']} procs {r['procs']}: {r['kv_cpu_s_per_gib']:.4f} CPU-s/GiB; marks' share: {share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
