#!/usr/bin/env bash
# The S3 tier's tests on Ceph's own S3 gateway (tests/test_rgw.py): install Debian's Ceph packages where
# they are missing, then run the round trip (--verify) and the fault cases (gateway frozen, OSD stalled,
# Ctrl-C, gateway killed, a failover, multipart uploads left) against a one-node cluster the tests start
# on 127.0.0.1 (ceph-mon, one ceph-osd on memstore, radosgw: tests/servers.py start_rgw).
#
# Not in CI (.ci/run): the packages are ~100 Debian packages and took about 300 s to install on the
# project's 2-core machine, half of CI's 600 s; once installed, the file runs in about 1-2 minutes.
#
#   benchmarks/rgw_suite.sh              # install if needed, then run tests/test_rgw.py
#   benchmarks/rgw_suite.sh -k failover  # extra arguments go to pytest
#
# KV_CACHE_RGW=1 makes a missing binary or a cluster that does not start a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for b in radosgw radosgw-admin ceph-mon ceph-osd ceph ceph-authtool monmaptool; do
    command -v "$b" >/dev/null 2>&1 || need+=("$b")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "rgw_suite: missing ${need[*]}: installing radosgw ceph-mon ceph-osd ceph-common from Debian" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
    start=$(date +%s)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq radosgw ceph-mon ceph-osd ceph-common >/dev/null
    echo "rgw_suite: installed in $(( $(date +%s) - start )) s" >&2
fi
echo "rgw_suite: $(radosgw --version 2>/dev/null | head -1)" >&2
start=$(date +%s)
rc=0
KV_CACHE_RGW=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest tests/test_rgw.py -q -p no:cacheprovider \
    -rs --durations=5 "$@" || rc=$?
echo "rgw_suite: tests/test_rgw.py exit $rc in $(( $(date +%s) - start )) s" >&2
exit $rc
