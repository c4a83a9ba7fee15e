#!/usr/bin/env python3
"""kv-cache's storage tier against fio on the same device, files and settings (run by hand, not in CI).

Suites (``--suites``, default all three):

* ``cli``: the real ``kv-cache`` CLI in pure-storage configurations (GPU 0, CPU 0, generation none,
  no multi-turn, no prefix caching), a write-heavy one (every context >= 10,000 tokens: prefill-only,
  entries of 234..937 MiB with tiny-1b) and a read-heavy one (contexts < 10,000 tokens, each entry
  written once and read 1 + ceil(generated/32) = 26..101 times; 59..234 MiB), each paired with a fio
  job of the same file sizes, chunk (``bs``), O_DIRECT, queue depth (kv-cache ``--io-workers`` =
  fio ``numjobs`` of synchronous ``pvsync`` jobs) and one fsync per written file; runs alternate
  kv-cache, fio, kv-cache, fio ... (``--pairs`` pairs per workload).
* ``isolated``: pure write and pure read through ``kv_cache.storage`` itself (FileStore +
  WorkerBuffers, N threads; ``pure_storage.py``) against fio; for reads fio reads the very files
  kv-cache's store wrote.
* ``throttle``: the differentiation check.  Each tool runs once unthrottled and once inside a cgroup v1
  blkio throttle of ``--throttle-fraction`` (default 1/4) of fio's measured bandwidth on the device;
  prints both tools' fast/slow ratios.

Prints GiB/s of both tools per pair, kv-cache/fio ratios (min/median/max), kv-cache's CPU-seconds per
GiB moved, achieved queue depth and peak RSS (``/usr/bin/time -v``), and writes everything (raw runs
included) to ``--out`` (JSON); per-run logs, results JSON and fio job files go to ``--logs``.

Example (about 17 minutes with the defaults; ``--suites cli,throttle --pairs 3`` takes about 7):

    python benchmarks/vs_fio.py /mnt/nvme
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import kv_cache  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _bench as B  # noqa: E402
import pure_storage  # noqa: E402

from kv_cache.storage import FileStore  # noqa: E402

GOAL_RATIO = 0.95
SUITES = ("cli", "isolated", "throttle")


# ------------------------------------------------------------------------------------------ configs
def persona_yaml(context_max: int, generation_max: int) -> str:
    """All three personas identical: contexts uniform in [max//4, max] (the workload draws
    randint(c//4, c)), generation in [g//4, g], no think time (a closed loop that never idles)."""
    line = (f"{{context_range: [{context_max}, {context_max}], generation_range: [{generation_max}, "
            f"{generation_max}], think_time_range: [0.0, 0.0]}}")
    return "user_templates:\n" + "".join(f"  {p}: {line}\n" for p in ("chatbot", "coding", "document"))


class Workload:
    def __init__(self, name: str, context_max: int, generation_max: int, bpt: int, direction: str):
        self.name = name
        self.context_max = context_max
        self.generation_max = generation_max
        self.direction = direction  # the direction compared with fio: 'write' or 'read'
        self.lo_tokens = max(1, context_max // 4)
        self.hi_tokens = context_max
        # entry file = 4 KiB header + payload padded to 4 KiB (fio rounds file sizes to its bs)
        self.lo_bytes = B.HEADER + B.round_up(self.lo_tokens * bpt, 4096)
        self.hi_bytes = B.HEADER + B.round_up(self.hi_tokens * bpt, 4096)

    def describe(self) -> str:
        return (f"{self.name}: contexts {self.lo_tokens}..{self.hi_tokens} tokens, files "
                f"{self.lo_bytes / B.MIB:.0f}..{self.hi_bytes / B.MIB:.0f} MiB, generation "
                f"{max(1, self.generation_max // 4)}..{self.generation_max} tokens")


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.qd = a.qd
        self.chunk = a.chunk_mb * B.MIB
        self.bpt = B.model_bytes_per_token(a.model)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.target = Path(a.directory).resolve()
        self.work = self.target / f"kv-vs-fio-{stamp}-{os.getpid()}"
        self.logs = Path(a.logs or f"vs_fio_logs_{stamp}").resolve()
        self.out = Path(a.out or f"vs_fio_results_{stamp}.json").resolve()
        self.write = Workload("write-heavy", a.write_context, 1, self.bpt, "write")
        self.read = Workload("read-heavy", a.read_context, a.read_generation, self.bpt, "read")
        if self.write.lo_tokens < 10_000:
            raise SystemExit("--write-context must be >= 40000 (contexts >= 10,000 tokens are prefill-only)")
        if self.read.hi_tokens >= 10_000:
            raise SystemExit("--read-context must be < 10000 (longer contexts are never read back)")
        self.results: dict = {}
        self.seq = 0
        from kv_cache.host.blockdev import BlockDeviceCounter  # noqa: PLC0415

        bd = BlockDeviceCounter.for_path(self.target)
        self.disk = bd.name if bd is not None else None
        self.fio_hugetlb = False  # decided in run()

    # ---------------------------------------------------------------------------- plumbing
    def name(self, label: str) -> str:
        self.seq += 1
        return f"{self.seq:02d}-{label}"

    def say(self, msg: str) -> None:
        print(msg, flush=True)

    @staticmethod
    def req(r: dict, direction: str) -> str:
        return B.fmt(r.get(f"device_avg_{direction}_request_kib"), 0)

    def kv_args(self, wl: Workload, cfg: Path, cache_dir: Path, duration: float) -> list[str]:
        return [
            "--config", str(cfg), "--model", self.a.model,
            "--num-users", str(2 * self.qd), "--io-workers", str(self.qd),
            "--io-chunk-mb", str(self.a.chunk_mb), "--io-mode", "direct",
            "--duration", f"{duration:g}", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
            "--generation-mode", "none", "--disable-multi-turn", "--disable-prefix-caching",
            "--performance-profile", "throughput", "--seed", str(self.a.seed),
            "--cache-dir", str(cache_dir), "--log-level", "WARNING",
        ]

    def kv_run(self, wl: Workload, label: str, throttle: B.Throttle | None = None) -> dict:
        B.settle(self.a.settle)
        cfg = self.work / f"{wl.name}.yaml"
        r = B.run_kv_cache(self.kv_args(wl, cfg, self.work / "kv", self.a.duration), self.name(label),
                           self.logs, throttle, disk=self.disk)
        r["gibps"] = r[f"{wl.direction}_gibps"]
        r["total_gibps"] = r["read_gibps"] + r["write_gibps"]
        return r

    def fio_run(self, wl: Workload, label: str, throttle: B.Throttle | None = None) -> dict:
        """fio counterpart of ``wl``.  Read-heavy: each job first writes one new file of the workload's
        sizes (as each kv-cache worker's first request writes its entry), then reads laid-out files."""
        B.settle(self.a.settle)
        d = self.work / "fio"
        d.mkdir(exist_ok=True)
        common = {"qd": self.qd, "chunk": self.chunk, "duration": self.a.duration, "directory": str(d),
                  "size_range": (wl.lo_bytes, wl.hi_bytes), "hugetlb": self.fio_hugetlb}
        if wl.direction == "write":
            # enough file names that no job wraps around within the run (unused ones stay empty)
            nrfiles = max(4, math.ceil(self.a.duration * 4 * B.GIB / self.qd / wl.lo_bytes) + 2)
            r = B.run_fio(B.fio_jobfile("write", nrfiles=nrfiles, **common), self.name(label), self.logs,
                          throttle, disk=self.disk)
        else:
            # lay the files out first (untimed, outside any throttle), then read them
            nf = self.a.read_files_per_job
            B.run_fio(B.fio_jobfile("read", nrfiles=nf, create_only=True, unlink=False, jobname="read", **common),
                      self.name(label + "-layout"), self.logs)
            B.settle(self.a.settle)
            r = B.run_fio(B.fio_jobfile("read", nrfiles=nf, prewrite=True, jobname="read", **common),
                          self.name(label), self.logs, throttle, disk=self.disk)
        for f in d.iterdir():  # fio's files in our scratch directory (the prewritten ones are kept by fio)
            f.unlink()
        r["gibps"] = r[f"{wl.direction}_gibps"]
        r["total_gibps"] = r["read_gibps"] + r["write_gibps"]
        return r

    # ---------------------------------------------------------------------------- suites
    def suite_cli(self) -> None:
        self.say(f"\n== cli: kv-cache CLI vs fio, {self.a.pairs} alternating pairs per workload, "
                 f"{self.a.duration:g} s each ==")
        out: dict = {}
        for wl in (self.write, self.read):
            out[wl.name] = {"workload": wl.describe(), "pairs": []}
        for i in range(self.a.pairs):
            for wl in (self.write, self.read):
                kv = self.kv_run(wl, f"cli-{wl.name}-kv")
                fio = self.fio_run(wl, f"cli-{wl.name}-fio")
                ratio = kv["gibps"] / fio["gibps"] if fio["gibps"] else None
                total_ratio = kv["total_gibps"] / fio["total_gibps"] if fio["total_gibps"] else None
                out[wl.name]["pairs"].append({"kv": kv, "fio": fio, "ratio": ratio, "total_ratio": total_ratio})
                extra = fextra = ""
                if wl.direction == "read":
                    extra = f" (+ {kv['write_gibps']:.3f} write)"
                    fextra = f" (+ {fio['write_gibps']:.3f} write)"
                self.say(f"  pair {i + 1} {wl.name:11s} {wl.direction:5s} GiB/s: kv-cache {kv['gibps']:.3f}"
                         f"{extra}  fio {fio['gibps']:.3f}{fextra}  ratio {B.fmt(ratio)}  "
                         f"[kv QD {kv['achieved_queue_depth'][wl.direction]:.2f}, "
                         f"{kv['cpu_seconds_per_gib']:.4f} CPU-s/GiB, RSS {kv['peak_rss_mib']:.0f} MiB; "
                         f"avg request KiB kv {self.req(kv, wl.direction)} fio {self.req(fio, wl.direction)}]")
        for wl in (self.write, self.read):
            self._summarise(out[wl.name], wl.direction)
        self.results["cli"] = out

    def suite_isolated(self) -> None:
        self.say(f"\n== isolated: kv_cache.storage (pure_storage.py, {self.qd} threads) vs fio, same files ==")
        out: dict = {}
        d = self.work / "iso"
        d.mkdir(exist_ok=True)
        store = FileStore(d, self.chunk, fsync=True, io_mode="direct")
        try:
            # pure write: new entries of the write-heavy sizes
            wl = self.write
            pairs = []
            for i in range(self.a.pairs):
                B.settle(self.a.settle)
                d0 = B.disk_counters(self.disk)
                kv = pure_storage.write_phase(store, self.qd, self.a.duration, wl.lo_bytes - B.HEADER,
                                              wl.hi_bytes - B.HEADER, self.a.seed + i)
                kv.update(B.disk_delta(d0, B.disk_counters(self.disk)))
                fio = self.fio_run(wl, "iso-write-fio")
                ratio = kv["gibps"] / fio["gibps"] if fio["gibps"] else None
                pairs.append({"kv": kv, "fio": fio, "ratio": ratio})
                self.say(f"  pair {i + 1} pure write GiB/s: kv-cache {kv['gibps']:.3f}  fio {fio['gibps']:.3f}  "
                         f"ratio {B.fmt(ratio)}  [kv QD {kv['achieved_queue_depth']:.2f}, "
                         f"{kv['cpu_seconds_per_gib']:.4f} CPU-s/GiB; avg request KiB kv "
                         f"{self.req(kv, 'write')} fio {self.req(fio, 'write')}]")
            out["write"] = {"pairs": pairs}
            self._summarise(out["write"], "write")
            # pure read: kv-cache's store writes the files once; both tools then read exactly those.
            # Entry sizes are whole chunks minus the header, so fio (which skips a file's tail smaller
            # than bs) reads every byte too.
            wl = self.read
            lo = max(1, round(wl.lo_bytes / self.chunk)) * self.chunk - B.HEADER
            hi = max(1, round(wl.hi_bytes / self.chunk)) * self.chunk - B.HEADER
            keys = pure_storage.populate(store, self.qd, self.a.read_files_per_job, lo, hi, self.a.seed,
                                         whole_chunks=True)
            files = [[str(store.path_of(k)) for k in ks] for ks in keys]
            pairs = []
            for i in range(self.a.pairs):
                B.settle(self.a.settle)
                d0 = B.disk_counters(self.disk)
                kv = pure_storage.read_phase(store, keys, self.a.duration, self.a.seed)
                kv.update(B.disk_delta(d0, B.disk_counters(self.disk)))
                B.settle(self.a.settle)
                job = B.fio_jobfile("read", qd=self.qd, chunk=self.chunk, duration=self.a.duration,
                                    per_job_files=files, unlink=False, hugetlb=self.fio_hugetlb)
                fio = B.run_fio(job, self.name("iso-read-fio"), self.logs, disk=self.disk)
                fio["gibps"] = fio["read_gibps"]
                ratio = kv["gibps"] / fio["gibps"] if fio["gibps"] else None
                pairs.append({"kv": kv, "fio": fio, "ratio": ratio})
                self.say(f"  pair {i + 1} pure read  GiB/s: kv-cache {kv['gibps']:.3f}  fio {fio['gibps']:.3f}  "
                         f"ratio {B.fmt(ratio)}  [kv QD {kv['achieved_queue_depth']:.2f}, "
                         f"{kv['cpu_seconds_per_gib']:.4f} CPU-s/GiB; avg request KiB kv "
                         f"{self.req(kv, 'read')} fio {self.req(fio, 'read')}]")
            out["read"] = {"pairs": pairs, "files": sum(len(f) for f in files),
                           "file_mib": [lo / B.MIB + 4 / 1024, hi / B.MIB + 4 / 1024]}
            self._summarise(out["read"], "read")
        finally:
            store.close()
        self.results["isolated"] = out

    def suite_throttle(self) -> None:
        problem = B.throttle_problem()
        dev = B.whole_disk_devnum(self.target)
        if problem or dev is None:
            why = problem or f"{self.target} is not on a block device"
            self.say(f"\n== throttle: skipped ({why}) ==")
            self.results["throttle"] = {"skipped": why}
            return
        devnum, devname = dev
        frac = self.a.throttle_fraction
        self.say(f"\n== throttle: unthrottled vs cgroup v1 blkio throttle at {frac:g} x fio's bandwidth "
                 f"on {devname} ({devnum}) ==")
        out: dict = {"device": devname, "devnum": devnum, "fraction": frac}
        base = {}
        for wl in (self.write, self.read):
            prior = self.results.get("cli", {}).get(wl.name, {}).get("summary", {}).get("fio_gibps", {})
            base[wl.direction] = prior.get("median")
        for wl in (self.write, self.read):
            r: dict = {}
            kv_fast = self.kv_run(wl, f"thr-{wl.name}-kv-fast")
            fio_fast = self.fio_run(wl, f"thr-{wl.name}-fio-fast")
            if base.get(wl.direction) is None:  # no cli suite before: this run measures the device
                base[wl.direction] = fio_fast["gibps"]
            # only the direction under test is limited: the read-heavy runs' few writes (each worker's
            # first entry) stay unthrottled, so both tools' slow runs are set by the read limit alone
            limit = int(frac * base[wl.direction] * B.GIB)
            rbps, wbps = (limit, None) if wl.direction == "read" else (None, limit)
            with B.Throttle(devnum, rbps, wbps) as thr:
                kv_slow = self.kv_run(wl, f"thr-{wl.name}-kv-slow", thr)
                fio_slow = self.fio_run(wl, f"thr-{wl.name}-fio-slow", thr)
            kv_ratio = kv_fast["gibps"] / kv_slow["gibps"] if kv_slow["gibps"] else None
            fio_ratio = fio_fast["gibps"] / fio_slow["gibps"] if fio_slow["gibps"] else None
            rel = kv_ratio / fio_ratio if kv_ratio and fio_ratio else None
            # The throttled runs are steady (the limit sets them); an unthrottled run on a shared device
            # is not.  So "fast" is also taken as the median of every unthrottled run of the tool on this
            # workload in this invocation (the cli pairs + this one), and the verdict uses that.
            pairs = self.results.get("cli", {}).get(wl.name, {}).get("pairs", [])
            kv_med = B.mmm([kv_fast["gibps"]] + [p["kv"]["gibps"] for p in pairs])["median"]
            fio_med = B.mmm([fio_fast["gibps"]] + [p["fio"]["gibps"] for p in pairs])["median"]
            kv_ratio_m = kv_med / kv_slow["gibps"] if kv_slow["gibps"] else None
            fio_ratio_m = fio_med / fio_slow["gibps"] if fio_slow["gibps"] else None
            rel_m = kv_ratio_m / fio_ratio_m if kv_ratio_m and fio_ratio_m else None
            r = {"throttle_read_bps": rbps, "throttle_write_bps": wbps,
                 "kv_fast": kv_fast, "kv_slow": kv_slow, "fio_fast": fio_fast, "fio_slow": fio_slow,
                 "kv_fast_over_slow": kv_ratio, "fio_fast_over_slow": fio_ratio,
                 "kv_ratio_over_fio_ratio": rel,
                 "unthrottled_runs": len(pairs) + 1,
                 "kv_fast_median_gibps": kv_med, "fio_fast_median_gibps": fio_med,
                 "kv_fast_median_over_slow": kv_ratio_m, "fio_fast_median_over_slow": fio_ratio_m,
                 "kv_ratio_over_fio_ratio_median_fast": rel_m,
                 "pass": rel_m is not None and rel_m >= GOAL_RATIO}
            out[wl.name] = r
            self.say(f"  {wl.name:11s} {wl.direction:5s} limit {limit / B.GIB:.3f} GiB/s: one run each:"
                     f" kv-cache {kv_fast['gibps']:.3f} / {kv_slow['gibps']:.3f} = {B.fmt(kv_ratio, 2)}x,"
                     f" fio {fio_fast['gibps']:.3f} / {fio_slow['gibps']:.3f} = {B.fmt(fio_ratio, 2)}x"
                     f" (kv/fio {B.fmt(rel)})\n"
                     f"  {'':17s} fast = median of {len(pairs) + 1} unthrottled runs: kv-cache {B.fmt(kv_med)} /"
                     f" {kv_slow['gibps']:.3f} = {B.fmt(kv_ratio_m, 2)}x, fio {B.fmt(fio_med)} /"
                     f" {fio_slow['gibps']:.3f} = {B.fmt(fio_ratio_m, 2)}x; kv/fio {B.fmt(rel_m)}"
                     f" ({'PASS' if r['pass'] else 'FAIL'} >= {GOAL_RATIO})")
        self.results["throttle"] = out

    # ---------------------------------------------------------------------------- fio's buffers
    def want_hugetlb(self) -> bool:
        mode = self.a.fio_mem
        if mode == "default":
            return False
        if mode == "hugetlb":
            return True
        # auto: kv-cache's buffers get transparent huge pages here, so fio's must be huge pages too
        return B.thp_mode() in ("always", "madvise") and os.geteuid() == 0

    def hugetlb_pages_needed(self) -> int:
        # a read-heavy fio run has two phases of qd jobs (prewrite + read); each job's buffer is one chunk
        hp = B.hugepage_bytes()
        return 2 * self.qd * (-(-self.chunk // hp) + 1) + 16

    def memory_note(self, pages: B.HugePages | None) -> str:
        thp = B.thp_mode()
        self.results["settings"]["transparent_hugepages"] = thp
        if self.fio_hugetlb:
            return (f"  buffers: kv-cache chunk buffers advised MADV_HUGEPAGE (THP {thp}); fio iomem=shmhuge "
                    f"({pages.got} hugetlb pages reserved for the run, restored after)")
        if pages is not None:
            msg = (f"  WARNING: could not reserve {pages.count} hugetlb pages for fio (got {pages.got}); fio uses "
                   f"4 KiB-page buffers, so its requests may be capped by the device's max_segments")
            if self.a.fio_mem == "hugetlb":
                raise SystemExit(msg.strip())
            return msg
        return (f"  buffers: fio default (4 KiB pages); kv-cache THP mode {thp}"
                + ("" if thp == "never" else " - kv-cache may issue larger requests than fio: "
                   "use --fio-mem hugetlb (root) for a like-for-like reference"))

    # ---------------------------------------------------------------------------- summary
    def _summarise(self, block: dict, direction: str) -> None:
        pairs = block["pairs"]
        kv = B.mmm([p["kv"]["gibps"] for p in pairs])
        fio = B.mmm([p["fio"]["gibps"] for p in pairs])
        ratio = B.mmm([p["ratio"] for p in pairs])
        s = {
            "direction": direction,
            "kv_gibps": kv,
            "fio_gibps": fio,
            "ratio": ratio,
            "ratio_of_medians": kv["median"] / fio["median"] if fio["median"] else None,
            "total_ratio": B.mmm([p.get("total_ratio") for p in pairs]),
            "kv_cpu_seconds_per_gib": B.mmm([p["kv"].get("cpu_seconds_per_gib") for p in pairs]),
            "fio_cpu_seconds_per_gib": B.mmm([p["fio"].get("cpu_seconds_per_gib") for p in pairs]),
        }
        qd = [p["kv"].get("achieved_queue_depth") for p in pairs]
        s["kv_achieved_queue_depth"] = B.mmm([q[direction] if isinstance(q, dict) else q for q in qd])
        rss = [p["kv"].get("peak_rss_mib") for p in pairs if "peak_rss_mib" in p["kv"]]
        if rss:
            s["kv_peak_rss_mib"] = B.mmm(rss)
        s["pass"] = ratio["median"] is not None and ratio["median"] >= GOAL_RATIO
        block["summary"] = s
        rss_txt = f", peak RSS max {s['kv_peak_rss_mib']['max']:.0f} MiB" if rss else ""
        if direction == "read" and s["total_ratio"]["n"]:
            rss_txt += f"; read+write ratio median {B.fmt(s['total_ratio']['median'])}"
        self.say(f"  -> {direction}: kv-cache median {B.fmt(kv['median'])} GiB/s, fio median "
                 f"{B.fmt(fio['median'])} GiB/s; ratio min/median/max {B.fmt(ratio['min'])} / "
                 f"{B.fmt(ratio['median'])} / {B.fmt(ratio['max'])} ({'PASS' if s['pass'] else 'FAIL'} >= "
                 f"{GOAL_RATIO}); kv-cache CPU-s/GiB median {B.fmt(s['kv_cpu_seconds_per_gib']['median'], 4)}"
                 f" (fio {B.fmt(s['fio_cpu_seconds_per_gib']['median'], 4)}), achieved QD median "
                 f"{B.fmt(s['kv_achieved_queue_depth']['median'], 2)}{rss_txt}")

    def run(self, suites: list[str]) -> int:
        self.work.mkdir(parents=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.work / "kv").mkdir()
        for wl in (self.write, self.read):
            (self.work / f"{wl.name}.yaml").write_text(persona_yaml(wl.context_max, wl.generation_max))
            shutil.copy(self.work / f"{wl.name}.yaml", self.logs / f"{wl.name}.yaml")
        self.results["settings"] = {
            "directory": str(self.target), "queue_depth": self.qd, "chunk_bytes": self.chunk,
            "duration_s": self.a.duration, "pairs": self.a.pairs, "model": self.a.model,
            "bytes_per_token": self.bpt, "seed": self.a.seed, "settle_s": self.a.settle,
            "workloads": [self.write.describe(), self.read.describe()],
            "kv_cache_cmd": B.kv_cache_cmd(), "fio": B.fio_version(), "kernel": platform.release(),
            "cpus": os.cpu_count(), "started": datetime.now().isoformat(timespec="seconds"),
        }
        self.say(f"kv-cache vs fio on {self.target}: queue depth {self.qd}, {self.a.chunk_mb} MiB chunks, "
                 f"O_DIRECT, {self.a.duration:g} s runs, model {self.a.model} ({self.bpt} B/token); "
                 f"{B.fio_version()}\n  " + "\n  ".join(self.results["settings"]["workloads"])
                 + f"\n  logs: {self.logs}")
        t0 = time.time()
        pages = B.HugePages(self.hugetlb_pages_needed()) if self.want_hugetlb() else None
        try:
            if pages is not None:
                pages.__enter__()
                self.fio_hugetlb = pages.got >= pages.count
            self.results["settings"]["fio_hugetlb_buffers"] = self.fio_hugetlb
            self.say(self.memory_note(pages))
            for s in suites:
                getattr(self, f"suite_{s}")()
        finally:
            if pages is not None:
                pages.__exit__(None, None, None)
            shutil.rmtree(self.work, ignore_errors=True)  # our own fresh directory only
            self.results["elapsed_s"] = time.time() - t0
            self.out.write_text(json.dumps(self.results, indent=1, default=str))
        self.say(f"\nresults: {self.out} ({self.results['elapsed_s']:.0f} s)")
        verdicts = []
        for s in ("cli", "isolated"):
            for k, v in self.results.get(s, {}).items():
                if isinstance(v, dict) and "summary" in v:
                    verdicts.append((f"{s} {k}", v["summary"]["pass"]))
        for k, v in self.results.get("throttle", {}).items():
            if isinstance(v, dict) and "pass" in v:
                verdicts.append((f"throttle {k}", v["pass"]))
        for label, ok in verdicts:
            self.say(f"  {'PASS' if ok else 'FAIL'}  {label}")
        return 0 if all(ok for _, ok in verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("directory", help="a directory on the device under test (a scratch subdirectory is used)")
    ap.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {', '.join(SUITES)}")
    ap.add_argument("--qd", type=int, default=8, help="queue depth: kv-cache --io-workers = fio numjobs (8)")
    ap.add_argument("--chunk-mb", type=int, default=16, help="MiB per pwritev/preadv = fio bs (16)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per run (15)")
    ap.add_argument("--pairs", type=int, default=5,
                    help="alternating kv-cache/fio pairs per workload (5; at least 3 for a median)")
    ap.add_argument("--model", default="tiny-1b", help="kv-cache model (tiny-1b: 24,576 bytes/token)")
    ap.add_argument("--write-context", type=int, default=40000,
                    help="write-heavy persona context_range max, tokens (>= 40000; 40000)")
    ap.add_argument("--read-context", type=int, default=9999,
                    help="read-heavy persona context_range max, tokens (< 10000; 9999)")
    ap.add_argument("--read-generation", type=int, default=3200,
                    help="read-heavy generation_range max: reads per entry = 1 + ceil(gen/32) (3200)")
    ap.add_argument("--read-files-per-job", type=int, default=2, help="fio read: files per job (2)")
    ap.add_argument("--throttle-fraction", type=float, default=0.25, help="throttle = this x fio GiB/s")
    ap.add_argument("--fio-mem", choices=("auto", "hugetlb", "default"), default="auto",
                    help="fio's I/O buffers: hugetlb pages (iomem=shmhuge, like kv-cache's THP buffers; "
                         "auto = when kv-cache gets THP and we are root) or fio's default")
    ap.add_argument("--settle", type=float, default=2.0, help="sync + sleep seconds before each run (2)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", help="summary JSON (default vs_fio_results_<time>.json)")
    ap.add_argument("--logs", help="directory for per-run logs (default vs_fio_logs_<time>)")
    a = ap.parse_args(argv)
    suites = [s.strip() for s in a.suites.split(",") if s.strip()]
    bad = [s for s in suites if s not in SUITES]
    if bad or a.pairs < 1 or a.qd < 1:
        ap.error(f"bad --suites {bad}" if bad else "--pairs and --qd must be >= 1")
    B.require_tools()
    if not Path(a.directory).is_dir():
        ap.error(f"{a.directory} is not a directory")
    lock = B.exclusive("benchmarks/vs_fio.py")
    try:
        return Bench(a).run(suites)
    finally:
        lock.close()


if __name__ == "__main__":
    sys.exit(main())
