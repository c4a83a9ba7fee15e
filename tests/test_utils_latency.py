"""utils/distill_fio.py (a trace -> a fio job) and utils/storage_latency_stack.sh (argument checks)."""

import json
import subprocess
import sys
from pathlib import Path

UTILS = Path(__file__).resolve().parent.parent / "utils"
sys.path.insert(0, str(UTILS))
import distill_fio  # noqa: E402

TRACE = """Attaching 16 probes...
@bs_bytes[RS]:
[128K, 256K)          30 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[4K, 8K)               2 |@@@|
@bs_bytes[WS]:
[1M, 2M)              10 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
@inflight:
[1]                    5 |@@@@@|
[4, 8)                20 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
@lba_gib:
[32, 36)              20 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[40, 44)              22 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
"""


def test_distilled_job_has_the_traced_shape(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text(TRACE)
    job = distill_fio.distill(distill_fio.load_maps(str(trace)), runtime_s=30, filename="/mnt/x/fio.dat")
    lines = job.splitlines()
    assert "rw=randrw" in lines and "rwmixread=76" in lines  # 32 reads of 42 requests
    assert "bs=131072,1048576" in lines and "iodepth=4" in lines and "size=12g" in lines
    assert "runtime=30" in lines and "filename=/mnt/x/fio.dat" in lines and "direct=1" in lines


def test_results_json_and_read_only_traces(tmp_path):
    maps = {"bs_bytes": {"R": [{"low": 4096, "high": 8192, "count": 3}]}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"block_latency": {"histograms_us": maps}}))
    job = distill_fio.distill(distill_fio.load_maps(str(path)))
    assert "rw=randread" in job and "rwmixread" not in job and "bs=4096,4096" in job and "iodepth=1" in job


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"summary": {}}))
    assert distill_fio.main([str(path)]) == 2
    assert capsys.readouterr().err.startswith("distill_fio.py: error:")
    empty = tmp_path / "e.txt"
    empty.write_text("Attaching 1 probe...\n")
    assert distill_fio.main([str(empty)]) == 2


def test_stack_script_checks_its_arguments():
    script = UTILS / "storage_latency_stack.sh"
    bad = subprocess.run(["bash", str(script), "notapid"], capture_output=True, text=True)
    assert bad.returncode == 2 and "PID" in bad.stdout + bad.stderr
    gone = subprocess.run(["bash", str(script), "999999999", "1"], capture_output=True, text=True)
    assert gone.returncode == 2 and "no process" in gone.stderr
