"""Command-line value checks (MLPerf-compatible rules and messages) and the --cache-dir safety rules.

Every check runs and every failure is collected, so one invocation reports all of its problems. The
upper limits come from the config's `validation_limits` section.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

from kv_cache.settings.fields import flag_defaults
from kv_cache.settings.run import RUN_FLAG_TREE, defaults
from kv_cache.settings.schema import ValidationLimits
from kv_cache.settings.shaping import spec_errors

__all__ = [
    "SYSTEM_TREES",
    "SYSTEM_TREE_EXCEPTIONS",
    "TOP_LEVEL_ONLY_DIRS",
    "advisories",
    "check_cache_dir",
    "conflicting_features",
    "validate_args",
]

# Refused together with everything below them (after symlinks are resolved)...
SYSTEM_TREES = (
    "/etc",
    "/bin",
    "/sbin",
    "/usr",
    "/boot",
    "/sys",
    "/proc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/dev",
)
# ...except these RAM-disk trees, a common baseline for a storage benchmark.
SYSTEM_TREE_EXCEPTIONS = ("/dev/shm",)
# Refused themselves (a benchmark must not scatter files into them) but fine to have a subdirectory of.
TOP_LEVEL_ONLY_DIRS = ("/", "/root", "/var", "/home", "/opt", "/srv", "/mnt", "/media", "/tmp", "/run")

# Parser defaults, used when a namespace lacks an attribute (callers may pass partial objects): the
# settings' defaults and the flags' own, both read from the settings tree (the --io-* flags default to
# None, meaning "as the config's storage section says").
_DEFAULTS: dict[str, Any] = {**defaults(), **flag_defaults(RUN_FLAG_TREE)}

def validate_args(args: Any, limits: ValidationLimits | None = None) -> list[str]:
    """All problems with the flag values, in the MLPerf tool's order and wording (empty list = valid)."""
    limits = limits if limits is not None else ValidationLimits()

    def get(name: str) -> Any:
        return getattr(args, name, _DEFAULTS[name])

    errors: list[str] = []
    _check_sizes(get, limits, errors)
    _check_placement(get, errors)
    return errors


def _finite(errors: list[str], flag: str, value: Any) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        errors.append(f"{flag} must be a finite number, got {value}")
        return False
    return True


def _check_sizes(get: Callable[[str], Any], limits: ValidationLimits, errors: list[str]) -> None:
    """Users, duration, memory budgets and the other counts and rates, in the MLPerf tool's order."""

    def finite(flag: str, value: Any) -> bool:
        return _finite(errors, flag, value)

    num_users = get("num_users")
    if num_users <= 0:
        errors.append(f"--num-users must be positive, got {num_users}")
    elif num_users > limits.max_users:
        errors.append(f"--num-users exceeds limit ({limits.max_users}), got {num_users}")

    duration = get("duration")
    if finite("--duration", duration):
        if duration <= 0:
            errors.append(f"--duration must be positive, got {duration}")
        elif duration > limits.max_duration_seconds:
            errors.append(
                f"--duration exceeds {_duration_limit(limits.max_duration_seconds)}, got {duration}"
            )

    for flag, name in (("--start-delay", "start_delay"), ("--end-delay", "end_delay")):
        delay = get(name)
        if delay is not None and finite(flag, delay) and delay < 0:
            errors.append(f"{flag} cannot be negative, got {delay:g}")
        elif delay is not None and math.isfinite(delay) and delay > limits.max_duration_seconds:
            # (a wait past the platform's time_t would end in an OverflowError, after the banner)
            errors.append(f"{flag} exceeds {_duration_limit(limits.max_duration_seconds)}, got {delay:g}")

    for flag, name in (("--remote-grace-s", "remote_grace_s"), ("--remote-failover-s", "remote_failover_s")):
        bound = get(name)  # (None: the config's, checked with the config; NaN there ended no wait, < 0 every one)
        if bound is not None and finite(flag, bound) and bound < 0:
            errors.append(f"{flag} cannot be negative, got {bound:g}")

    trim = get("malloc_trim_interval")
    if trim is not None and finite("--malloc-trim-interval", trim) and trim < 0:
        errors.append(f"--malloc-trim-interval cannot be negative, got {trim:g} (0 = never)")

    interval = get("partial_results_interval")
    if interval is not None and finite("--partial-results-interval", interval) and interval < 0:
        errors.append(f"--partial-results-interval cannot be negative, got {interval:g} (0 = only at the end)")

    for flag, name, limit in (
        ("--gpu-mem-gb", "gpu_mem_gb", limits.max_gpu_memory_gb),
        ("--cpu-mem-gb", "cpu_mem_gb", limits.max_cpu_memory_gb),
    ):
        value = get(name)
        if not finite(flag, value):
            continue
        if value < 0:
            errors.append(f"{flag} cannot be negative, got {value}")
        elif value > limit:
            errors.append(f"{flag} exceeds limit ({_fmt(limit)}GiB), got {value}")

    rag_num_docs = get("rag_num_docs")
    if rag_num_docs < 0:
        errors.append(f"--rag-num-docs cannot be negative, got {rag_num_docs}")
    max_conversations = get("max_conversations")
    if max_conversations <= 0:
        errors.append(f"--max-conversations must be positive, got {max_conversations}")

    for flag, name in (
        ("--max-concurrent-allocs", "max_concurrent_allocs"),
        ("--request-rate", "request_rate"),
        ("--max-requests", "max_requests"),
        ("--storage-capacity-gb", "storage_capacity_gb"),
        ("--precondition-size-gb", "precondition_size_gb"),
        ("--precondition-threads", "precondition_threads"),
        ("--trace-speedup", "trace_speedup"),
        ("--replay-cycles", "replay_cycles"),
    ):
        value = get(name)
        if finite(flag, value) and value < 0:
            errors.append(f"{flag} cannot be negative, got {value}")
    errors += spec_errors(get("tier_bandwidth"), get("tier_latency"))  # a number or TIER=VALUE,... each

    target_saturation = get("target_saturation")
    if finite("--target-saturation", target_saturation) and not 0.0 <= target_saturation <= 1.0:
        errors.append(f"--target-saturation must be between 0.0 and 1.0, got {target_saturation}")


def _check_placement(get: Callable[[str], Any], errors: list[str]) -> None:
    """GPUs and tensor parallelism, the storage tier's directory and the I/O engine overrides."""
    num_gpus, tensor_parallel = get("num_gpus"), get("tensor_parallel")
    if num_gpus < 1:
        errors.append(f"--num-gpus must be >= 1, got {num_gpus}")
    if tensor_parallel < 1:
        errors.append(f"--tensor-parallel must be >= 1, got {tensor_parallel}")
    elif num_gpus >= 1 and tensor_parallel > num_gpus:
        errors.append(f"--tensor-parallel ({tensor_parallel}) cannot exceed --num-gpus ({num_gpus})")
    elif num_gpus >= 1 and num_gpus % tensor_parallel:
        errors.append(f"--num-gpus ({num_gpus}) must be a multiple of --tensor-parallel ({tensor_parallel}): "
                      "the GPUs form groups of --tensor-parallel")

    cache_dir = get("cache_dir")
    if cache_dir is not None:
        problem = check_cache_dir(cache_dir)
        if problem:
            errors.append(problem)

    io_chunk_mb, io_workers = get("io_chunk_mb"), get("io_workers")
    if io_chunk_mb is not None and io_chunk_mb < 1:
        errors.append(f"--io-chunk-mb must be >= 1, got {io_chunk_mb}")
    if io_workers is not None and io_workers < 0:
        errors.append(f"--io-workers cannot be negative, got {io_workers}")


def conflicting_features(args: Any) -> list[str]:
    """One message per pair of flags given that cannot run together."""
    errors = []
    request_rate = getattr(args, "request_rate", _DEFAULTS["request_rate"])
    if getattr(args, "enable_autoscaling", _DEFAULTS["enable_autoscaling"]) and isinstance(request_rate, (int, float)) and request_rate > 0:
        errors.append("--enable-autoscaling scales closed-loop users; it cannot be combined with --request-rate")
    limit = getattr(args, "device_limit_gbs", None)
    if limit is not None and limit < 0:
        errors.append(f"--device-limit-gbs {limit:g}: give the device's rated GB/s, a positive number (e.g. 14.5)")
    if getattr(args, "gds", False) and getattr(args, "verify", False):
        errors.append("--gds reads land in GPU memory, where --verify cannot check their stamps; drop one of them")
    return errors


def advisories(args: Any) -> list[str]:
    """Warnings that do not stop the run (to be logged once logging is configured)."""
    tensor_parallel = getattr(args, "tensor_parallel", 1)
    if tensor_parallel > 1 and tensor_parallel & (tensor_parallel - 1):
        return [
            f"--tensor-parallel {tensor_parallel} is not a power of 2; uncommon for real deployments but allowed"
        ]
    return []


def check_cache_dir(path: str) -> str | None:
    """Why `path` must not be the storage tier's directory, or None when it is acceptable.

    Judged on the fully resolved path (symlinks followed), component by component, never as a plain
    string prefix: `/`, $HOME, `/root` and the top-level directories in TOP_LEVEL_ONLY_DIRS are refused
    themselves; the system trees are refused with everything inside them, except /dev/shm.
    """
    if not str(path).strip():
        return "--cache-dir must not be empty; leave it out to use a fresh temporary directory"
    resolved = os.path.realpath(os.path.expanduser(os.fspath(path)))
    home = os.path.realpath(os.path.expanduser("~"))
    in_system_tree = any(_within(resolved, tree) for tree in _with_realpaths(SYSTEM_TREES)) and not any(
        _within(resolved, allowed) for allowed in _with_realpaths(SYSTEM_TREE_EXCEPTIONS)
    )
    if in_system_tree or resolved in _with_realpaths(TOP_LEVEL_ONLY_DIRS) or resolved == home:
        where = os.path.join(tempfile.gettempdir(), "kvcache_benchmark") if in_system_tree else \
            os.path.join(resolved, "kvcache_benchmark")
        why = ("a system tree" if in_system_tree else
               "a shared top-level directory (a subdirectory of it is fine: the default temporary cache dir is one)")
        return (f"--cache-dir cannot be a system directory: {resolved} is {why}, and the benchmark fills its cache "
                f"dir with gigabytes of files; use a directory of its own, e.g. --cache-dir {where}")
    fix = "; choose a directory you can write to (it is created if missing)"
    if os.path.lexists(resolved):
        if not os.path.isdir(resolved):
            return f"--cache-dir is not a directory: {resolved}{fix}"
        if not os.access(resolved, os.W_OK | os.X_OK):
            return f"--cache-dir is not writable: {resolved}{fix}"
        return None
    # The directory will be created (with its missing parents): the nearest existing ancestor must
    # be a writable directory.
    parent = os.path.dirname(resolved)
    while not os.path.lexists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"--cache-dir parent is not a directory: {parent}{fix}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--cache-dir parent is not writable: {parent}{fix}"
    return None


def _with_realpaths(paths: tuple[str, ...]) -> set[str]:
    """The paths as written and as resolved (e.g. /lib -> /usr/lib on merged-/usr systems)."""
    return set(paths) | {os.path.realpath(p) for p in paths}


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _duration_limit(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour{'s' if hours != 1 else ''} ({seconds}s)"
    return f"limit ({seconds}s)"
