"""Under plain `mpirun -n 2`, a rank that fails before the window ends the job; the rank that waited at the
window barrier says which rank failed, not that it was interrupted (issue 17, 'a rank that fails before the
window makes the others stop within seconds')."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_grace import wait_for

ROOT = Path(__file__).resolve().parent.parent
MICRO = ("model_configs:\n  micro:\n    name: Micro\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n"
         "    kv_heads: 1\n    dtype: float16\n")


@pytest.mark.slow
def test_the_waiting_rank_names_the_rank_that_failed(tmp_path):
    mpirun, prlimit = shutil.which("mpirun"), shutil.which("prlimit")
    pytest.importorskip("mpi4py")
    if mpirun is None or prlimit is None:
        pytest.skip("needs mpirun (system Open MPI or the mpi-bundled extra) and prlimit (util-linux)")
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    args = [str(ROOT / "kv-cache.py"), "--config", str(cfg), "--model", "micro", "--num-users", "4",
            "--duration", "300", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none",
            "--io-chunk-mb", "1", "--precondition", "--precondition-size-gb", "0.05",
            "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    # rank 1 may write files of 200 kB at most: its preconditioning fails while rank 0 waits at the barrier
    # (rank 0 through mpi_grace: mpirun SIGKILLs it 0.25 s after its SIGTERM, too soon on a loaded host)
    grace = tmp_path / "grace"
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-x", "PYTHONPATH", "-n", "1", sys.executable,
           str(ROOT / "tests" / "mpi_grace.py"), str(grace), sys.executable, *args,
           ":", "-n", "1", prlimit, "--fsize=200000", sys.executable, *args]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120,
                          cwd=tmp_path)
    ranks_output = wait_for(grace)
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:] + ranks_output[-3000:]
    rank0 = json.loads((tmp_path / "X_rank0.json").read_text())
    assert rank0["stop_reason"] == "stopped before the measured phase: rank 1 failed"
    assert rank0["measurement"]["notes"] == ["stopped before the measured phase: rank 1 failed"]
    assert rank0["verdict"] == "INCOMPLETE"
    rank1 = json.loads((tmp_path / "X_rank1.json").read_text())
    assert rank1["stop_reason"].startswith("storage error before the measured phase")
    assert rank1["measurement"]["notes"][0].startswith("storage error before the measured phase")
