#!/usr/bin/env bash
# Trace another process's storage latency stack with bpftrace, standalone (vLLM, llm-d, any PID):
# block-layer D2C and Q2D, preadv/pwritev and fdatasync syscall latency, request sizes, in-flight I/O and
# an LBA heat map, the same program `kv-cache --enable-latency-tracing` runs on itself.
#
#   utils/storage_latency_stack.sh PID [SECONDS] [DEVICE]     # DEVICE: e.g. nvme0n1 (heat-map range)
#
# Prints bpftrace's histograms on stdout after SECONDS (default 30) or Ctrl-C; feed them to
# utils/distill_fio.py to get a fio job of the same shape. Needs root and bpftrace; mounts tracefs in a
# private mount namespace when it is not mounted (nothing changes outside this command).
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $1 =~ ^[0-9]+$ ]] || usage
pid=$1
seconds=${2:-30}
device=${3:-}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "storage_latency_stack.sh: SECONDS must be a whole number" >&2; exit 2; }
kill -0 "$pid" 2>/dev/null || { echo "storage_latency_stack.sh: no process $pid" >&2; exit 2; }
command -v bpftrace >/dev/null || { echo "storage_latency_stack.sh: bpftrace is not installed" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "storage_latency_stack.sh: needs root (bpftrace loads BPF programs)" >&2; exit 1; }

here=$(cd "$(dirname "$0")/.." && pwd)
script=$(mktemp /tmp/storage-latency-stack.XXXXXX.bt)
trap 'rm -f "$script"' EXIT
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 - "$device" > "$script" <<'PY'
import sys
from kv_cache.host.blocktrace import device_gib, script_for
print(script_for(device_gib(sys.argv[1] or None)))
PY
echo "tracing pid $pid for ${seconds}s (Ctrl-C to stop early)..." >&2
unshare -m sh -c 'ulimit -l unlimited 2>/dev/null
  mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
  mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
  exec timeout -s INT "$0" bpftrace "$1" "$2"' "$seconds" "$script" "$pid" 2> >(grep -v RLIMIT_MEMLOCK >&2)
