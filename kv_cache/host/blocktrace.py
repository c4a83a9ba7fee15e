"""--enable-latency-tracing: block-layer and syscall latency histograms from bpftrace, around the window.

What is traced, for this process only (block requests it inserted or issued; its own syscalls):
- `d2c_us[rwbs]`: device time, issue -> complete (the ground truth for "device latency");
- `q2d_us`: queue time, insert -> issue (scheduler and plug);
- `vfs_read_us` / `vfs_write_us`: preadv/pread64 and pwritev/pwrite64 syscall time;
- `fsync_us`: fdatasync syscall time (the storage tier's); `fsync_calls`: fsync calls, counted apart (the
  results files' atomic writes, host/files.py: in the figure they made it no longer the tool's syscalls);
- for each syscall figure also `<name>_avg_ns` (the exact mean, bpftrace `avg`) and `<name>_ll0..4`:
  log-linear buckets (lhist per decade: 1 us steps below 100 us, 10 us to 1 ms, 100 us to 10 ms, 1 ms to
  100 ms, 10 ms beyond), so a percentile is known within 1-10 % of itself from 10 us (within 1 us below: 20 % at 5 us),
  not within a power of two;
- `bs_bytes[rwbs]`: request sizes; `inflight`: requests in flight at each issue; `lba_gib`: where on the
  device (GiB offset), a heat map of the run's placement.
bpftrace needs root; where tracefs is not mounted it is mounted in a private mount namespace
(`unshare -m`), so nothing changes for the rest of the machine. Anything missing gives a one-line reason
instead of a trace, and the run goes on without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kv_cache.host.bpftrace_hist import parse_output

SCRIPT = r"""
tracepoint:block:block_rq_insert /pid == $1/ { $dev = args->dev; $sec = args->sector; @ins[$dev, $sec] = nsecs; }
tracepoint:block:block_rq_issue {
  $dev = args->dev; $sec = args->sector; $bytes = args->bytes;
  $t = @ins[$dev, $sec];
  if (pid == $1 || $t) {
    if ($t) { @q2d_us = hist((nsecs - $t) / 1000); delete(@ins[$dev, $sec]); }
    @iss[$dev, $sec] = nsecs;
    @bs_bytes[args->rwbs] = hist($bytes);
    @now++;
    @inflight = hist(@now);
    @lba_gib = lhist($sec / 2097152, 0, LBA_MAX, LBA_STEP);
  }
}
tracepoint:block:block_rq_complete {
  $dev = args->dev; $sec = args->sector;
  $t = @iss[$dev, $sec];
  if ($t) {
    @d2c_us[args->rwbs] = hist((nsecs - $t) / 1000);
    delete(@iss[$dev, $sec]);
    @now--;
  }
}
tracepoint:syscalls:sys_enter_preadv, tracepoint:syscalls:sys_enter_preadv2, tracepoint:syscalls:sys_enter_pread64 /pid == $1/ { @rs[tid] = nsecs; }
tracepoint:syscalls:sys_exit_preadv, tracepoint:syscalls:sys_exit_preadv2, tracepoint:syscalls:sys_exit_pread64 /@rs[tid]/ {
  $d = nsecs - @rs[tid]; $u = $d / 1000; @vfs_read_us = hist($u); @vfs_read_avg_ns = avg($d); if ($u < 100) { @vfs_read_ll0 = lhist($u, 0, 100, 1); } else if ($u < 1000) { @vfs_read_ll1 = lhist($u, 100, 1000, 10); } else if ($u < 10000) { @vfs_read_ll2 = lhist($u, 1000, 10000, 100); } else if ($u < 100000) { @vfs_read_ll3 = lhist($u, 10000, 100000, 1000); } else { @vfs_read_ll4 = lhist($u, 100000, 10000000, 10000); } delete(@rs[tid]);
}
tracepoint:syscalls:sys_enter_pwritev, tracepoint:syscalls:sys_enter_pwritev2, tracepoint:syscalls:sys_enter_pwrite64 /pid == $1/ { @ws[tid] = nsecs; }
tracepoint:syscalls:sys_exit_pwritev, tracepoint:syscalls:sys_exit_pwritev2, tracepoint:syscalls:sys_exit_pwrite64 /@ws[tid]/ {
  $d = nsecs - @ws[tid]; $u = $d / 1000; @vfs_write_us = hist($u); @vfs_write_avg_ns = avg($d); if ($u < 100) { @vfs_write_ll0 = lhist($u, 0, 100, 1); } else if ($u < 1000) { @vfs_write_ll1 = lhist($u, 100, 1000, 10); } else if ($u < 10000) { @vfs_write_ll2 = lhist($u, 1000, 10000, 100); } else if ($u < 100000) { @vfs_write_ll3 = lhist($u, 10000, 100000, 1000); } else { @vfs_write_ll4 = lhist($u, 100000, 10000000, 10000); } delete(@ws[tid]);
}
tracepoint:syscalls:sys_enter_fdatasync /pid == $1/ { @fs[tid] = nsecs; }
tracepoint:syscalls:sys_exit_fdatasync /@fs[tid]/ {
  $d = nsecs - @fs[tid]; $u = $d / 1000; @fsync_us = hist($u); @fsync_avg_ns = avg($d); if ($u < 100) { @fsync_ll0 = lhist($u, 0, 100, 1); } else if ($u < 1000) { @fsync_ll1 = lhist($u, 100, 1000, 10); } else if ($u < 10000) { @fsync_ll2 = lhist($u, 1000, 10000, 100); } else if ($u < 100000) { @fsync_ll3 = lhist($u, 10000, 100000, 1000); } else { @fsync_ll4 = lhist($u, 100000, 10000000, 10000); } delete(@fs[tid]);
}
tracepoint:syscalls:sys_enter_fsync /pid == $1/ { @fsync_calls = count(); }
tracepoint:syscalls:sys_enter_getppid /pid == $1/ { if (!@armed) { printf("ARMED\n"); } @armed = 1; }
END { clear(@ins); clear(@iss); clear(@rs); clear(@ws); clear(@fs); clear(@now); clear(@armed); }
"""

# Mount tracefs (and debugfs, for older bpftrace) in this private namespace when they are not mounted.
LAUNCH = ('ulimit -l unlimited 2>/dev/null; '
          'mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; '
          'mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null; '
          'exec bpftrace "$@"')
ATTACH_TIMEOUT_S = 60.0


def device_gib(name: str | None) -> int:
    """The size of the whole disk under block device `name` in GiB (sectors count from the disk's start)."""
    if not name:
        return 1024
    base = Path("/sys/class/block") / name
    size_file = base.resolve().parent / "size" if (base / "partition").exists() else base / "size"
    try:
        return max(1, int(size_file.read_text()) * 512 >> 30)
    except (OSError, ValueError):
        return 1024


def script_for(device_gib: int) -> str:
    """The bpftrace program for a disk of `device_gib` GiB (lhist needs literal bounds: ~64 heat-map rows);
    the process to trace is its first argument ($1)."""
    step = max(1, device_gib // 64)
    return SCRIPT.replace("LBA_MAX", str(max(step, device_gib))).replace("LBA_STEP", str(step))


def unavailable_reason() -> str | None:
    """Why tracing cannot run here (None when it can be tried)."""
    if shutil.which("bpftrace") is None:
        return "bpftrace is not installed (e.g. apt-get install bpftrace)"
    if os.geteuid() != 0:
        return "bpftrace needs root (it loads BPF programs); run as root or with sudo"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing: cannot mount tracefs in a private namespace"
    return None


class BlockTracer:
    """One bpftrace process tracing `pid`; `stop()` ends it and returns the parsed histograms."""

    def __init__(self, proc: subprocess.Popen, workdir: Path, pid: int) -> None:
        self.proc, self.workdir, self.pid = proc, workdir, pid

    @classmethod
    def start(cls, pid: int, device_gib: int = 1024) -> tuple[BlockTracer | None, str | None]:
        """(tracer, None) once bpftrace has attached its probes, or (None, why not)."""
        reason = unavailable_reason()
        if reason is not None:
            return None, reason
        workdir = Path(tempfile.mkdtemp(prefix="kv-cache-bpftrace-"))
        script = workdir / "trace.bt"
        script.write_text(script_for(device_gib))
        with open(workdir / "out.txt", "wb") as out, open(workdir / "err.txt", "wb") as err:
            proc = subprocess.Popen(["unshare", "-m", "sh", "-c", LAUNCH, "sh", str(script), str(pid)],
                                    stdout=out, stderr=err)
        tracer = cls(proc, workdir, pid)
        reason = tracer._wait_attached()
        if reason is not None:
            tracer.stop()
            return None, reason
        return tracer, None

    def _wait_attached(self) -> str | None:
        """None once the probes are attached: bpftrace prints "Attaching N probes" before it attaches them,
        and reads its output buffer only after all are, so ARMED (the getppid probe's, which this process
        calls until it appears) says every probe is in place. Tracing another process: the banner and 0.5 s."""
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        ours = self.pid == os.getpid()
        while time.monotonic() < deadline:
            out = (self.workdir / "out.txt").read_bytes()
            if b"ARMED" in out or (not ours and b"Attaching" in out):
                if not ours:
                    time.sleep(0.5)  # the probes attach after the banner
                return None if self.proc.poll() is None else self._failure()
            if self.proc.poll() is not None:
                return self._failure()
            if ours:
                os.getppid()  # the ARMED probe's trigger
            time.sleep(0.05)
        return f"bpftrace did not attach its probes within {ATTACH_TIMEOUT_S:.0f} s"

    def _failure(self) -> str:
        lines = [ln for ln in (self.workdir / "err.txt").read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "ERROR" in ln and "RLIMIT_MEMLOCK" not in ln] or lines
        return f"bpftrace failed: {errors[0].strip() if errors else f'exit status {self.proc.returncode}'}"

    def stop(self) -> dict[str, Any]:
        """End bpftrace (SIGINT: it prints its maps) and parse them; the temporary files are removed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = (self.workdir / "out.txt").read_text(errors="replace")
        shutil.rmtree(self.workdir, ignore_errors=True)
        return {name.lstrip("@"): value for name, value in parse_output(text).items()}
