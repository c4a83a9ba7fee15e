"""Command line: flags, validation messages (spec 2.3), cache-dir safety, settings, main()'s error paths."""

import dataclasses
import os
import sys
import types
from pathlib import Path

import pytest

from kv_cache import cli
from kv_cache.cli import build_parser, main, parse_settings
from kv_cache.cli.sessions import SessionsFlags
from kv_cache.errors import ConfigError, ExitCode, StorageError, StorageSetupError, UsageError
from kv_cache.settings.pacing import PaceError
from kv_cache.settings.run import (
    DEFAULT_MODEL,
    SECTIONS,
    DriverSettings,
    OutputSettings,
    RunSettings,
    SourceFlags,
    StorageSettings,
    TierSettings,
    WorkloadSettings,
)
from kv_cache.settings.schema import BenchConfig, ValidationLimits
from kv_cache.settings.validation import advisories, check_cache_dir, conflicting_features, validate_args
from kv_cache.specs.models import MODEL_CONFIGS
from kv_cache.workload.traces import TraceError

ROOT = Path(__file__).resolve().parent.parent


def usage_error(argv):
    with pytest.raises(UsageError) as info:
        parse_settings(argv)
    message = str(info.value)
    assert "\n" not in message
    return message


def ns(**overrides):
    """A namespace with every parser default, as the reference tests' mock args."""
    args = build_parser().parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@pytest.fixture
def writable(monkeypatch):
    """Make every directory look writable (tests run as root or not, deterministic either way)."""
    monkeypatch.setattr(os, "access", lambda path, mode: True)


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


def test_reference_defaults():
    a = build_parser().parse_args([])
    expected = {
        "log_level": "INFO",
        "model": "llama3.1-8b",
        "num_users": 100,
        "duration": 60,
        "gpu_mem_gb": 16,
        "num_gpus": 1,
        "tensor_parallel": 1,
        "cpu_mem_gb": 32,
        "cache_dir": None,
        "generation_mode": "realistic",
        "performance_profile": "latency",
        "disable_multi_turn": False,
        "disable_prefix_caching": False,
        "enable_rag": False,
        "rag_num_docs": 10,
        "enable_autoscaling": False,
        "autoscaler_mode": "qos",
        "target_saturation": 0.8,
        "use_burst_trace": False,
        "burst_trace_path": "BurstGPT/data/BurstGPT_1.csv",
        "validation_trace": None,
        "dataset_path": None,
        "max_conversations": 500,
        "seed": None,
        "max_concurrent_allocs": 0,
        "request_rate": 0,
        "max_requests": 0,
        "xlsx_output": None,
        "config": None,
        "storage_capacity_gb": 0,
        "precondition": False,
        "precondition_size_gb": 0,
        "precondition_threads": 0,
        "trace_speedup": 1.0,
        "replay_cycles": 0,
        "prefill_only": False,
        "decode_only": False,
        "io_trace_log": None,
        "enable_latency_tracing": False,
        "io_chunk_mb": None,
        "io_workers": None,
        "io_mode": None,
        "no_fsync": None,
        "trace": None,
        "trace_format": "auto",
        "kv_block_tokens": 0,
        "think_time": "trace",
        "fail_exit_code": False,
        "gpu_tier": "auto",  # ours: real with CUDA, else simulated
        "gpu_type": "h100",
        "gds": False,
        "verify": False,
        "device_limit_gbs": 0.0,  # ours: no limit given (sysfs's link, where known)
        "strict_memory": False,
        "processes": 1,
        "start_delay": 0.0,  # ours: the settle time (mlperf_wrapper.py: 90)
        "end_delay": 0.0,
        "tier_bandwidth": 0.0,  # ours: the storage tier unshaped
        "tier_latency": 0.0,
        # ours: the remote storage tiers (--storage-backend s3 | redis)
        "storage_backend": "file", "s3_endpoint": None, "s3_bucket": None, "s3_prefix": "", "s3_part_mb": 8,
        "s3_concurrency": 4, "redis_url": None, "redis_pipeline": 8,
        "remote_grace_s": None, "remote_failover_s": None,  # None: the config's storage section (10 s, 30 s)
        "partial_results_interval": 10.0,  # ours: the periodic INCOMPLETE document (0 = only at the end)
        "malloc_trim_interval": 60.0,  # ours: glibc's malloc_trim every 60 s of the window (0 = never)
    }
    assert {k: getattr(a, k) for k in expected} == expected
    assert set(vars(a)) == set(expected) | {"output", "plots"}  # --plots DIR: ours, not the reference's
    assert a.output.startswith("benchmark_results_") and a.output.endswith(".json")
    assert len(a.output) == len("benchmark_results_YYYYmmdd_HHMMSS.json")


def test_help_lists_every_flag(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--enable-rag",
        "--io-trace-log",
        "--xlsx-output",
        "--precondition-threads",
        "--io-chunk-mb",
        "--io-workers",
        "--io-mode",
        "--no-fsync",
        "--num-gpus",
        "--tensor-parallel",
    ):
        assert flag in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--num-users", "abc"], "argument --num-users: invalid int value: 'abc'"),
        (["--duration", "1.5"], "argument --duration: invalid int value: '1.5'"),
        (["--gpu-mem-gb", "lots"], "argument --gpu-mem-gb: invalid float value: 'lots'"),
        (["--generation-mode", "slow"], "argument --generation-mode: invalid choice: 'slow'"),
        (["--autoscaler-mode", "predictive"], "argument --autoscaler-mode: invalid choice"),
        (["--io-mode", "mmap"], "argument --io-mode: invalid choice"),
        (["--log-level", "debug"], "argument --log-level: invalid choice"),
        (["--model"], "argument --model: expected one argument"),
    ],
)
def test_argparse_errors_are_one_line_exit_2(capsys, argv, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kv-cache: error: ") and fragment in err
    assert err.count("\n") == 1 and "usage:" not in err


# ---------------------------------------------------------------------------------------------
# validate_args: every rule of spec 2.3, with the configured limits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_users": 0}, "--num-users must be positive, got 0"),
        ({"num_users": -3}, "--num-users must be positive, got -3"),
        ({"num_users": 100001}, "--num-users exceeds limit (100000), got 100001"),
        ({"duration": 0}, "--duration must be positive, got 0"),
        ({"duration": 86401}, "--duration exceeds 24 hours (86400s), got 86401"),
        ({"gpu_mem_gb": -1.0}, "--gpu-mem-gb cannot be negative, got -1.0"),
        ({"gpu_mem_gb": 1025.0}, "--gpu-mem-gb exceeds limit (1024GiB), got 1025.0"),
        ({"gpu_mem_gb": float("nan")}, "--gpu-mem-gb must be a finite number, got nan"),
        ({"cpu_mem_gb": -0.5}, "--cpu-mem-gb cannot be negative, got -0.5"),
        ({"cpu_mem_gb": 16385.0}, "--cpu-mem-gb exceeds limit (16384GiB), got 16385.0"),
        ({"rag_num_docs": -1}, "--rag-num-docs cannot be negative, got -1"),
        ({"max_conversations": 0}, "--max-conversations must be positive, got 0"),
        ({"max_concurrent_allocs": -1}, "--max-concurrent-allocs cannot be negative, got -1"),
        ({"request_rate": -1.0}, "--request-rate cannot be negative, got -1.0"),
        ({"max_requests": -1}, "--max-requests cannot be negative, got -1"),
        ({"storage_capacity_gb": -1.0}, "--storage-capacity-gb cannot be negative, got -1.0"),
        ({"storage_capacity_gb": float("inf")}, "--storage-capacity-gb must be a finite number, got inf"),
        ({"precondition_size_gb": -2.0}, "--precondition-size-gb cannot be negative, got -2.0"),
        ({"precondition_threads": -1}, "--precondition-threads cannot be negative, got -1"),
        ({"trace_speedup": -0.5}, "--trace-speedup cannot be negative, got -0.5"),
        ({"replay_cycles": -1}, "--replay-cycles cannot be negative, got -1"),
        ({"target_saturation": 1.5}, "--target-saturation must be between 0.0 and 1.0, got 1.5"),
        ({"target_saturation": -0.1}, "--target-saturation must be between 0.0 and 1.0, got -0.1"),
        ({"num_gpus": 0}, "--num-gpus must be >= 1, got 0"),
        ({"tensor_parallel": 0}, "--tensor-parallel must be >= 1, got 0"),
        ({"tensor_parallel": 4, "num_gpus": 2}, "--tensor-parallel (4) cannot exceed --num-gpus (2)"),
        ({"cache_dir": "/etc/kv_cache"}, "--cache-dir cannot be a system directory: /etc/kv_cache"),
        ({"io_chunk_mb": 0}, "--io-chunk-mb must be >= 1, got 0"),
        ({"io_workers": -1}, "--io-workers cannot be negative, got -1"),
        ({"partial_results_interval": -1.0}, "--partial-results-interval cannot be negative, got -1"),
        ({"malloc_trim_interval": -1.0}, "--malloc-trim-interval cannot be negative, got -1"),
        ({"partial_results_interval": float("nan")}, "--partial-results-interval must be a finite number, got nan"),
        # the remote tiers' deadline: a NaN grace ended no wait on a frozen server, a negative one every wait
        ({"remote_grace_s": -1.0}, "--remote-grace-s cannot be negative, got -1"),
        ({"remote_grace_s": float("nan")}, "--remote-grace-s must be a finite number, got nan"),
        ({"remote_failover_s": -1.0}, "--remote-failover-s cannot be negative, got -1"),
        ({"remote_failover_s": float("inf")}, "--remote-failover-s must be a finite number, got inf"),
    ],
)
def test_each_validation_rule(overrides, message):
    errors = validate_args(ns(**overrides), ValidationLimits())
    assert len(errors) == 1 and _refused(errors[0], message)


def _refused(message: str | None, prefix: str) -> bool:
    """`message` is `prefix` (the refusal), then nothing or the why and what to do instead."""
    return message is not None and message.startswith(prefix) and message[len(prefix):][:1] in ("", " ", ";")


def test_valid_defaults_have_no_errors():
    assert validate_args(ns(), ValidationLimits()) == []
    assert validate_args(ns()) == []  # limits default to the shipped ones


def test_zero_accepted_where_the_spec_says():
    args = ns(
        gpu_mem_gb=0.0,
        cpu_mem_gb=0.0,
        storage_capacity_gb=0.0,
        precondition_size_gb=0.0,
        precondition_threads=0,
        trace_speedup=0.0,
        replay_cycles=0,
        rag_num_docs=0,
        max_concurrent_allocs=0,
        request_rate=0.0,
        max_requests=0,
        target_saturation=0.0,
        io_workers=0,
    )
    assert validate_args(args, ValidationLimits()) == []
    assert (
        validate_args(ns(target_saturation=1.0, trace_speedup=100.0, replay_cycles=5), ValidationLimits())
        == []
    )


def test_limits_come_from_the_config():
    limits = ValidationLimits(
        max_users=10, max_duration_seconds=7200, max_gpu_memory_gb=80, max_cpu_memory_gb=64.5
    )
    errors = validate_args(ns(num_users=11, duration=7201, gpu_mem_gb=81.0, cpu_mem_gb=65.0), limits)
    assert errors == [
        "--num-users exceeds limit (10), got 11",
        "--duration exceeds 2 hours (7200s), got 7201",
        "--gpu-mem-gb exceeds limit (80GiB), got 81.0",
        "--cpu-mem-gb exceeds limit (64.5GiB), got 65.0",
    ]
    assert validate_args(ns(duration=3601), ValidationLimits(max_duration_seconds=3600)) == [
        "--duration exceeds 1 hour (3600s), got 3601"
    ]
    assert validate_args(ns(duration=101), ValidationLimits(max_duration_seconds=100)) == [
        "--duration exceeds limit (100s), got 101"
    ]


def test_gpu_limit_is_per_card():
    assert validate_args(ns(gpu_mem_gb=1024.0, num_gpus=8), ValidationLimits()) == []


def test_tensor_parallel_power_of_two_is_a_warning_only():
    args = ns(tensor_parallel=3, num_gpus=6)
    assert validate_args(args, ValidationLimits()) == []
    assert advisories(args) == [
        "--tensor-parallel 3 is not a power of 2; uncommon for real deployments but allowed"
    ]
    assert advisories(ns(tensor_parallel=4, num_gpus=4)) == []


def test_validate_args_accepts_partial_namespaces():
    assert validate_args(types.SimpleNamespace(num_users=0)) == ["--num-users must be positive, got 0"]


def test_multiple_errors_in_one_message():
    m = usage_error(["--num-users", "0", "--duration", "-5", "--gpu-mem-gb", "-1"])
    assert m == (
        "--num-users must be positive, got 0; --duration must be positive, got -5; "
        "--gpu-mem-gb cannot be negative, got -1.0"
    )


# ---------------------------------------------------------------------------------------------
# --cache-dir safety
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/etc",
        "/etc/x",
        "/etc/kv_cache",
        "/usr",
        "/usr/local/kv",
        "/bin",
        "/sbin/x",
        "/boot/x",
        "/sys/x",
        "/proc/x",
        "/lib/x",
        "/lib64/x",
        "/dev",
        "/dev/sda",
        "/dev/nvme0n1",
        "/root",
        "/var",
        "/home",
        "/opt",
        "/srv",
        "/mnt",
        "/media",
        "/tmp",
        "/run",
        "/etc/../etc/x",
        "//etc",
    ],
)
def test_system_directories_rejected(path):
    message = check_cache_dir(path)
    assert _refused(message, f"--cache-dir cannot be a system directory: {os.path.realpath(path)}")
    assert "use a directory of its own, e.g. --cache-dir /" in message  # says what to do instead


def test_tmp_refusal_says_why_and_suggests_a_subdirectory():
    message = check_cache_dir("/tmp")
    assert "subdirectory of it is fine" in message and message.endswith("--cache-dir /tmp/kvcache_benchmark")
    assert check_cache_dir("/tmp/kvcache_benchmark") is None


@pytest.mark.parametrize(
    "path",
    [
        "/dev/shm",
        "/dev/shm/kv",
        "/mnt/nvme",
        "/mnt/nvme/kv",
        "/tmp/x",
        "/var/tmp/kv",
        "/home/someone/kv",
        "/opt/bench",
        "/srv/data",
        "/media/disk",
        "/root/kv",
        "/rootfs/kv",
        "/devx/kv",
        "/etcetera/kv",
    ],
)
def test_subdirectories_and_lookalikes_accepted(path, writable):
    assert check_cache_dir(path) is None


def test_home_itself_rejected_but_subdir_accepted(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert _refused(check_cache_dir(str(home)), f"--cache-dir cannot be a system directory: {home}")
    assert _refused(check_cache_dir("~"), f"--cache-dir cannot be a system directory: {home}")
    assert check_cache_dir(str(home / "sub")) is None
    assert check_cache_dir("~/sub") is None


def test_symlink_into_system_directory_rejected(tmp_path):
    link = tmp_path / "innocent"
    link.symlink_to("/etc")
    assert _refused(check_cache_dir(str(link / "kv")), "--cache-dir cannot be a system directory: /etc/kv")
    assert _refused(check_cache_dir(str(link)), "--cache-dir cannot be a system directory: /etc")


def test_relative_path_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    assert _refused(check_cache_dir("etc/x"), "--cache-dir cannot be a system directory: /etc/x")
    monkeypatch.chdir(tmp_path)
    assert check_cache_dir("kv") is None


def test_existing_file_rejected(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert _refused(check_cache_dir(str(f)), f"--cache-dir is not a directory: {f}")


def test_existing_directory_accepted(tmp_path):
    assert check_cache_dir(str(tmp_path)) is None
    assert check_cache_dir(str(tmp_path / "new" / "deeper")) is None


def test_parent_not_writable(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert _refused(check_cache_dir(str(tmp_path / "a" / "b")), f"--cache-dir parent is not writable: {tmp_path}")
    assert _refused(check_cache_dir(str(tmp_path)), f"--cache-dir is not writable: {tmp_path}")


def test_parent_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert _refused(check_cache_dir(str(f / "kv")), f"--cache-dir parent is not a directory: {f}")


def test_empty_cache_dir_rejected():
    assert _refused(check_cache_dir(""), "--cache-dir must not be empty")


# ---------------------------------------------------------------------------------------------
# parse_settings
# ---------------------------------------------------------------------------------------------


def test_default_settings():
    s = parse_settings([])
    assert isinstance(s, RunSettings)
    assert s.config == BenchConfig()
    assert s.model == MODEL_CONFIGS["llama3.1-8b"] and s.model_name == "llama3.1-8b"
    assert (s.workload.num_users, s.driver.duration, s.tiers.gpu_mem_gb, s.tiers.cpu_mem_gb) == (100, 60.0, 16.0, 32.0)
    assert isinstance(s.driver.duration, float) and isinstance(s.tiers.gpu_mem_gb, float)
    assert (s.tiers.num_gpus, s.tiers.tensor_parallel, s.tiers.cache_dir, s.seed) == (1, 1, None, None)
    assert (s.driver.generation_mode, s.outputs.performance_profile, s.workload.multi_turn, s.workload.prefix_caching) == (
        "realistic",
        "latency",
        True,
        True,
    )
    assert (s.driver.max_concurrent_allocs, s.driver.max_requests, s.tiers.storage_capacity_gb, s.outputs.log_level) == (
        0,
        0,
        0.0,
        "INFO",
    )
    assert s.config_path is None and s.argv == ()
    assert (s.storage.chunk_bytes, s.storage.fsync, s.storage.io_mode, s.storage.io_workers) == (
        16 * 2**20,
        True,
        "auto",
        0,
    )


def test_flags_reach_settings(tmp_path):
    argv = [
        "--model",
        "tiny-1b",
        "--num-users",
        "7",
        "--duration",
        "30",
        "--gpu-mem-gb",
        "0",
        "--cpu-mem-gb",
        "4",
        "--num-gpus",
        "2",
        "--tensor-parallel",
        "2",
        "--cache-dir",
        str(tmp_path / "kv"),
        "--generation-mode",
        "none",
        "--performance-profile",
        "throughput",
        "--disable-multi-turn",
        "--disable-prefix-caching",
        "--output",
        "out.json",
        "--seed",
        "42",
        "--max-concurrent-allocs",
        "3",
        "--max-requests",
        "9",
        "--storage-capacity-gb",
        "1.5",
        "--log-level",
        "DEBUG",
    ]
    s = parse_settings(argv)
    assert s.model_name == "tiny-1b" and s.model.bytes_per_token == 24576
    assert (s.workload.num_users, s.driver.duration, s.tiers.gpu_mem_gb, s.tiers.cpu_mem_gb, s.tiers.num_gpus, s.tiers.tensor_parallel) == (
        7,
        30.0,
        0.0,
        4.0,
        2,
        2,
    )
    assert s.tiers.cache_dir == str(tmp_path / "kv")
    assert (s.driver.generation_mode, s.outputs.performance_profile, s.workload.multi_turn, s.workload.prefix_caching) == (
        "none",
        "throughput",
        False,
        False,
    )
    assert (s.outputs.output, s.seed, s.effective_seed, s.driver.max_concurrent_allocs, s.driver.max_requests) == (
        "out.json",
        42,
        42,
        3,
        9,
    )
    assert (s.tiers.storage_capacity_gb, s.outputs.log_level) == (1.5, "DEBUG")
    assert s.argv == tuple(argv)


def test_relative_cache_dir_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_settings(["--cache-dir", "kv"]).tiers.cache_dir == str(tmp_path / "kv")


def test_config_storage_section_and_cli_overrides(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("storage:\n  chunk_size_mb: 4\n  fsync: false\n  io_mode: buffered\n  io_workers: 3\n")
    s = parse_settings(["--config", str(cfg)])
    assert (s.storage.chunk_bytes, s.storage.fsync, s.storage.io_mode, s.storage.io_workers) == (
        4 * 2**20,
        False,
        "buffered",
        3,
    )
    assert s.config_path == str(cfg) and s.config.storage.chunk_size_mb == 4

    s = parse_settings(
        ["--config", str(cfg), "--io-chunk-mb", "1", "--io-mode", "direct", "--io-workers", "0"]
    )
    assert (s.storage.chunk_bytes, s.storage.fsync, s.storage.io_mode, s.storage.io_workers) == (
        2**20,
        False,
        "direct",
        0,
    )

    s = parse_settings(["--no-fsync", "--io-chunk-mb", "64"])
    assert (s.storage.chunk_bytes, s.storage.fsync, s.storage.io_mode) == (64 * 2**20, False, "auto")


def test_config_validation_limits_take_effect(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("validation_limits:\n  max_users: 10\n  max_gpu_memory_gb: 80\n")
    m = usage_error(["--config", str(cfg), "--num-users", "11", "--gpu-mem-gb", "81"])
    assert m == "--num-users exceeds limit (10), got 11; --gpu-mem-gb exceeds limit (80GiB), got 81.0"
    assert parse_settings(["--config", str(cfg), "--num-users", "10"]).workload.num_users == 10


def test_shipped_limits_apply_without_config():
    assert usage_error(["--gpu-mem-gb", "2000"]) == "--gpu-mem-gb exceeds limit (1024GiB), got 2000.0"


def test_custom_model_from_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_configs:\n  my-8l:\n    name: Mine\n    num_layers: 8\n    kv_heads: 4\n")
    s = parse_settings(["--config", str(cfg), "--model", "my-8l"])
    assert s.model.name == "Mine" and s.model.bytes_per_token == 8 * 4 * 128 * 2 * 2


def test_unknown_model():
    m = usage_error(["--model", "gpt-5"])
    assert m == (
        "unknown model 'gpt-5' (available: deepseek-v3, gpt-oss-120b, gpt-oss-20b, llama2-7b, "
        "llama3.1-70b-instruct, llama3.1-8b, mistral-7b, qwen3-32b, tiny-1b)"
    )


def test_prefill_and_decode_only_are_exclusive():
    assert (
        usage_error(["--prefill-only", "--decode-only"])
        == "--prefill-only and --decode-only are mutually exclusive"
    )


def test_latency_tracing_is_accepted():
    assert parse_settings(["--enable-latency-tracing"]).outputs.latency_tracing is True
    assert parse_settings([]).outputs.latency_tracing is False


def test_companion_flags_are_range_validated_and_do_not_conflict():
    assert (
        conflicting_features(
            ns(rag_num_docs=5, trace_speedup=2.0, replay_cycles=3, autoscaler_mode="capacity")
        )
        == []
    )
    assert usage_error(["--target-saturation", "2", "--trace-speedup", "-1"]) == (
        "--trace-speedup cannot be negative, got -1.0; --target-saturation must be between 0.0 and 1.0, got 2.0"
    )
    assert usage_error(["--request-rate", "-1"]) == "--request-rate cannot be negative, got -1.0"


def test_errors_of_all_kinds_combined():
    m = usage_error(["--num-users", "0", "--enable-autoscaling", "--request-rate", "5", "--model", "nope"])
    assert m.startswith("--num-users must be positive, got 0; --enable-autoscaling scales closed-loop users; it "
                        "cannot be combined with --request-rate; unknown model 'nope'")


def test_bad_config_is_a_usage_error(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("eviction:\n  target_usage_rati: 0.5\n")
    assert usage_error(["--config", str(cfg)]).startswith(f"{cfg}: unknown key 'eviction.target_usage_rati'")


# ---------------------------------------------------------------------------------------------
# main(): exit codes and one-line stderr
# ---------------------------------------------------------------------------------------------


def one_line_error(capsys):
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kv-cache: error: ") and captured.err.count("\n") == 1
    return captured.err.rstrip("\n")


def test_main_bad_value(capsys):
    assert main(["--num-users", "0"]) == 2
    assert one_line_error(capsys) == "kv-cache: error: --num-users must be positive, got 0"


def test_main_unknown_model(capsys):
    assert main(["--model", "x"]) == 2
    assert one_line_error(capsys).startswith("kv-cache: error: unknown model 'x' (available: deepseek-v3")


def test_main_bad_config(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("storage:\n  io_mode: [1\n")
    assert main(["--config", str(cfg)]) == 2
    assert one_line_error(capsys).startswith(f"kv-cache: error: {cfg}: invalid YAML: ")


def test_main_missing_config(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "none.yaml")]) == 2
    assert one_line_error(capsys).startswith(f"kv-cache: error: {tmp_path / 'none.yaml'}: config file not found (")


def test_main_cache_dir_in_system_directory(capsys):
    assert main(["--cache-dir", "/usr/kv"]) == 2
    assert _refused(one_line_error(capsys), "kv-cache: error: --cache-dir cannot be a system directory: /usr/kv")


def test_autoscaling_with_request_rate_is_refused():
    assert usage_error(["--enable-autoscaling", "--request-rate", "5"]) == (
        "--enable-autoscaling scales closed-loop users; it cannot be combined with --request-rate"
    )


@pytest.mark.slow  # a real run (wall clock)
def test_main_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kv-cache ")


@pytest.fixture
def fake_runner(monkeypatch):
    module = types.ModuleType("kv_cache.benchmarks.standard.run")
    calls = []

    def run_benchmark(settings):
        calls.append(settings)
        return module.result(settings) if hasattr(module, "result") else 0

    module.run_benchmark = run_benchmark
    module.calls = calls
    monkeypatch.setitem(sys.modules, "kv_cache.benchmarks.standard.run", module)
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)
    return module


def test_main_hands_settings_to_the_runner(fake_runner):
    assert main(["--model", "tiny-1b", "--num-users", "3"]) == 0
    (settings,) = fake_runner.calls
    assert settings.model_name == "tiny-1b" and settings.workload.num_users == 3


def test_fail_exit_code_flag_reaches_the_settings():
    assert parse_settings(["--fail-exit-code"]).outputs.fail_exit_code is True
    assert parse_settings([]).outputs.fail_exit_code is False


def test_main_passes_the_runner_exit_status(fake_runner):
    fake_runner.result = lambda settings: 1
    assert main([]) == 1


def test_main_keyboard_interrupt(fake_runner, capsys):
    def interrupted(settings):
        raise KeyboardInterrupt

    fake_runner.result = interrupted
    assert main([]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err


def test_main_usage_error_from_the_runner(fake_runner, capsys):
    def refuse(settings):
        raise UsageError("cannot create --cache-dir: /x")

    fake_runner.result = refuse
    assert main([]) == 2
    assert one_line_error(capsys) == "kv-cache: error: cannot create --cache-dir: /x"


@pytest.mark.slow  # a real run (wall clock)
def test_root_script_is_runnable(tmp_path):
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(ROOT / "kv-cache.py"), "--num-users", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == "kv-cache: error: --num-users must be positive, got 0\n"


# ---------------------------------------------------------------------------------------------
# Sub-commands, exit codes, defaults written once
# ---------------------------------------------------------------------------------------------


def test_run_is_the_default_command(fake_runner):
    assert main(["run", "--model", "tiny-1b", "--num-users", "3"]) == 0
    assert main(["--model", "tiny-1b", "--num-users", "3"]) == 0
    first, second = fake_runner.calls
    assert (first.model_name, first.workload.num_users) == (second.model_name, second.workload.num_users) == ("tiny-1b", 3)
    assert first.argv == second.argv == ("--model", "tiny-1b", "--num-users", "3")


def test_run_subcommand_reports_errors_like_the_default(capsys):
    assert main(["run", "--num-users", "0"]) == 2
    assert one_line_error(capsys) == "kv-cache: error: --num-users must be positive, got 0"
    assert main(["run", "--bogus"]) == 2
    assert one_line_error(capsys) == "kv-cache: error: unrecognized arguments: --bogus"


def test_sessions_help(capsys):
    assert main(["sessions", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kv-cache sessions")
    for flag in ("--ladder", "--tiers", "--pace", "--window", "--gpu"):
        assert flag in out


def test_run_help_names_the_commands(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kv-cache [-h]") and "kv-cache sessions --help" in " ".join(out.split())


def test_unknown_subcommand(capsys):
    assert main(["bogus", "--num-users", "3"]) == 2
    line = one_line_error(capsys)
    assert line.startswith("kv-cache: error: unknown command 'bogus' (choose from run, sessions") and "merge" in line
    assert "report" in line and "compare" in line


def test_sessions_argparse_errors_carry_the_command_name(capsys):
    assert main(["sessions", "--window", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kv-cache sessions: error: argument --window") and err.count("\n") == 1


def test_exit_code_values():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 70, 130]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UsageError("bad"), ExitCode.USAGE),
        (ConfigError("x.yaml: bad"), ExitCode.USAGE),
        (TraceError("t.jsonl", "empty"), ExitCode.USAGE),
        (PaceError("bad pace"), ExitCode.USAGE),
        (StorageSetupError("cannot create"), ExitCode.USAGE),
        (StorageError("disk gone"), ExitCode.STORAGE_ERROR),
        (KeyboardInterrupt(), ExitCode.INTERRUPTED),
    ],
)
def test_each_error_type_maps_to_its_exit_code(fake_runner, capsys, error, code):
    def fail(settings):
        raise error

    fake_runner.result = fail
    assert cli.exit_code_for(error) == code
    assert main([]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err == ("kv-cache: interrupted\n" if code == ExitCode.INTERRUPTED else f"kv-cache: error: {error}\n")


def test_unmapped_errors_are_not_exit_codes():
    assert cli.exit_code_for(ValueError("x")) is None


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (StorageSetupError("direct: O_DIRECT is not usable").about("io_mode"),
         "--io-mode direct: O_DIRECT is not usable"),
        (TraceError("/t.json", "no such file").about("validation_trace"), "--validation-trace /t.json: no such file"),
        (PaceError("must be trace, got 'x'").about("think_time"), "--think-time must be trace, got 'x'"),
        (StorageSetupError("/x.zst: needs zstandard").about("io_trace_log"), "--io-trace-log /x.zst: needs zstandard"),
        (TraceError("/t.json", "empty"), "/t.json: empty"),
    ],
)
def test_only_the_cli_names_the_flag(fake_runner, capsys, error, message):
    assert "--" not in str(error).split(":")[0] or not error.setting  # the lower layer's text has no flag

    def fail(settings):
        raise error

    fake_runner.result = fail
    assert main([]) == 2
    assert one_line_error(capsys) == f"kv-cache: error: {message}"


def test_parser_defaults_are_the_settings_defaults():
    parsed = vars(build_parser().parse_args([]))
    for section, cls in SECTIONS.items():
        if section == "storage":  # the --io-* flags default to None: the config's storage section decides
            continue
        for f in dataclasses.fields(cls):  # (flags that choose the source are checked against SourceFlags)
            if f.name in parsed and f.name != "output" and f.name not in SourceFlags.__dataclass_fields__:
                assert parsed[f.name] == f.default, (section, f.name)
    assert parsed["disable_multi_turn"] is (not WorkloadSettings().multi_turn)
    assert parsed["disable_prefix_caching"] is (not WorkloadSettings().prefix_caching)
    assert parsed["think_time"] == str(WorkloadSettings().think_time.kind) == SourceFlags().think_time
    assert parsed["model"] == DEFAULT_MODEL and parsed["seed"] is RunSettings.__dataclass_fields__["seed"].default
    stem = OutputSettings().output.rpartition(".")[0]
    assert parsed["output"].startswith(stem + "_")
    for f in dataclasses.fields(SourceFlags):
        assert parsed[f.name] == f.default
    assert all(parsed[k] is None for k in ("io_chunk_mb", "io_workers", "io_mode", "no_fsync"))


def test_resolved_defaults_match_the_dataclass_defaults():
    s = parse_settings([])
    assert s.storage == StorageSettings()
    assert s.tiers == TierSettings()
    assert s.driver == DriverSettings()
    assert s.workload == WorkloadSettings()
    assert dataclasses.replace(s.outputs, output=OutputSettings().output) == OutputSettings()


def test_sessions_parser_defaults_are_the_settings_defaults():
    parsed = vars(build_parser("sessions").parse_args([]))
    for f in dataclasses.fields(SessionsFlags):
        if f.name != "output":
            assert parsed[f.name] == f.default, f.name
    assert parsed["output"].startswith("sessions_results_") and parsed["output"].endswith(".json")
