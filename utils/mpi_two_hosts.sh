#!/usr/bin/env bash
# mpi_two_hosts.sh - a two-"host" kv-cache run under mpirun on one machine.
#
# Sets up two network namespaces (kvh1-<pid>, kvh2-<pid>) joined by a veth pair on a private /30
# (10.213.77.1 and .2, loopback up in both), each with its own hostname (a UTS namespace per "host"), and
# writes an rsh agent that Open MPI uses instead of ssh: it maps the host (its IP) to its namespace and runs
# the command there. mpirun starts in the first namespace, so rank 0 runs there and rank 1, launched through
# the agent, in the second. Both see the same filesystem (network namespaces share the mounts), so the cache
# directory is a shared filesystem, as on a cluster, and the ranks talk over TCP across the veth pair.
# kv-cache's ranks barrier around one common measured window and rank 0 writes the merged document.
#
# Usage: utils/mpi_two_hosts.sh [--output FILE] [--cache-dir DIR] [--] [kv-cache flags ...]
#   --output FILE    the merged result (default ./kv-two-hosts/merged.json); FILE_rank0/1.json beside it
#   --cache-dir DIR  the shared cache directory (default a temporary directory, removed at the end)
# Any other argument goes to kv-cache.py (e.g. --model tiny-1b --num-users 4 --duration 10).
# Needs root, `ip`, `unshare`, mpirun (Open MPI 5) and mpi4py. Namespaces and temporary files are
# removed on exit, however it ends. Exit status: kv-cache's (through mpirun); 2 usage; 4 setup failed.

set -euo pipefail

PROG=$(basename "$0")
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-$(command -v python3)}
OUTPUT=./kv-two-hosts/merged.json
CACHE_DIR=
KV_ARGS=()

while [[ $# -gt 0 ]]; do
    case $1 in
        --output) OUTPUT=${2:?--output needs a file}; shift 2 ;;
        --cache-dir) CACHE_DIR=${2:?--cache-dir needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; KV_ARGS+=("$@"); break ;;
        *) KV_ARGS+=("$1"); shift ;;
    esac
done

die() { echo "$PROG: $*" >&2; exit "${2:-4}"; }
[[ $(id -u) -eq 0 ]] || die "needs root (ip netns)"
MPIRUN=$(command -v mpirun || true)
[[ -n $MPIRUN ]] || MPIRUN=$(PATH="$(dirname "$PYTHON")" command -v mpirun || true)
[[ -n $MPIRUN ]] || die "mpirun not found (apt install openmpi-bin, or pip install -e '.[mpi-bundled]')"
"$PYTHON" -c 'import mpi4py' 2>/dev/null || die "mpi4py cannot be imported by $PYTHON"
command -v unshare >/dev/null || die "unshare not found"

NS1=kvh1-$$ NS2=kvh2-$$
IP1=10.213.77.1 IP2=10.213.77.2 SUBNET=10.213.77.0/30  # private to the namespaces: no clash with the host
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kv-two-hosts.XXXXXX")
[[ -n $CACHE_DIR ]] || CACHE_DIR=$WORK/cache  # removed with $WORK

cleanup() {
    local ns pid
    for ns in "$NS1" "$NS2"; do
        if ip netns list | grep -qw "^$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns del "$ns" 2>/dev/null || true  # removes the veth end in it, and so the pair
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS1" || die "ip netns add failed (needs root and network namespaces)"
ip netns add "$NS2" || die "ip netns add failed"
ip link add veth-kvh1 netns "$NS1" type veth peer name veth-kvh2 netns "$NS2"  # created inside: no name clash
ip -n "$NS1" addr add "$IP1/30" dev veth-kvh1
ip -n "$NS2" addr add "$IP2/30" dev veth-kvh2
for ns in "$NS1" "$NS2"; do ip -n "$ns" link set lo up; done
ip -n "$NS1" link set veth-kvh1 up
ip -n "$NS2" link set veth-kvh2 up

# The rsh agent: Open MPI runs `agent [ssh options] HOST COMMAND...`. Each "host" also gets its own UTS
# namespace whose hostname is the namespace name: PRRTE tells nodes apart by hostname (two daemons both
# called after this machine would be one node), and each rank then records where it ran.
AGENT=$WORK/rsh-agent.sh
cat >"$AGENT" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do
    case "\$1" in
        -o|-l|-p|-i|-F|-E|-b|-c|-J|-m) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=\$1; shift
case "\$host" in
    $IP1|$NS1) ns=$NS1 ;;
    $IP2|$NS2) ns=$NS2 ;;
    *) echo "rsh-agent: unknown host \$host" >&2; exit 255 ;;
esac
echo "rsh-agent: \$host -> \$ns" >&2
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
EOF
chmod +x "$AGENT"

mkdir -p "$(dirname "$OUTPUT")"
OUTPUT=$(cd "$(dirname "$OUTPUT")" && pwd)/$(basename "$OUTPUT")
export PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}"
MPI_CMD=("$MPIRUN" --allow-run-as-root --host "$IP1:1,$IP2:1" -n 2 --map-by ppr:1:node
         --prtemca plm_ssh_agent "$AGENT" --prtemca oob_tcp_if_include "$SUBNET"
         --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET"
         -x PATH -x PYTHONPATH
         "$PYTHON" "$REPO_DIR/kv-cache.py" --cache-dir "$CACHE_DIR" --output "$OUTPUT" "${KV_ARGS[@]}")
echo "$PROG: rank 0 on $IP1 ($NS1), rank 1 on $IP2 ($NS2), shared cache dir $CACHE_DIR"
echo "$PROG: ip netns exec $NS1 ${MPI_CMD[*]}"

# `|| rc=$?`: the run's status is reported, and cleanup still runs (set -e would skip the summary).
rc=0
ip netns exec "$NS1" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$NS1" "${MPI_CMD[@]}" || rc=$?

if [[ -f $OUTPUT ]]; then
    "$PYTHON" - "$OUTPUT" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
bw, w = doc["bandwidth_gibps"], doc["window"]
print(f"merged result: {sys.argv[1]}")
print(f"  ranks {doc['ranks']}, window {w['seconds']:.3f} s, {w['kind']}")
print(f"  merged storage read {bw['storage_read']:.4f} GiB/s, write {bw['storage_write']:.4f} GiB/s, "
      f"requests {doc['totals']['requests_completed']}")
for r in doc["per_rank"]:
    print(f"  rank {r['rank']} host {r.get('host')}: read {r['storage_read_gibps']:.4f} GiB/s, "
          f"write {r['storage_write_gibps']:.4f} GiB/s, requests {r['requests']}, file {r['file']}")
EOF
else
    echo "$PROG: no merged result at $OUTPUT (mpirun exit status $rc)" >&2
fi
exit "$rc"
