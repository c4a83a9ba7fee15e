"""CPU-seconds per GiB: kv-cache's storage engine (and, with ``--cli``, the CLI) against fio (run by hand).

For each directory (ext4: O_DIRECT; /dev/shm: buffered, as kv-cache runs there), each direction (write,
read) and each process count (1, 4), runs in alternating pairs (kv-cache, fio, kv-cache, fio, ...: the
same drift of a shared machine in both):

- kv-cache: `pure_storage.py` (FileStore + WorkerBuffers: the CLI's data path, nothing else), P processes
  of QD/P threads; CPU = each process's own CPU over its timed phase (getrusage), summed;
- fio: one job file of QD pvsync jobs (processes), the same bs, direct=1 on ext4 and 0 on /dev/shm, one
  fsync per written file; CPU = fio's usr+sys (GNU time, the whole run: start-up, file layout and the
  read prewrite included, with its bytes), and its timed jobs' own (fio's usr_cpu + sys_cpu over each
  job's runtime, per GiB of the direction), which compares with kv-cache's timed-phase figure.

- with ``--cli``, a third contender in each pair (engine, fio, CLI, ...): the real CLI (``python -m
  kv_cache``) on the same directory, ``--gpu-mem-gb 0 --cpu-mem-gb 0 --generation-mode none``, no multi-turn,
  no prefix caching, ``--processes P`` of ``--io-workers QD/P`` each, vs_fio.py's personas: for ``write``
  every context >= 10,000 tokens (prefill-only: entries written, none read back), for ``read`` contexts
  < 10,000 tokens each read 1 + ceil(generated/32) times after its one write (mostly reads); GiB/s = the
  window's storage bandwidth of the direction, CPU = ``measurement.process_cpu_seconds`` (the ranks' own,
  from the window's start; the launcher of ``--processes`` is not in it), per GiB of all the window's
  storage bytes (``measurement.cpu_seconds_per_gib``).

Prints GiB/s and CPU-s/GiB for both (each), their ratio (goal: kv-cache <= 2x fio on O_DIRECT), and the per-core
ceiling the measured CPU cost implies: 1 / (CPU-s/GiB) GiB/s per busy core, and the cores (processes,
where one process is GIL-bound near one core) needed for 70 GiB/s.

    python benchmarks/cpu_per_gib.py /tmp /dev/shm --qd 8 --duration 8 --pairs 2 [--cli]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

from kv_cache.metrics.stats import median  # noqa: E402

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


def kv(op: str, d: Path, procs: int, qd: int, a) -> dict:
    per = max(1, qd // procs)
    cmds = [[sys.executable, str(HERE / "pure_storage.py"), op, str(d), "--workers", str(per), "--chunk-mb",
             str(a.chunk_mb), "--duration", str(a.duration), "--min-mib", str(a.entry_mib), "--max-mib",
             str(a.entry_mib), "--io-mode", "direct" if not str(d).startswith("/dev/shm") else "buffered",
             "--seed", str(i), "--files-per-worker", "2"] for i in range(procs)]
    ps = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in cmds]
    outs = [json.loads(p.communicate()[0]) for p in ps]
    moved = sum(o["bytes"] for o in outs) / B.GIB
    cpu = sum(o["cpu_seconds"] for o in outs)
    return {"gibps": sum(o["gibps"] for o in outs), "cpu_s_per_gib": cpu / moved if moved else None}


def fio(op: str, d: Path, qd: int, a, logs: Path, n: int) -> dict:
    chunk = a.chunk_mb * MIB
    size = a.entry_mib * MIB
    job = B.fio_jobfile(op, qd=qd, chunk=chunk, duration=a.duration, directory=str(d), size_range=(size, size),
                        prewrite=op == "read")
    if str(d).startswith("/dev/shm"):
        job = job.replace("direct=1", "direct=0")
    r = B.run_fio(job, f"{n:02d}-fio-{op}", logs)
    return {"gibps": r[f"{op}_gibps"], "cpu_s_per_gib": r["cpu_seconds_per_gib"],
            "job_cpu_s_per_gib": fio_job_cpu(Path(r["json"]), op)}


def cli(op: str, d: Path, procs: int, qd: int, a, logs: Path, n: int) -> dict:
    """The real CLI, pure storage: the write-heavy (op write) or read-heavy (op read) run of vs_fio.py."""
    import vs_fio  # noqa: PLC0415  (its personas; imported only with --cli)

    ctx, gen = (a.write_context, 1) if op == "write" else (a.read_context, a.read_generation)
    cfg = logs / f"cli-{op}.yaml"
    cfg.write_text(vs_fio.persona_yaml(ctx, gen))
    shm = str(d).startswith("/dev/shm")
    args = ["--config", str(cfg), "--model", a.model, "--num-users", str(2 * qd), "--processes", str(procs),
            "--io-workers", str(max(1, qd // procs)), "--io-chunk-mb", str(a.chunk_mb),
            "--io-mode", "buffered" if shm else "direct", "--duration", f"{a.duration:g}",
            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--disable-multi-turn",
            "--disable-prefix-caching", "--performance-profile", "throughput", "--seed", str(42 + n),
            "--storage-capacity-gb", f"{a.cli_capacity_gb:g}", "--cache-dir", str(d / "kv"),
            "--log-level", "WARNING"]
    r = B.run_kv_cache(args, f"{n:02d}-cli-{op}-p{procs}", logs)
    m = json.loads(Path(r["json"]).read_text())["measurement"]
    return {"gibps": r[f"{op}_gibps"], "total_gibps": r["read_gibps"] + r["write_gibps"],
            "cpu_s_per_gib": m.get("cpu_seconds_per_gib") or None, "process_cpu_s": m.get("process_cpu_seconds"),
            "time_v_cpu_s": r["process_cpu_s_time_v"], "window_s": r["window_s"], "json": r["json"]}


def fio_job_cpu(path: Path, op: str) -> float | None:
    """fio's own CPU accounting of its timed jobs (usr_cpu + sys_cpu, % of each job's runtime), per GiB
    they moved in `op`: like kv-cache's figure, without fio's start-up and file layout."""
    d = json.loads(path.read_text())
    jobs = [j for j in d["jobs"] if j[op]["io_bytes"]]
    cpu = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1000 for j in jobs)
    moved = sum(j[op]["io_bytes"] for j in jobs) / B.GIB
    return cpu / moved if moved else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--qd", type=int, default=8)
    ap.add_argument("--procs", default="1,4")
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--entry-mib", type=int, default=256)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cli", action="store_true", help="add the real CLI as a third contender in each pair")
    ap.add_argument("--model", default="tiny-1b", help="the CLI's model (tiny-1b: 24,576 bytes/token)")
    ap.add_argument("--write-context", type=int, default=40000, help="the CLI's write run: contexts, tokens")
    ap.add_argument("--read-context", type=int, default=9999, help="the CLI's read run: contexts, tokens")
    ap.add_argument("--read-generation", type=int, default=3200, help="the CLI's read run: generated tokens")
    ap.add_argument("--cli-capacity-gb", type=float, default=4.0, help="the CLI's --storage-capacity-gb (4)")
    a = ap.parse_args()
    B.require_tools()
    logs = Path(tempfile.mkdtemp(prefix="kv-cpu-logs-"))
    rows, n = [], 0
    for d in a.dirs:
        for op in ("write", "read"):
            for procs in (int(p) for p in a.procs.split(",")):
                k, f, c = [], [], []
                for _ in range(a.pairs):
                    with tempfile.TemporaryDirectory(dir=d, prefix="kv-cpu-") as t:
                        k.append(kv(op, Path(t), procs, a.qd, a))
                    with tempfile.TemporaryDirectory(dir=d, prefix="fio-cpu-") as t:
                        n += 1
                        f.append(fio(op, Path(t), a.qd, a, logs, n))
                    if a.cli:
                        with tempfile.TemporaryDirectory(dir=d, prefix="cli-cpu-") as t:
                            n += 1
                            c.append(cli(op, Path(t), procs, a.qd, a, logs, n))
                row = {"dir": str(d), "op": op, "procs": procs, "qd": a.qd,
                       "kv_gibps": median([x["gibps"] for x in k]), "fio_gibps": median([x["gibps"] for x in f]),
                       "kv_cpu_s_per_gib": median([x["cpu_s_per_gib"] for x in k]),
                       "fio_cpu_s_per_gib": median([x["cpu_s_per_gib"] for x in f]),
                       "fio_job_cpu_s_per_gib": median([x["job_cpu_s_per_gib"] for x in f]),
                       "pairs": {"kv": k, "fio": f}}
                row["ratio"] = row["kv_cpu_s_per_gib"] / row["fio_cpu_s_per_gib"]
                row["ratio_jobs"] = row["kv_cpu_s_per_gib"] / row["fio_job_cpu_s_per_gib"]
                row["kv_gibps_per_core"] = 1 / row["kv_cpu_s_per_gib"]
                rows.append(row)
                print(f"{d} {op:5} procs {procs}: GiB/s kv {row['kv_gibps']:.2f} fio {row['fio_gibps']:.2f} | "
                      f"CPU-s/GiB kv {row['kv_cpu_s_per_gib']:.4f} fio {row['fio_cpu_s_per_gib']:.4f} "
                      f"(its jobs' own {row['fio_job_cpu_s_per_gib']:.4f}) ratio {row['ratio']:.2f} "
                      f"(to the jobs' {row['ratio_jobs']:.2f}) | kv {row['kv_gibps_per_core']:.1f} GiB/s per core, "
                      f"{70 / row['kv_gibps_per_core']:.1f} cores for 70 GiB/s", flush=True)
                cpu = [x["cpu_s_per_gib"] for x in c if x["cpu_s_per_gib"]]
                if cpu:
                    row["pairs"]["cli"] = c
                    row["cli_gibps"] = median([x["gibps"] for x in c])
                    row["cli_total_gibps"] = median([x["total_gibps"] for x in c])
                    row["cli_cpu_s_per_gib"] = median(cpu)
                    row["cli_ratio_jobs"] = row["cli_cpu_s_per_gib"] / row["fio_job_cpu_s_per_gib"]
                    row["cli_ratio"] = row["cli_cpu_s_per_gib"] / row["fio_cpu_s_per_gib"]
                    row["cli_gibps_per_core"] = 1 / row["cli_cpu_s_per_gib"]
                    print(f"{d} {op:5} procs {procs}: CLI GiB/s {row['cli_gibps']:.2f} (both directions "
                          f"{row['cli_total_gibps']:.2f}) | CPU-s/GiB CLI {row['cli_cpu_s_per_gib']:.4f} engine "
                          f"{row['kv_cpu_s_per_gib']:.4f} fio jobs {row['fio_job_cpu_s_per_gib']:.4f} | CLI / fio "
                          f"jobs {row['cli_ratio_jobs']:.2f} (whole run {row['cli_ratio']:.2f}) | CLI "
                          f"{row['cli_gibps_per_core']:.1f} GiB/s per core, {70 / row['cli_gibps_per_core']:.1f} "
                          f"cores for 70 GiB/s", flush=True)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
