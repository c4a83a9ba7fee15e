"""utils/: kv-cache-wrapper.sh (suite runner), summarize_trials.py, json_to_xlsx.py, report_results.py."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UTILS = REPO / "utils"
WRAPPER = UTILS / "kv-cache-wrapper.sh"
SUMMARIZE = UTILS / "summarize_trials.py"
TO_XLSX = UTILS / "json_to_xlsx.py"
REPORT = UTILS / "report_results.py"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is required")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(tmp_path: Path, gpu_mib: str | None = None) -> dict[str, str]:
    """A PATH whose nvidia-smi reports `gpu_mib` MiB (None: reports no GPU), so runs are host independent."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu_mib is None:
        smi.write_text("#!/bin/sh\nexit 0\n")
    else:
        smi.write_text(f'#!/bin/sh\ncase "$*" in *name*) echo "Fake GPU";; *) echo {gpu_mib};; esac\n')
    smi.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp_path)
    return env


def wrapper(tmp_path: Path, *args: str, gpu_mib: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(WRAPPER), *args], capture_output=True, text=True, cwd=tmp_path,
                          env=_env(tmp_path, gpu_mib), timeout=timeout)


def dry_commands(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[dry-run]") and "kv-cache.py" in line]


# ------------------------------------------------------------------------------------------------
# kv-cache-wrapper.sh: command line
# ------------------------------------------------------------------------------------------------

def test_wrapper_syntax():
    assert subprocess.run(["bash", "-n", str(WRAPPER)], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_wrapper_shellcheck_clean():
    proc = subprocess.run(["shellcheck", str(WRAPPER)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_exits_zero(tmp_path, flag):
    proc = wrapper(tmp_path, flag)
    assert proc.returncode == 0
    for opt in ("-m MODEL", "-T SECONDS", "-n ", "-o DIR", "-k COMMAND", "mlperf_submission"):
        assert opt in proc.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-x"], "invalid option -x"),
        (["--verbose"], "unknown option --verbose"),
        (["-m", "gpt-17"], "unknown model 'gpt-17'"),
        (["-w", "storage-only,bogus"], "unknown workload 'bogus'"),
        (["-t", "0"], "-t must be a positive integer"),
        (["-T", "abc"], "-T must be a positive integer"),
        (["-u", "-3"], "-u must be a positive integer"),
        (["-t"], "option -t requires an argument"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(tmp_path, args, fragment):
    proc = wrapper(tmp_path, "-n", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kv-cache-wrapper.sh: error:") and fragment in lines[0]
    assert proc.stdout == ""


def test_all_nine_models_accepted(tmp_path):
    for model in ("tiny-1b", "mistral-7b", "llama2-7b", "llama3.1-8b", "llama3.1-70b-instruct", "deepseek-v3",
                  "qwen3-32b", "gpt-oss-120b", "gpt-oss-20b"):
        proc = wrapper(tmp_path, "-n", "-w", "cpu-only", "-m", model)
        assert proc.returncode == 0, proc.stderr
        assert f"--model {model} " in dry_commands(proc.stdout)[0]


# ------------------------------------------------------------------------------------------------
# kv-cache-wrapper.sh: commands (dry run)
# ------------------------------------------------------------------------------------------------

def test_dry_run_mlperf_submission_nine_commands(tmp_path):
    out_dir = tmp_path / "res"
    proc = wrapper(tmp_path, "-n", "-w", "mlperf_submission", "-T", "30", "-c", str(tmp_path / "cache"),
                   "-o", str(out_dir))
    assert proc.returncode == 0, proc.stderr
    cmds = dry_commands(proc.stdout)
    assert len(cmds) == 9
    expected = {
        "stress_8b": "--model llama3.1-8b --num-users 200 --duration 30 --gpu-mem-gb 0 --cpu-mem-gb 0 "
                     "--max-concurrent-allocs 16 --generation-mode none",
        "throughput_8b": "--model llama3.1-8b --num-users 100 --duration 30 --gpu-mem-gb 0 --cpu-mem-gb 4 "
                         "--max-concurrent-allocs 0 --generation-mode none",
        "stress_70b": "--model llama3.1-70b-instruct --num-users 70 --duration 30 --gpu-mem-gb 0 --cpu-mem-gb 0 "
                      "--max-concurrent-allocs 4 --generation-mode none",
    }
    seen = []
    for cmd in cmds:
        config = next(c for c in expected if f"mlperf_v3_{c}_trial" in cmd)
        trial = cmd.split(f"mlperf_v3_{config}_trial")[1][0]
        seen.append((config, trial))
        assert expected[config] in cmd
        assert f"--config {REPO / 'config.yaml'} " in cmd and "--seed 42" in cmd
        assert f"--cache-dir {tmp_path / 'cache'} " in cmd
        assert f"--output {out_dir}/mlperf_v3_{config}_trial{trial}.json" in cmd
        assert f"--xlsx-output {out_dir}/mlperf_v3_{config}_trial{trial}.xlsx" in cmd
    assert sorted(seen) == sorted((c, str(t)) for c in expected for t in (1, 2, 3))
    assert "summarize_trials.py" in proc.stdout
    assert not out_dir.exists() and not (tmp_path / "cache").exists()  # a dry run creates nothing


def _by_output(cmds: list[str]) -> dict[str, str]:
    return {c.split("--output ")[1].split()[0].rsplit("/", 1)[1]: c for c in cmds}


def test_dry_run_all_workloads_without_gpu(tmp_path):
    proc = wrapper(tmp_path, "-n", "-u", "7", "-U", "90", "-R", "-D", "5", "-o", "out")
    assert proc.returncode == 0, proc.stderr
    cmds = _by_output(dry_commands(proc.stdout))
    assert "nvidia-smi found but no GPU reported" in proc.stdout
    # GPU workloads are skipped without a GPU; 7 suite runs + 9 mlperf trials.
    assert len(cmds) == 16
    for skipped in ("gpu-only", "gpu-cpu", "gpu-cpu-storage"):
        assert f"results_{skipped}.json" not in cmds
        assert f"{skipped}] SKIPPED (no GPU detected)" in proc.stdout
    mem_gib = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1]) // 1024**2
    half, eighth = mem_gib // 2, max(1, mem_gib // 8)
    cache = f"--cache-dir {tmp_path / 'kvcache_benchmark'} "  # no /mnt/nvme or /mnt/ssd on a test machine
    checks = {
        "cpu-only": f"--num-users 7 --duration 120 --gpu-mem-gb 0 --cpu-mem-gb {half} --generation-mode realistic",
        "storage-only": "--num-users 7 --duration 120 --gpu-mem-gb 0 --cpu-mem-gb 4 --generation-mode realistic",
        "cpu-storage": f"--num-users 90 --duration 120 --gpu-mem-gb 0 --cpu-mem-gb {eighth} --generation-mode realistic",
        "storage-saturation": "--num-users 90 --duration 180 --gpu-mem-gb 0 --cpu-mem-gb 4",
        "production": f"--num-users 7 --duration 180 --gpu-mem-gb 0 --cpu-mem-gb {half}",
        "autoscale": f"--num-users 20 --duration 300 --gpu-mem-gb 0 --cpu-mem-gb {eighth} --enable-autoscaling "
                     "--autoscaler-mode qos --target-saturation 0.80",
        "capacity-autoscale": "--model llama3.1-70b-instruct --num-users 10 --duration 300 --gpu-mem-gb 0 "
                              "--cpu-mem-gb 4 --enable-autoscaling --autoscaler-mode capacity --generation-mode none",
    }
    for name, fragment in checks.items():
        cmd = cmds[f"results_{name}.json"]
        assert fragment in cmd, (name, cmd)
        assert cache in cmd
        assert f"--output {tmp_path}/out/results_{name}.json --xlsx-output {tmp_path}/out/results_{name}.xlsx" in cmd
        assert ("--enable-rag --rag-num-docs 5" in cmd) == (name != "capacity-autoscale")
    assert "--model llama3.1-8b" in cmds["results_cpu-only.json"]


def test_dry_run_gpu_detected(tmp_path):
    proc = wrapper(tmp_path, "-n", "-w", "gpu-only,gpu,gpu-cpu,three-tier,production", gpu_mib="81920")
    assert proc.returncode == 0, proc.stderr
    assert "GPU detected: Fake GPU (80.0 GiB)" in proc.stdout
    cmds = _by_output(dry_commands(proc.stdout))
    assert sorted(cmds) == sorted(f"results_{n}.json" for n in ("gpu-only", "gpu-cpu", "gpu-cpu-storage", "production"))
    assert "--gpu-mem-gb 80.0 --cpu-mem-gb 4 " in cmds["results_gpu-only.json"]
    for name in ("gpu-cpu", "gpu-cpu-storage", "production"):
        assert "--gpu-mem-gb 80.0 " in cmds[f"results_{name}.json"]


# ------------------------------------------------------------------------------------------------
# kv-cache-wrapper.sh: exit statuses of kv-cache (a fake command via -k)
# ------------------------------------------------------------------------------------------------

def _fake_kv(tmp_path: Path, status: int) -> str:
    script = tmp_path / f"fake_kv_{status}.sh"
    script.write_text(f'#!/bin/sh\necho "fake kv-cache $*"\nexit {status}\n')
    script.chmod(0o755)
    return str(script)


def test_performance_fail_does_not_stop_the_suite(tmp_path):
    proc = wrapper(tmp_path, "-k", _fake_kv(tmp_path, 1), "-w", "cpu-only,storage-only", "-t", "1",
                   "-c", str(tmp_path / "c"), "-o", str(tmp_path / "r"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.count("fake kv-cache") == 2
    assert "cpu-only: FAIL" in proc.stdout and "storage-only: FAIL" in proc.stdout
    assert (tmp_path / "r" / "results_storage-only.log").read_text().startswith("fake kv-cache")


@pytest.mark.parametrize("status, why", [(2, "usage error"), (3, "storage error"), (130, "interrupted")])
def test_hard_failure_stops_the_suite_and_names_the_run(tmp_path, status, why):
    proc = wrapper(tmp_path, "-k", _fake_kv(tmp_path, status), "-w", "cpu-only,storage-only", "-t", "1",
                   "-c", str(tmp_path / "c"), "-o", str(tmp_path / "r"))
    assert proc.returncode == status
    assert proc.stdout.count("fake kv-cache") == 1  # storage-only never ran
    assert f"kv-cache run 'cpu-only' failed ({why}, exit status {status})" in proc.stderr


# ------------------------------------------------------------------------------------------------
# kv-cache-wrapper.sh: a real (short) run
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow  # a real run (wall clock)
def test_real_mini_run_storage_only(tmp_path):
    out_dir = tmp_path / "results"
    proc = wrapper(tmp_path, "-w", "storage-only", "-t", "3", "-m", "tiny-1b", "-u", "2", "-c", str(tmp_path / "cache"),
                   "-o", str(out_dir), timeout=120)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out_dir / "results_storage-only.json").read_text())
    assert result["summary"]["total_requests"] >= 1
    assert result["run_parameters"]["model"] == "tiny-1b"
    assert (out_dir / "results_storage-only.log").stat().st_size > 0
    assert "COMPREHENSIVE BENCHMARK ANALYSIS" in proc.stdout and "Tier: Storage Only" in proc.stdout
    assert "Result file not found" not in proc.stdout
    assert "storage-only: PASS" in proc.stdout or "storage-only: FAIL" in proc.stdout
    # The end-of-suite report reads only keys that kv-cache writes.
    report = _load(REPORT, "report_results")
    missing = [".".join(p) for p in report.FIELDS.values()
               if report.lookup(result, p) is None and p[-1] != "autoscaling_summary"]  # null unless autoscaling
    assert "autoscaling_summary" in result["summary"]
    assert not missing, missing
    # And the metrics summarize_trials reads exist too.
    summarize = _load(SUMMARIZE, "summarize_trials")
    for _label, path, _fmt in summarize.METRICS.values():
        assert summarize._lookup(result, path) is not None, path


# ------------------------------------------------------------------------------------------------
# summarize_trials.py
# ------------------------------------------------------------------------------------------------

def _result(decode_gb: float, wall: float, storage_tps: float, read_gbps: float, write_gbps: float,
            status: str = "PASS") -> dict:
    return {
        "requests_completed": 10,
        "total_tokens_generated": 1000,
        "total_storage_io_latency": 2.0,
        "summary": {
            "total_requests": 10,
            "avg_throughput_tokens_per_sec": wall,
            "storage_throughput_tokens_per_sec": storage_tps,
            "cache_stats": {
                "tier_storage_kv_bytes_read_gb": decode_gb,
                "tier_storage_kv_bytes_written_gb": 1.5,
                "tier_storage_read_bandwidth_gbps": read_gbps,
                "tier_storage_write_bandwidth_gbps": write_gbps,
                "storage_health": {"overall_status": status},
            },
        },
    }


TRIALS = {  # config -> three trials of (decode GiB, wall tok/s, storage tok/s, read GiB/s, write GiB/s)
    "stress_8b": [(10.0, 100.0, 500.0, 1.0, 0.5), (30.0, 300.0, 700.0, 3.0, 0.7), (20.0, 200.0, 600.0, 2.0, 0.6)],
    "throughput_8b": [(5.0, 50.0, 1500.0, 0.4, 0.2), (7.0, 70.0, 900.0, 0.8, 0.1), (6.0, 60.0, 1200.0, 0.6, 0.3)],
    "stress_70b": [(40.0, 80.0, 250.0, 2.5, 1.5), (44.0, 88.0, 150.0, 2.1, 1.1), (42.0, 84.0, 200.0, 2.3, 1.3)],
}
MEDIANS = {
    "stress_8b": (20.0, 200.0, 600.0, 2.0, 0.6),
    "throughput_8b": (6.0, 60.0, 1200.0, 0.6, 0.2),
    "stress_70b": (42.0, 84.0, 200.0, 2.3, 1.3),
}
KEYS = ("decode_bytes_read_gib", "wall_clock_throughput_tok_s", "storage_throughput_tok_s",
        "storage_read_gib_s", "storage_write_gib_s")


def _write_trials(directory: Path) -> None:
    for config, trials in TRIALS.items():
        for n, values in enumerate(trials, 1):
            (directory / f"mlperf_v3_{config}_trial{n}.json").write_text(json.dumps(_result(*values)))


def test_summarize_trials_medians(tmp_path):
    _write_trials(tmp_path)
    (tmp_path / "results_storage-only.json").write_text("{}")  # not a trial file: ignored
    proc = subprocess.run([sys.executable, str(SUMMARIZE), str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "mlperf_submission_summary.json").read_text())
    configs = summary["configurations"]
    assert list(configs) == ["stress_8b", "throughput_8b", "stress_70b"]
    for config, medians in MEDIANS.items():
        assert configs[config]["trial_count"] == 3
        assert configs[config]["median"] == pytest.approx(dict(zip(KEYS, medians, strict=True)))
        assert [t["trial"] for t in configs[config]["trials"]] == [1, 2, 3]
    assert configs["stress_8b"]["primary_metrics"] == ["decode_bytes_read_gib", "wall_clock_throughput_tok_s"]
    assert configs["throughput_8b"]["primary_metrics"] == ["storage_throughput_tok_s"]
    assert configs["stress_70b"]["primary_metrics"] == ["decode_bytes_read_gib", "wall_clock_throughput_tok_s",
                                                       "storage_throughput_tok_s"]
    out = proc.stdout
    sections = {c: out.split(f"=== {c}:")[1].split("\n=== ")[0] for c in MEDIANS}
    s8 = sections["stress_8b"]
    assert any(line.startswith("Decode Bytes Read (GiB) [primary]") and line.split()[-1] == "20.000"
               and "10.000" in line and "30.000" in line for line in s8.splitlines())
    assert any(line.startswith("Wall-Clock Throughput (tok/s) [primary]") and line.split()[-1] == "200.0"
               for line in s8.splitlines())
    assert any(line.startswith("Storage Throughput (tok/s)") and "[primary]" not in line and line.split()[-1] == "600.0"
               for line in s8.splitlines())
    assert any(line.startswith("Storage Throughput (tok/s) [primary]") and line.split()[-1] == "1200.0"
               for line in sections["throughput_8b"].splitlines())
    s70 = sections["stress_70b"].splitlines()
    assert any(line.startswith("Storage Read (GiB/s)") and line.split()[-1] == "2.300" for line in s70)
    assert any(line.startswith("Storage Write (GiB/s)") and line.split()[-1] == "1.300" for line in s70)
    assert sum("[primary]" in line for line in s70) == 3
    assert "MEDIAN" in out and "Performance assessment" in out


def test_summarize_trials_missing_summary_and_empty_dir(tmp_path):
    for n, values in enumerate([(10.0, 1.0, 1.0, 1.0, 1.0), (20.0, 2.0, 2.0, 2.0, 2.0)], 1):
        (tmp_path / f"mlperf_v3_stress_8b_trial{n}.json").write_text(json.dumps(_result(*values)))
    (tmp_path / "mlperf_v3_stress_8b_trial3.json").write_text(json.dumps({"requests_completed": 0}))
    (tmp_path / "mlperf_v3_prefill_llama3.1-8b_trial1.json").write_text(json.dumps(_result(1, 2, 3, 4, 5)))
    out_json = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, str(SUMMARIZE), str(tmp_path), "--json", str(out_json)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    configs = json.loads(out_json.read_text())["configurations"]
    assert configs["stress_8b"]["median"]["decode_bytes_read_gib"] == 15.0  # median of the two with a summary
    assert configs["stress_8b"]["trials"][2]["error"].startswith("no summary")
    assert configs["prefill_llama3.1-8b"]["primary_metrics"] == []
    assert "n/a" in proc.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, str(SUMMARIZE), str(empty)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and not (empty / "mlperf_submission_summary.json").exists()


# ------------------------------------------------------------------------------------------------
# json_to_xlsx.py
# ------------------------------------------------------------------------------------------------

def _two_results(directory: Path) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "b_run.json").write_text(json.dumps(_result(2.0, 20.0, 200.0, 0.2, 0.1)))
    a = _result(1.0, 10.0, 100.0, 0.1, 0.05)
    a["total_storage_io_latency"] = 4.0  # root formula: 1000 tokens / 4 s = 250 tok/s, 10 requests / 4 s
    (directory / "a_run.json").write_text(json.dumps(a))
    (directory / "mlperf_submission_summary.json").write_text(json.dumps({"configurations": {}}))  # no summary


def _check_rows(header: list, rows: list, directory: Path) -> None:
    from kv_cache.render.xlsx import metric_columns

    assert header[:4] == ["Filename", "Storage Throughput (tok/s)", "Storage Requests/sec", "Total I/O Time (s)"]
    assert set(header[4:]) == set(metric_columns({})) - {"Storage Throughput (tok/s)"}
    tier = [c for c in header if "KV Bytes" in c]
    assert tier == [f"Tier {t} KV Bytes {w} (GiB)" for t in ("GPU", "CPU", "Storage") for w in ("Written", "Read")]
    assert len(rows) == 2
    assert [Path(r[0]).name for r in rows] == ["a_run.json", "b_run.json"]
    col = {name: i for i, name in enumerate(header)}
    assert float(rows[0][col["Storage Throughput (tok/s)"]]) == 250.0
    assert float(rows[0][col["Storage Requests/sec"]]) == 2.5
    assert float(rows[1][col["Avg Throughput (tok/s)"]]) == 20.0
    assert float(rows[1][col["Tier Storage KV Bytes Read (GiB)"]]) == 2.0


def test_json_to_xlsx_writes_two_rows(tmp_path):
    openpyxl = pytest.importorskip("openpyxl")
    _two_results(tmp_path / "in")
    out = tmp_path / "summary.xlsx"
    proc = subprocess.run([sys.executable, str(TO_XLSX), "-i", str(tmp_path / "in"), "-o", str(out)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "with 2 records" in proc.stdout and "no 'summary'" in proc.stdout
    values = list(openpyxl.load_workbook(out).active.values)
    _check_rows(list(values[0]), [list(v) for v in values[1:]], tmp_path / "in")


def test_json_to_xlsx_csv_fallback(tmp_path):
    _two_results(tmp_path / "in")
    # openpyxl made unimportable: the .xlsx request falls back to a CSV next to it.
    code = ("import runpy, sys; sys.modules['openpyxl'] = None; "
            f"sys.argv = ['json_to_xlsx.py', '--input-dir', {str(tmp_path / 'in')!r}, '--output', "
            f"{str(tmp_path / 'summary.xlsx')!r}]; runpy.run_path({str(TO_XLSX)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "summary.xlsx").exists()
    with open(tmp_path / "summary.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    _check_rows(rows[0], rows[1:], tmp_path / "in")
    # An explicit .csv output is written as CSV whatever is installed.
    proc = subprocess.run([sys.executable, str(TO_XLSX), "-i", str(tmp_path / "in"), "-o", str(tmp_path / "x.csv")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and (tmp_path / "x.csv").read_text().startswith("Filename,")
    # No JSON at all: a message and a non-zero status.
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, str(TO_XLSX), "-i", str(empty)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=30)
    assert proc.returncode == 1 and "No JSON files found" in proc.stdout
