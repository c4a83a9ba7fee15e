#!/usr/bin/env bash
# Check the REAL GPU tier on a CUDA machine (run by hand; CI has no GPU). Under 4 minutes on one GPU.
#
#   benchmarks/gpu_check.sh [seconds_per_run=15] [gpu_mem_gb=16]
#
# Installs nothing: needs torch (or cupy) with CUDA in the current Python (pip install -e ".[dev,gpu]").
# 1. the GPU tests (tests/test_gpu_cuda.py on the device; the fake-device ones alongside);
# 2. the store itself at (GPUs, TP) = (1, 1), (2, 1), (2, 2), four workers copying at once: bytes per GPU
#    and per replica, placement, and each direction's GB/s (CUDA events on each worker's own stream, and
#    wall clock) next to a plain pinned copy of the same chunk; with one GPU the "2 GPUs" cases open it
#    twice (two arenas on one device, said so);
# 3. the CLI: a refusal (--num-gpus 3 --tensor-parallel 2, exit 2), then kv-cache runs with --gpu-tier real
#    at (1, 1), and at (2, 1) and (2, 2) where two GPUs exist; each prints its achieved and plain GB/s.
# GDS=1 also runs --gds (needs kvikio). Without a CUDA device it says so and exits 2 at once.
set -uo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-15}"
GPU_GB="${2:-16}"
OUTDIR="${OUT:-/tmp}/kv-cache-gpu-check"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

NGPU=$(python3 -c "
from kv_cache.storage import gpu_device as g
ok, why = g.cuda_status(1)
print(max(g._count('torch'), g._count('cupy')) if ok else 0)
if not ok: print('gpu_check: no CUDA device:', why, file=__import__('sys').stderr)
" 2>"$OUTDIR/why.txt")
if [ "${NGPU:-0}" -lt 1 ]; then
    cat "$OUTDIR/why.txt" >&2
    echo "gpu_check: nothing to check here" >&2
    exit 2
fi
nvidia-smi --query-gpu=index,name,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv 2>/dev/null || true
echo "== $NGPU CUDA device(s); GPU tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu_cuda.py tests/test_gpu_tier.py tests/test_gpu_real.py | tail -n 3

echo "== the store at (GPUs, TP) = (1,1) (2,1) (2,2), 4 workers at once, 16 MiB chunks"
timeout 120 python3 - "$NGPU" <<'PY'
import sys, threading
from kv_cache.storage import gpu_device as g
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_real import DeviceStore

MIB, CHUNK, have, errors = 1 << 20, 16 << 20, int(sys.argv[1]), []
for ngpu, tp in ((1, 1), (2, 1), (2, 2)):
    devs = g.open_devices(min(ngpu, have))
    devs = devs if len(devs) == ngpu else devs * ngpu  # one GPU: opened twice (two arenas on one device)
    store = DeviceStore(devs, 2 << 30, CHUNK, tensor_parallel=tp, staging_slots=4)
    plain = store.measure_plain_copy()
    def work(w):
        b = WorkerBuffers(CHUNK, 100 + w, 0)
        try:
            for i in range(12):
                k = f"w{w}-{i % 4}"
                store.write(k, 64 * MIB, b)
                store.read(k, b, verify=True)  # every byte back from HBM, checked
        except Exception as exc:
            errors.append(f"GPUs={ngpu} TP={tp}: {type(exc).__name__}: {exc}")
        finally:
            b.close()
    ts = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    [t.start() for t in ts]; [t.join() for t in ts]
    st = store.stats()
    print(f"GPUs={ngpu} TP={tp}{' (one GPU opened twice)' if len(set(d.index for d in devs)) < ngpu else ''}: "
          f"replicas {st['replicas']}, capacity {st['capacity_bytes'] / 2**30:.0f} GiB of entries, "
          f"bytes per GPU {st['bytes_per_gpu']}, placement of w0-0 {sorted(set(store.placement('w0-0')))}")
    for d in ("h2d", "d2h"):
        x = st[d]
        print(f"  {d.upper()}: events {x['device_gbs']:6.2f} GB/s, wall {x['copy_wall_gbs']:6.2f} GB/s, plain pinned "
              f"copy {plain[d]:6.2f} GB/s  ({x['bytes'] / 2**30:.2f} GiB per GPU, {x['bytes_per_replica'] / 2**30:.2f} per replica)")
    store.close()
if errors:
    sys.exit("FAILED: " + "; ".join(errors))
PY

echo "== refusal before anything runs"
python3 -m kv_cache --num-gpus 3 --tensor-parallel 2 --gpu-tier real --duration 1 2>&1 | tail -n 1; echo "exit $?"

run() {  # ngpu tp [extra flags]
    local n="$1" t="$2"; shift 2
    local out="$OUTDIR/gpu_n${n}_tp${t}$*"; out="${out// /}"
    echo "== kv-cache ${SECS} s, --gpu-tier real --num-gpus $n --tensor-parallel $t $*"
    timeout $((SECS + 90)) python3 -m kv_cache --model llama3.1-8b --num-users 8 --duration "$SECS" --gpu-tier real \
        --num-gpus "$n" --tensor-parallel "$t" --gpu-mem-gb "$GPU_GB" --cpu-mem-gb 4 --generation-mode none \
        --cache-dir "$OUTDIR" --output "$out.json" --seed 42 "$@" > "$out.txt" 2>&1
    echo "exit $?"; grep -E "GPU tier: real|GPUDirect|clamped" "$out.txt" | head -n 3
    python3 -c "
import json, sys
r = json.load(open(sys.argv[1])); g = r['measurement']['gpu_tier']
print(f\"  {g['devices']} TP {g['tensor_parallel']}: {g['replicas']} replica(s), {g['capacity_bytes'] / 2**30:.1f} GiB of entries; {g['gpus_chosen_by']}\")
for d in ('h2d', 'd2h'):
    x = g[d]
    print(f\"  {d.upper()}: {x['copies']} copies, events {x['device_gbs']:.2f} GB/s, wall {x['copy_wall_gbs']:.2f} GB/s, plain pinned {x['plain_pinned_copy_gbs']:.2f} GB/s\")
print('  requests', r.get('summary', {}).get('total_requests', r.get('total_requests')), '| storage_gds', r['measurement'].get('storage_gds', 'off') if isinstance(r['measurement'].get('storage_gds'), str) else r['measurement']['storage_gds'].get('read_path'))
" "$out.json" 2>&1 | tail -n 6
}
run 1 1
if [ "$NGPU" -ge 2 ]; then run 2 1; run 2 2; else echo "== (2,1) and (2,2) CLI runs skipped: one GPU here (the store checks above covered them)"; fi
if [ "${GDS:-0}" = 1 ]; then run 1 1 --gds; fi
