#!/usr/bin/env bash
# Check the REAL GPU tier on a CUDA machine (run by hand; CI has no GPU).
#
#   benchmarks/gpu_check.sh [duration_s=60] [gpu_mem_gb=40]
#
# 1. installs what it needs (the package with its dev and gpu extras: torch),
# 2. runs the GPU tests (tests/test_gpu_cuda.py on the device, plus the fake-device and simulated ones),
# 3. runs kv-cache for 60 s with --gpu-tier real --gpu-mem-gb 40 (results in $OUT or /tmp),
# 4. prints the run's H2D / D2H GB/s (CUDA events and wall clock) next to a plain pinned torch copy of the
#    same chunk size measured here, on the same GPU, in the same script.
# GDS=1 also installs kvikio-cu12 and runs 30 s with --gds (storage reads into GPU memory).
# Without an NVIDIA GPU it says so and exits 2 before installing anything.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${1:-60}"
GPU_GB="${2:-40}"
OUTDIR="${OUT:-/tmp}/kv-cache-gpu-check"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! nvidia-smi -L >/dev/null 2>&1; then  # checked before installing anything
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L failed); nothing to check" >&2
    exit 2
fi
# installs into the current Python environment (use a venv to keep it apart)
python3 -m pip install -q -e ".[dev,gpu]"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing to check" >&2
    exit 2
fi
nvidia-smi --query-gpu=index,name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv || true

echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu_cuda.py tests/test_gpu_real.py tests/test_gpu_sim.py

echo "== ${DURATION} s run, --gpu-tier real --gpu-mem-gb ${GPU_GB}"
python3 -m kv_cache --model llama3.1-8b --num-users 16 --duration "$DURATION" --gpu-tier real \
    --gpu-mem-gb "$GPU_GB" --cpu-mem-gb 8 --cache-dir "$OUTDIR" --output "$OUTDIR/gpu_run.json" \
    --seed 42 > "$OUTDIR/gpu_run.txt"
tail -n 30 "$OUTDIR/gpu_run.txt"

echo "== run vs a plain pinned torch copy (same chunk size)"
python3 - "$OUTDIR/gpu_run.json" <<'EOF'
import json
import sys

import torch

r = json.load(open(sys.argv[1]))
g = r["measurement"]["gpu_tier"]
chunk = r["measurement"]["chunk_bytes"]
dev = torch.device("cuda", 0)
host = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
gpu = torch.empty(chunk, dtype=torch.uint8, device=dev)
s = torch.cuda.Stream(device=dev)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def plain(direction, reps=200):
    dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
    with torch.cuda.stream(s):
        for _ in range(10):
            dst.copy_(src, non_blocking=True)
        start.record(s)
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        end.record(s)
    end.synchronize()
    return reps * chunk / (start.elapsed_time(end) * 1e6)  # bytes / ns = GB/s


print(f"GPU tier: {g['mode']} via {g['backend']} on {', '.join(g['devices'])}; chunk {chunk / 2**20:.0f} MiB")
print(f"{'':5} {'run, CUDA events':>18} {'run, wall clock':>17} {'plain pinned copy':>19}   (GB/s)")
for d in ("h2d", "d2h"):
    x = g[d]
    print(f"{d.upper():5} {x['device_gbs']:18.2f} {x['copy_wall_gbs']:17.2f} {plain(d):19.2f}"
          f"   ({x['copies']} copies, {x['bytes'] / 2**30:.2f} GiB)")
EOF

if [ "${GDS:-0}" = 1 ]; then
    echo "== GPUDirect Storage: 30 s with --gds"
    python3 -m pip install -q -e ".[gds]"
    python3 -m kv_cache --model llama3.1-8b --num-users 16 --duration 30 --gpu-tier real --gpu-mem-gb 4 \
        --cpu-mem-gb 1 --gds --cache-dir "$OUTDIR" --output "$OUTDIR/gds_run.json" --seed 42 \
        | grep -E "GPUDirect|Storage Read|GPU tier" || true
fi
