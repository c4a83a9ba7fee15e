"""Where a run's memory goes (run by hand, never in CI): the CLI in-process, with a thread that samples, every
`--every` seconds, the RSS, pymalloc's arenas (`sys._debugmallocstats`), Python's allocated blocks, glibc's
main-arena in-use / free / mmapped bytes (`mallinfo2`) and, after `--warm` s, the gc-tracked objects by type
that grew since the first such sample. What grows tells which allocator holds it: Python objects (blocks,
arenas), malloc's in-use bytes (buffers, arrays), or malloc's free space (fragmentation, not yet trimmed).

    python benchmarks/memory_probe.py /dev/shm 480 -- --config benchmarks/soak_small_requests.yaml \
        --generation-mode none --request-rate 120 --storage-capacity-gb 1
    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/memory_probe.py /dev/shm 480 -- ...   # glibc's fixed threshold

Flags after `--` go to kv-cache (after --model tiny-1b --num-users 32 --cpu-mem-gb 0.25 --gpu-mem-gb 0 --seed 1).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kv_cache.cli import main as kv_cache_main  # noqa: E402  (after the path)


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        return libc.mallinfo2
    except (OSError, AttributeError):
        return None


def pymalloc_arenas() -> str:
    """`# arenas allocated current` of sys._debugmallocstats (it writes to fd 2: read through a pipe)."""
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    os.close(w)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    os.set_blocking(r, False)
    data = b""
    try:
        while chunk := os.read(r, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    os.close(r)
    m = re.search(rb"# arenas allocated current\s*=\s*([\d,]+)", data)
    return m.group(1).decode() if m else "?"


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:"))


def sampler(every: float, warm: float, t0: float) -> None:
    info, base = _mallinfo(), None
    while True:
        el = time.monotonic() - t0
        line = f"{el:6.0f} s RSS {rss_mib():7.1f} MiB arenas {pymalloc_arenas()} blocks {sys.getallocatedblocks()}"
        if info is not None:
            mi = info()
            line += (f" malloc in-use {mi.uordblks / 2**20:.1f} free {mi.fordblks / 2**20:.1f} "
                     f"mmapped {mi.hblkhd / 2**20:.1f} MiB")
        if el >= warm:
            now = Counter(type(o).__name__ for o in gc.get_objects())
            if base is None:
                base = now
            else:
                line += " | grown: " + ", ".join(f"{k}+{v}" for k, v in (now - base).most_common(8))
        print(line, flush=True)
        time.sleep(every)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path)
    p.add_argument("duration", type=int)
    p.add_argument("--every", type=float, default=30.0)
    p.add_argument("--warm", type=float, default=90.0)
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    threading.Thread(target=sampler, args=(args.every, args.warm, time.monotonic()), daemon=True).start()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rc = kv_cache_main(["--model", "tiny-1b", "--num-users", "32", "--duration", str(args.duration),
                            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0.25", "--seed", "1", "--cache-dir",
                            f"{tmp}/cache", "--output", f"{tmp}/r.json", *extra])
    print("exit", rc)


if __name__ == "__main__":
    main()
