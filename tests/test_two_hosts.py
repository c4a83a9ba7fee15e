"""utils/mpi_two_hosts.sh: two "hosts" on one machine (network namespaces joined by a veth pair, mpirun with an
rsh agent that enters them, a shared filesystem) give one merged document of two ranks, one per namespace,
and leave no namespace or temporary directory behind."""

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "utils" / "mpi_two_hosts.sh"
MICRO = ("model_configs:\n  micro:\n    name: Micro\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n"
         "    kv_heads: 1\n    dtype: float16\n")  # as in test_mpi.py
FLAGS = ["--model", "micro", "--num-users", "2", "--duration", "3", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
         "--generation-mode", "none", "--io-chunk-mb", "1", "--seed", "7"]


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def _mpirun() -> str:
    found = shutil.which("mpirun") or shutil.which("mpirun", path=os.path.dirname(sys.executable))
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        found = None
    if not found:
        pytest.skip("no mpirun + mpi4py (system Open MPI + pip install -e '.[mpi]', or '.[mpi-bundled]')")
    return found


def _need_namespaces() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: it creates network namespaces")
    if not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs `ip` (iproute2) and `unshare`")
    probe = f"kvprobe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` fails here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], check=True)


@pytest.mark.slow
def test_two_namespaces_give_one_merged_document(tmp_path):
    _need_namespaces()
    mpirun = _mpirun()  # skips when mpirun or mpi4py is missing
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    out = tmp_path / "results" / "X.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable,
           "PATH": f"{os.path.dirname(mpirun)}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", str(SCRIPT), "--output", str(out), "--config", str(cfg), *FLAGS], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    assert sorted(p.name for p in out.parent.glob("X*.json")) == ["X.json", "X_rank0.json", "X_rank1.json"]
    merged = json.loads(out.read_text())
    assert merged["ranks"] == 2 and merged["window"]["kind"] == "common (barrier-aligned)"
    assert [r["rank"] for r in merged["per_rank"]] == [0, 1]
    hosts = [r["host"] for r in merged["per_rank"]]
    # each rank ran in its own namespace (the hostname is the namespace's, set only inside it), rank 1
    # through the rsh agent
    pid = re.fullmatch(r"kvh1-(\d+)", hosts[0]).group(1)
    assert hosts == [f"kvh1-{pid}", f"kvh2-{pid}"]
    assert f"rsh-agent: 10.213.77.2 -> kvh2-{pid}" in proc.stderr
    docs = [json.loads((out.parent / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["run_parameters"]["host"] for d in docs] == hosts
    # one shared filesystem: both ranks' cache dirs under the one cache dir, its free space split in two
    assert len({Path(d["measurement"]["run_dir"]).parent.parent for d in docs}) == 1
    assert all(any("/ 2 run(s) or rank(s)" in n for n in d["measurement"]["notes"]) for d in docs)
    assert merged["totals"]["requests_completed"] == sum(d["requests_completed"] for d in docs) > 0
    assert "merged result: " + str(out) in proc.stdout and f"rank 1 host kvh2-{pid}" in proc.stdout

    # nothing left behind: no namespace, and the temporary work dir (the default cache dir) is gone
    assert f"-{pid}" not in _namespaces()
    assert not Path(docs[0]["measurement"]["run_dir"]).parent.parent.parent.exists()
