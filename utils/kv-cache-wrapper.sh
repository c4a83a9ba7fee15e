#!/usr/bin/env bash
# kv-cache-wrapper.sh - run a suite of kv-cache workloads sized to this machine
# (the reference's utils/kv-cache-wrapper.sh, spec section 12.6).
#
# Detects the GPU (nvidia-smi), the RAM (/proc/meminfo) and a storage directory (/mnt/nvme,
# /mnt/ssd, else <tmp>/kvcache_benchmark), derives memory budgets and user counts from them, runs the
# selected workloads with kv-cache and ends with a comparison report. Every run writes
# results_<workload>.json/.xlsx (mlperf_submission: mlperf_v3_<config>_trial<n>.json/.xlsx) into the
# results directory. See -h.
#
# Exit status: 0 every run passed its performance criteria; 1 every run completed but at least one
# reported FAIL (kv-cache exit status 1, which never stops the suite); 2 usage error; otherwise the
# exit status of the kv-cache run that stopped the suite (2 usage, 3 storage error, 130 interrupted, ...).

set -euo pipefail

PROG=$(basename "$0")
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
CONFIG_FILE="$REPO_DIR/config.yaml"
PYTHON=${PYTHON:-python3}

VALID_MODELS=(tiny-1b mistral-7b llama2-7b llama3.1-8b llama3.1-70b-instruct deepseek-v3 qwen3-32b gpt-oss-120b gpt-oss-20b)
ALL_WORKLOADS=(gpu-only cpu-only storage-only gpu-cpu cpu-storage gpu-cpu-storage storage-saturation production autoscale capacity-autoscale mlperf_submission)
MLPERF_TRIALS=3

usage() {
    cat <<EOF
Usage: $PROG [options] [MODEL]

Runs a suite of kv-cache workloads sized to this machine and prints a comparison report.

Options:
  -m MODEL     model (default: llama3.1-8b): ${VALID_MODELS[*]}
  -c DIR       storage (cache) directory (default: /mnt/nvme, /mnt/ssd, else \${TMPDIR:-/tmp}/kvcache_benchmark)
  -t SECONDS   duration of the tier comparison runs (default: 120)
  -s SECONDS   duration of the storage saturation run (default: 180)
  -r SECONDS   duration of the production run (default: 180)
  -a SECONDS   duration of the autoscaling runs (default: 300)
  -T SECONDS   duration of each mlperf_submission trial (default: 300)
  -w LIST      comma-separated workloads (default: all):
               ${ALL_WORKLOADS[*]}
  -u USERS     baseline user count (default: 50)
  -U USERS     high-load user count (default: RAM in GiB x 10, clamped to 50..300)
  -R           enable the RAG workload in the tier/stress runs
  -D DOCS      RAG documents to ingest (default: 10)
  -o DIR       results directory (default: ./kv_cache_results_<timestamp>)
  -k COMMAND   kv-cache command (default: $PYTHON $REPO_DIR/kv-cache.py); split on spaces
  -n           dry run: print every command, run nothing
  -h, --help   show this help

mlperf_submission runs the three closed configurations of the MLPerf v3 KV-cache README, $MLPERF_TRIALS trials
each (stress_8b, throughput_8b, stress_70b), then prints the median over trials of each primary metric
(utils/summarize_trials.py) and writes mlperf_submission_summary.json.

Exit status: 0 all runs PASS; 1 all runs completed, at least one FAIL; 2 usage error; otherwise the
exit status of the kv-cache run that stopped the suite (3 storage error, 130 interrupted, ...).
EOF
}

die_usage() {
    echo "$PROG: error: $*" >&2
    exit 2
}

is_pos_int() {
    [[ "$1" =~ ^[1-9][0-9]*$ ]]
}

# ------------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------------
model=""
cache_dir_override=""
tier_duration=120
saturation_duration=180
realistic_duration=180
autoscale_duration=300
trial_duration=300
workloads="all"
users_baseline_override=""
users_high_override=""
rag_enabled=0
rag_docs_override=""
results_dir=""
kv_command=""
dry_run=0

# Long options: --help as everywhere else; any other is named (getopts would only say "invalid option -").
for arg in "$@"; do
    case "$arg" in
        --help) usage; exit 0 ;;
        --) break ;;
        --*) die_usage "unknown option $arg: this script takes short options (see -h)" ;;
    esac
done

while getopts ":m:c:t:s:r:a:T:w:u:U:RD:o:k:nh" opt; do
    case "$opt" in
        m) model=$OPTARG ;;
        c) cache_dir_override=$OPTARG ;;
        t) tier_duration=$OPTARG ;;
        s) saturation_duration=$OPTARG ;;
        r) realistic_duration=$OPTARG ;;
        a) autoscale_duration=$OPTARG ;;
        T) trial_duration=$OPTARG ;;
        w) workloads=$OPTARG ;;
        u) users_baseline_override=$OPTARG ;;
        U) users_high_override=$OPTARG ;;
        R) rag_enabled=1 ;;
        D) rag_docs_override=$OPTARG ;;
        o) results_dir=$OPTARG ;;
        k) kv_command=$OPTARG ;;
        n) dry_run=1 ;;
        h) usage; exit 0 ;;
        :) die_usage "option -$OPTARG requires an argument (see -h)" ;;
        *) die_usage "invalid option -$OPTARG (see -h)" ;;
    esac
done
shift $((OPTIND - 1))

# A positional MODEL is accepted for compatibility with the reference.
if [ $# -gt 1 ]; then
    die_usage "unexpected arguments: $* (see -h)"
elif [ $# -eq 1 ]; then
    if [ -z "$model" ]; then
        model=$1
    else
        echo "Warning: ignoring positional model '$1' because -m '$model' was given." >&2
    fi
fi
model=${model:-llama3.1-8b}

model_ok=0
for m in "${VALID_MODELS[@]}"; do
    if [ "$m" = "$model" ]; then model_ok=1; fi
done
if [ "$model_ok" -ne 1 ]; then
    die_usage "unknown model '$model' (valid: ${VALID_MODELS[*]})"
fi

for pair in "-t:$tier_duration" "-s:$saturation_duration" "-r:$realistic_duration" \
            "-a:$autoscale_duration" "-T:$trial_duration"; do
    if ! is_pos_int "${pair#*:}"; then
        die_usage "${pair%%:*} must be a positive integer number of seconds, got '${pair#*:}'"
    fi
done
for pair in "-u:$users_baseline_override" "-U:$users_high_override" "-D:$rag_docs_override"; do
    if [ -n "${pair#*:}" ] && ! is_pos_int "${pair#*:}"; then
        die_usage "${pair%%:*} must be a positive integer, got '${pair#*:}'"
    fi
done

# Workload selection (the reference's aliases are accepted).
selected=()
if [ "$workloads" = "all" ]; then
    selected=("${ALL_WORKLOADS[@]}")
else
    IFS=',' read -r -a requested <<< "$workloads"
    for raw in "${requested[@]}"; do
        entry=${raw,,}
        entry=${entry// /}
        entry=${entry//_/-}
        case "$entry" in
            "") continue ;;
            gpu-only|gpu) name=gpu-only ;;
            cpu-only|cpu) name=cpu-only ;;
            storage-only|storage) name=storage-only ;;
            gpu-cpu|gpu+cpu) name=gpu-cpu ;;
            cpu-storage|cpu+storage) name=cpu-storage ;;
            gpu-cpu-storage|gpu+cpu+storage|three-tier) name=gpu-cpu-storage ;;
            storage-saturation|saturation) name=storage-saturation ;;
            production|realistic) name=production ;;
            autoscale|autoscaling|qos-autoscale) name=autoscale ;;
            capacity-autoscale|capacity) name=capacity-autoscale ;;
            mlperf-submission|mlperf) name=mlperf_submission ;;
            *) die_usage "unknown workload '$raw' (valid: $(IFS=','; echo "${ALL_WORKLOADS[*]}"))" ;;
        esac
        dup=0
        for s in "${selected[@]+"${selected[@]}"}"; do
            if [ "$s" = "$name" ]; then dup=1; fi
        done
        if [ "$dup" -eq 0 ]; then selected+=("$name"); fi
    done
fi
if [ ${#selected[@]} -eq 0 ]; then
    die_usage "no workload selected by -w '$workloads'"
fi

should_run() {
    local w
    for w in "${selected[@]}"; do
        if [ "$w" = "$1" ]; then return 0; fi
    done
    return 1
}

# kv-cache command.
if [ -n "$kv_command" ]; then
    read -r -a kv_cmd <<< "$kv_command"
    if [ ${#kv_cmd[@]} -eq 0 ]; then die_usage "-k needs a command"; fi
else
    kv_cmd=("$PYTHON" "$REPO_DIR/kv-cache.py")
fi
if [ "$dry_run" -eq 0 ]; then
    if ! command -v "${kv_cmd[0]}" >/dev/null 2>&1; then
        die_usage "kv-cache command not found: ${kv_cmd[0]}"
    fi
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        die_usage "$PYTHON not found (needed for the report; set PYTHON=...)"
    fi
fi

# Results directory (absolute, so every --output lands there whatever the working directory).
if [ -z "$results_dir" ]; then
    results_dir="kv_cache_results_$(date +%Y%m%d_%H%M%S)"
fi
case "$results_dir" in
    /*) ;;
    *) results_dir="$PWD/$results_dir" ;;
esac

# ------------------------------------------------------------------------------------------------
# System detection
# ------------------------------------------------------------------------------------------------
echo "============================================================================"
echo "KV CACHE STORAGE BENCHMARK - TIER PERFORMANCE COMPARISON"
echo "Model: $model"
echo "============================================================================"
echo ""
echo "Detecting system configuration..."

gpu_available=0
gpu_mem_gb=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_mem_mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc '0-9' || true)
    if [ -n "$gpu_mem_mb" ] && [ "$gpu_mem_mb" -gt 0 ]; then
        gpu_available=1
        gpu_mem_gb=$(awk -v mb="$gpu_mem_mb" 'BEGIN { printf "%.1f", mb / 1024 }')
        gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
        echo "GPU detected: ${gpu_name:-unknown} (${gpu_mem_gb} GiB)"
    else
        echo "nvidia-smi found but no GPU reported"
    fi
else
    echo "nvidia-smi not installed; treating the system as CPU-only"
fi

cpu_mem_gb=32
if [ -r /proc/meminfo ]; then
    mem_kb=$(awk '/^MemTotal:/ { print $2; exit }' /proc/meminfo)
    if [ -n "$mem_kb" ]; then
        cpu_mem_gb=$((mem_kb / 1024 / 1024))
        echo "CPU RAM: ${cpu_mem_gb} GiB (/proc/meminfo)"
    fi
elif [ "$(uname -s)" = "Darwin" ]; then
    mem_bytes=$(sysctl -n hw.memsize 2>/dev/null || true)
    if [ -n "$mem_bytes" ]; then
        cpu_mem_gb=$((mem_bytes / 1024 / 1024 / 1024))
        echo "CPU RAM: ${cpu_mem_gb} GiB (sysctl)"
    fi
else
    echo "Warning: cannot read the RAM size, assuming ${cpu_mem_gb} GiB"
fi

if [ -n "$cache_dir_override" ]; then
    cache_dir=$cache_dir_override
    echo "Cache directory (-c): $cache_dir"
elif [ -d /mnt/nvme ] && [ -w /mnt/nvme ]; then
    cache_dir=/mnt/nvme
    echo "NVMe storage path: $cache_dir"
elif [ -d /mnt/ssd ] && [ -w /mnt/ssd ]; then
    cache_dir=/mnt/ssd
    echo "SSD storage path: $cache_dir"
else
    cache_dir="${TMPDIR:-/tmp}/kvcache_benchmark"
    echo "Warning: using temporary storage at $cache_dir (mount the device under test at /mnt/nvme or pass -c)"
fi

# Parameters derived from the hardware (the reference's rules).
cpu_mem_realistic=$((cpu_mem_gb / 2))
cpu_mem_small=$((cpu_mem_gb / 8))
if [ "$cpu_mem_small" -lt 1 ]; then cpu_mem_small=1; fi
users_baseline=50
users_high=$((cpu_mem_gb * 10))
if [ "$users_high" -gt 300 ]; then users_high=300; fi
if [ "$users_high" -lt 50 ]; then users_high=50; fi
if [ -n "$users_baseline_override" ]; then users_baseline=$users_baseline_override; fi
if [ -n "$users_high_override" ]; then users_high=$users_high_override; fi
if [ "$users_high" -lt "$users_baseline" ]; then
    echo "Warning: high-load user count ($users_high) is below the baseline ($users_baseline); using $users_baseline." >&2
    users_high=$users_baseline
fi

rag_docs=${rag_docs_override:-10}
rag_args=()
if [ "$rag_enabled" -eq 1 ]; then
    rag_args=(--enable-rag --rag-num-docs "$rag_docs")
fi
gpu_arg=(--gpu-mem-gb 0)
if [ "$gpu_available" -eq 1 ]; then
    gpu_arg=(--gpu-mem-gb "$gpu_mem_gb")
fi

echo ""
echo "Test parameters:"
echo "  Baseline users:          $users_baseline"
echo "  High-load users:         $users_high"
echo "  Realistic CPU budget:    ${cpu_mem_realistic} GiB (50% of RAM)"
echo "  Constrained CPU budget:  ${cpu_mem_small} GiB (12.5% of RAM, forces storage spillover)"
echo "  Cache directory:         $cache_dir"
echo "  Results directory:       $results_dir"
echo "  Durations (s):           tier $tier_duration, saturation $saturation_duration, production $realistic_duration, autoscaling $autoscale_duration, mlperf trial $trial_duration"
echo "  Workloads:               $(IFS=','; echo "${selected[*]}")"
if [ "$rag_enabled" -eq 1 ]; then
    echo "  RAG workload:            enabled ($rag_docs docs)"
else
    echo "  RAG workload:            disabled"
fi
echo "  kv-cache command:        ${kv_cmd[*]}"
if [ "$dry_run" -eq 1 ]; then
    echo "  DRY RUN:                 commands are printed, nothing is run"
fi
echo ""

if [ "$dry_run" -eq 0 ]; then
    mkdir -p "$results_dir" "$cache_dir"
fi

# ------------------------------------------------------------------------------------------------
# Running kv-cache
# ------------------------------------------------------------------------------------------------
run_log=()      # "name: PASS|FAIL" for the end-of-suite list
any_fail=0

print_cmd() {
    local out="[dry-run]" arg
    for arg in "$@"; do
        out+=" $(printf '%q' "$arg")"
    done
    echo "$out"
}

# run_kv NAME OUTPUT_BASENAME ARGS... : one kv-cache run writing OUTPUT_BASENAME.json/.xlsx/.log.
# Exit status 0 (PASS) or 1 (FAIL) continues the suite; anything else stops it with that status.
run_kv() {
    local name=$1 base=$2
    shift 2
    # --fail-exit-code: the suite reports each run's PASS/FAIL from kv-cache's exit status
    local -a cmd=("${kv_cmd[@]}" --config "$CONFIG_FILE" "$@" --seed 42 --fail-exit-code
                  --output "$results_dir/$base.json" --xlsx-output "$results_dir/$base.xlsx")
    if [ "$dry_run" -eq 1 ]; then
        print_cmd "${cmd[@]}"
        return 0
    fi
    echo "+ ${cmd[*]}"
    local rc=0
    local -a status
    # tee ignores SIGINT so that kv-cache's last lines (written after Ctrl-C) still reach the log.
    set +e
    PYTHONUNBUFFERED=1 "${cmd[@]}" 2>&1 | (trap '' INT; exec tee "$results_dir/$base.log")
    status=("${PIPESTATUS[@]}")
    set -e
    rc=${status[0]}
    case "$rc" in
        0) run_log+=("$name: PASS") ;;
        1) run_log+=("$name: FAIL (performance criteria not met)"); any_fail=1 ;;
        *)
            local why="exit status $rc"
            case "$rc" in
                2) why="usage error, exit status 2" ;;
                3) why="storage error, exit status 3" ;;
                130) why="interrupted, exit status 130" ;;
            esac
            echo "" >&2
            echo "$PROG: kv-cache run '$name' failed ($why); stopping the suite. Log: $results_dir/$base.log" >&2
            exit "$rc"
            ;;
    esac
    echo ""
}

# run_workload NAME ARGS... : a suite workload writing results_NAME.*
run_workload() {
    local name=$1
    shift
    run_kv "$name" "results_$name" "$@"
}

skip_no_gpu() {
    echo "[$1] SKIPPED (no GPU detected)"
    echo ""
}

total=${#selected[@]}
step=0
header() {
    step=$((step + 1))
    echo "----------------------------------------------------------------------------"
    echo "[$step/$total] $*"
    echo "----------------------------------------------------------------------------"
}

if [ "$gpu_available" -eq 1 ] && { should_run gpu-only || should_run gpu-cpu || should_run gpu-cpu-storage; }; then
    echo "Note: kv-cache reports in measurement.notes whether it used a GPU tier for --gpu-mem-gb > 0."
    echo ""
fi

# Tier comparison -------------------------------------------------------------------------------
if should_run gpu-only; then
    header "gpu-only: all cache in GPU memory (${tier_duration}s, $users_baseline users)"
    if [ "$gpu_available" -eq 1 ]; then
        run_workload gpu-only --model "$model" --num-users "$users_baseline" --duration "$tier_duration" \
            --gpu-mem-gb "$gpu_mem_gb" --cpu-mem-gb 4 --generation-mode realistic --cache-dir "$cache_dir" \
            "${rag_args[@]+"${rag_args[@]}"}"
    else
        skip_no_gpu gpu-only
    fi
fi
if should_run cpu-only; then
    header "cpu-only: all cache in RAM (${tier_duration}s, $users_baseline users, ${cpu_mem_realistic} GiB)"
    run_workload cpu-only --model "$model" --num-users "$users_baseline" --duration "$tier_duration" \
        --gpu-mem-gb 0 --cpu-mem-gb "$cpu_mem_realistic" --generation-mode realistic --cache-dir "$cache_dir" \
        "${rag_args[@]+"${rag_args[@]}"}"
fi
if should_run storage-only; then
    header "storage-only: storage caching behind a 4 GiB RAM tier (${tier_duration}s, $users_baseline users)"
    run_workload storage-only --model "$model" --num-users "$users_baseline" --duration "$tier_duration" \
        --gpu-mem-gb 0 --cpu-mem-gb 4 --generation-mode realistic --cache-dir "$cache_dir" \
        "${rag_args[@]+"${rag_args[@]}"}"
fi
if should_run gpu-cpu; then
    header "gpu-cpu: GPU + CPU, no storage spillover expected (${tier_duration}s, $users_baseline users)"
    if [ "$gpu_available" -eq 1 ]; then
        run_workload gpu-cpu --model "$model" --num-users "$users_baseline" --duration "$tier_duration" \
            --gpu-mem-gb "$gpu_mem_gb" --cpu-mem-gb "$cpu_mem_realistic" --generation-mode realistic \
            --cache-dir "$cache_dir" "${rag_args[@]+"${rag_args[@]}"}"
    else
        skip_no_gpu gpu-cpu
    fi
fi
if should_run cpu-storage; then
    header "cpu-storage: RAM with storage spillover (${tier_duration}s, $users_high users, ${cpu_mem_small} GiB)"
    run_workload cpu-storage --model "$model" --num-users "$users_high" --duration "$tier_duration" \
        --gpu-mem-gb 0 --cpu-mem-gb "$cpu_mem_small" --generation-mode realistic --cache-dir "$cache_dir" \
        "${rag_args[@]+"${rag_args[@]}"}"
fi
if should_run gpu-cpu-storage; then
    header "gpu-cpu-storage: full three-tier hierarchy (${tier_duration}s, $users_high users)"
    if [ "$gpu_available" -eq 1 ]; then
        run_workload gpu-cpu-storage --model "$model" --num-users "$users_high" --duration "$tier_duration" \
            --gpu-mem-gb "$gpu_mem_gb" --cpu-mem-gb "$cpu_mem_small" --generation-mode realistic \
            --cache-dir "$cache_dir" "${rag_args[@]+"${rag_args[@]}"}"
    else
        skip_no_gpu gpu-cpu-storage
    fi
fi

# Stress and production --------------------------------------------------------------------------
if should_run storage-saturation; then
    header "storage-saturation: maximum storage load (${saturation_duration}s, $users_high users)"
    run_workload storage-saturation --model "$model" --num-users "$users_high" --duration "$saturation_duration" \
        --gpu-mem-gb 0 --cpu-mem-gb 4 --generation-mode realistic --cache-dir "$cache_dir" \
        "${rag_args[@]+"${rag_args[@]}"}"
fi
if should_run production; then
    header "production: realistic multi-tier load (${realistic_duration}s, $users_baseline users, ${cpu_mem_realistic} GiB)"
    run_workload production --model "$model" --num-users "$users_baseline" --duration "$realistic_duration" \
        "${gpu_arg[@]}" --cpu-mem-gb "$cpu_mem_realistic" --generation-mode realistic --cache-dir "$cache_dir" \
        "${rag_args[@]+"${rag_args[@]}"}"
fi

# Autoscaling ------------------------------------------------------------------------------------
if should_run autoscale; then
    header "autoscale: QoS autoscaling from 20 users, target saturation 0.80 (${autoscale_duration}s)"
    run_workload autoscale --model "$model" --num-users 20 --duration "$autoscale_duration" \
        "${gpu_arg[@]}" --cpu-mem-gb "$cpu_mem_small" --enable-autoscaling --autoscaler-mode qos \
        --target-saturation 0.80 --generation-mode realistic --cache-dir "$cache_dir" \
        "${rag_args[@]+"${rag_args[@]}"}"
fi
if should_run capacity-autoscale; then
    header "capacity-autoscale: peak throughput discovery, llama3.1-70b-instruct from 10 users (${autoscale_duration}s)"
    run_workload capacity-autoscale --model llama3.1-70b-instruct --num-users 10 --duration "$autoscale_duration" \
        --gpu-mem-gb 0 --cpu-mem-gb 4 --enable-autoscaling --autoscaler-mode capacity --generation-mode none \
        --cache-dir "$cache_dir"
fi

# MLPerf v3 submission ---------------------------------------------------------------------------
# The three closed configurations of the MLPerf v3 KV-cache README, MLPERF_TRIALS trials each.
#   stress_8b      primary: decode bytes read, wall-clock throughput
#   throughput_8b  primary: storage throughput
#   stress_70b     primary: decode bytes read, wall-clock throughput, storage throughput
if should_run mlperf_submission; then
    header "mlperf_submission: 3 configurations x $MLPERF_TRIALS trials of ${trial_duration}s"
    mlperf_configs=(
        "stress_8b|llama3.1-8b|200|0|16"
        "throughput_8b|llama3.1-8b|100|4|0"
        "stress_70b|llama3.1-70b-instruct|70|0|4"
    )
    for spec in "${mlperf_configs[@]}"; do
        IFS='|' read -r cfg m_model m_users m_cpu m_allocs <<< "$spec"
        for trial in $(seq 1 "$MLPERF_TRIALS"); do
            echo "[mlperf $cfg trial $trial/$MLPERF_TRIALS] $m_model, $m_users users, cpu ${m_cpu} GiB, max-concurrent-allocs $m_allocs"
            run_kv "mlperf $cfg trial $trial" "mlperf_v3_${cfg}_trial${trial}" \
                --model "$m_model" --num-users "$m_users" --duration "$trial_duration" \
                --gpu-mem-gb 0 --cpu-mem-gb "$m_cpu" --max-concurrent-allocs "$m_allocs" \
                --generation-mode none --cache-dir "$cache_dir"
        done
    done
    echo "============================================================================"
    echo "MLPERF SUBMISSION: MEDIAN OVER $MLPERF_TRIALS TRIALS"
    echo "============================================================================"
    if [ "$dry_run" -eq 1 ]; then
        print_cmd "$PYTHON" "$SCRIPT_DIR/summarize_trials.py" "$results_dir"
    else
        "$PYTHON" "$SCRIPT_DIR/summarize_trials.py" "$results_dir"
    fi
    echo ""
fi

# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
report_workloads=()
for w in "${selected[@]}"; do
    if [ "$w" != mlperf_submission ]; then report_workloads+=("$w"); fi
done

echo "============================================================================"
echo "BENCHMARK SUITE COMPLETE"
echo "============================================================================"
if [ "$dry_run" -eq 1 ]; then
    if [ ${#report_workloads[@]} -gt 0 ]; then
        print_cmd "$PYTHON" "$SCRIPT_DIR/report_results.py" "$results_dir" "${report_workloads[@]}"
    fi
    print_cmd "$PYTHON" "$SCRIPT_DIR/json_to_xlsx.py" -i "$results_dir" -o "$results_dir/kv_cache_suite_summary.xlsx"
    exit 0
fi

if [ ${#report_workloads[@]} -gt 0 ]; then
    "$PYTHON" "$SCRIPT_DIR/report_results.py" "$results_dir" "${report_workloads[@]}"
fi
if compgen -G "$results_dir/*.json" >/dev/null; then
    "$PYTHON" "$SCRIPT_DIR/json_to_xlsx.py" -i "$results_dir" -o "$results_dir/kv_cache_suite_summary.xlsx" \
        | tail -n 1 || echo "Warning: the suite spreadsheet could not be written" >&2
fi

echo ""
echo "Runs:"
if [ ${#run_log[@]} -eq 0 ]; then
    echo "  (none: every selected workload was skipped)"
else
    for line in "${run_log[@]}"; do
        echo "  $line"
    done
fi
echo "Results in: $results_dir"
exit "$any_fail"
