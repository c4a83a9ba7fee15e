"""Parsed flags + config.yaml -> RunSettings: validation, overrides, per-rank paths.

Nothing here opens a trace file: the workload source is only chosen and its paths resolved; the
composition root opens the files once, before the run does any I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import fields
from typing import Any, TypeVar

from kv_cache.errors import UsageError
from kv_cache.results.outputs import check_output_path
from kv_cache.settings.fields import field_default, flag_of
from kv_cache.settings.pacing import parse_think_time
from kv_cache.settings.ranks import rank_share, share_errors
from kv_cache.settings.run import (
    DriverSettings,
    OutputSettings,
    RunSettings,
    StorageSettings,
    TierSettings,
    WorkloadSettings,
)
from kv_cache.settings.schema import BenchConfig, load_config
from kv_cache.settings.shaping import shaping_fields
from kv_cache.settings.validation import conflicting_features, validate_args
from kv_cache.storage import backends
from kv_cache.storage.gds import import_kvikio
from kv_cache.storage.gpu_device import cuda_status
from kv_cache.storage.tracelog import check_trace_path
from kv_cache.workload.replay import resolve_burst_paths
from kv_cache.workload.validation import load_trace_stats

__all__ = ["gpu_tier_errors", "mpi_local_size", "mpi_rank", "resolve_run", "trace_source"]

MIB = 1024 * 1024
T = TypeVar("T")


def resolve_run(args: argparse.Namespace, argv: list[str], rank_paths: bool = True,
                flags_per_rank: bool = False) -> RunSettings:
    """The run's immutable settings from the parsed flags; raises UsageError (or a subclass) when invalid.

    rank_paths=False: the caller (mlperf_wrapper.py) already gave this rank its own output and cache dir.
    Under mpirun the flags are the whole run's totals, and this rank takes its share of them
    (settings/ranks.py), unless flags_per_rank: the caller (mlperf_wrapper.py, whose Rules define the flags
    per client) gave each rank its own values, seed included."""
    if args.prefill_only and args.decode_only:
        raise UsageError("--prefill-only and --decode-only are mutually exclusive")
    config = load_config(args.config)
    errors = validate_args(args, config.validation_limits) + backends.option_errors(args)
    errors += conflicting_features(args)
    model = config.model_configs.get(args.model)
    if model is None:
        errors.append(f"unknown model '{args.model}' (available: {', '.join(sorted(config.model_configs))})")
    errors += gpu_tier_errors(args, config)
    if errors:
        raise UsageError("; ".join(errors))

    cache_dir = os.path.abspath(os.path.expanduser(args.cache_dir)) if args.cache_dir is not None else None
    output = merged_output = args.output
    rank, world = mpi_rank()
    if world > 1 and rank_paths:  # several ranks were given the same --output and --cache-dir: keep them apart
        if cache_dir is not None:
            cache_dir = os.path.join(cache_dir, f"rank{rank}")
        stem, dot, ext = output.rpartition(".")
        output = f"{stem}_rank{rank}.{ext}" if dot and "/" not in ext else f"{output}_rank{rank}"
    if args.io_trace_log:
        check_trace_path(args.io_trace_log)
    check_output_paths(args, output)
    settings = RunSettings(
        config=config,
        model=model,
        model_name=args.model,
        seed=args.seed,
        config_path=args.config,
        storage=_storage(args, config),
        tiers=from_flags(TierSettings, args, cache_dir=cache_dir, gpu_spec=config.gpus.get(args.gpu_type),
                         remote=backends.remote_settings(args)),
        workload=_workload(args),
        driver=from_flags(DriverSettings, args, processes=_processes(args, world)),
        outputs=from_flags(OutputSettings, args, output=output),
        mpi_rank=rank if world > 1 else None,
        mpi_world_size=world,
        merged_output=merged_output if world > 1 and rank_paths else None,
        argv=tuple(argv),
    )
    return _rank_of_world(settings, rank, world, flags_per_rank)


def _rank_of_world(settings: RunSettings, rank: int, world: int, flags_per_rank: bool) -> RunSettings:
    """This MPI rank's settings: its share of the totals given, or the flags as given (per-rank values);
    either way the host's memory budget is divided between the ranks on this host."""
    if settings.driver.processes > 1:  # the totals of --processes are divided when the processes start: check now
        errors = share_errors(settings, settings.driver.processes)
        if errors:
            raise UsageError("; ".join(errors))
    if world <= 1:
        return settings
    # the node-local split is collective: every rank enters it here, whichever launcher variables it was
    # given, or a rank that has them would go on to the run's collectives while one without waits in it
    mpi_node_local()
    local = mpi_local_size()
    local_rank, source = mpi_local_rank()
    if flags_per_rank:
        return dataclasses.replace(settings, flags_per_rank=True,
                                   tiers=dataclasses.replace(settings.tiers, host_ranks=local,
                                                             local_rank=local_rank, local_rank_from=source))
    share = rank_share(settings, rank, world, host_ranks=local)
    return dataclasses.replace(share, tiers=dataclasses.replace(share.tiers, local_rank=local_rank,
                                                                local_rank_from=source))


def gpu_tier_errors(args: argparse.Namespace, config: BenchConfig) -> list[str]:
    """The GPU tier flags: a known GPU type with a host link to model, and CUDA when real is asked for."""
    if args.gds and (args.gpu_mem_gb <= 0 or args.gpu_tier in ("off", "simulated") or args.io_trace_log):
        return ["--gds needs the real GPU tier (--gpu-mem-gb > 0, --gpu-tier real or auto with CUDA)"]
    if args.gds and import_kvikio() is None:
        return ["--gds needs kvikio (pip install kvikio-cu12)"]
    if args.gpu_mem_gb <= 0 or args.gpu_tier == "off" or args.io_trace_log:
        return []
    spec = config.gpus.get(args.gpu_type)
    if spec is None:
        return [f"unknown --gpu-type '{args.gpu_type}' (available: {', '.join(sorted(config.gpus))})"]
    if args.gpu_tier == "real" or args.gds:
        ok, reason = cuda_status(args.num_gpus)
        return [] if ok else [f"--{'gds' if args.gds else 'gpu-tier real'} needs CUDA: {reason}"]
    if args.gpu_tier == "simulated" and spec.host_link_gbs <= 0:
        return [f"--gpu-type '{args.gpu_type}' has no host_link_gbs in the config's gpus section to model "
                "the simulated GPU tier with"]
    return []


def check_output_paths(args: argparse.Namespace, output: str) -> None:
    """Every file the run will write, checked before anything runs (a bad one: UsageError naming its flag)."""
    for setting, path, example in (("output", output, "results.json"),
                                   ("xlsx_output", args.xlsx_output, "results.xlsx"),
                                   ("io_trace_log", args.io_trace_log, "io_trace.csv")):
        if path is not None:
            try:
                check_output_path(path, example, allow_devnull=setting == "io_trace_log")
            except UsageError as exc:
                raise exc.about(setting) from None


def _processes(args: argparse.Namespace, world: int) -> int:
    n = args.processes
    if n < 1:
        raise UsageError(f"--processes must be at least 1, got {n}")
    if n > 1 and world > 1:
        raise UsageError("--processes splits one host's run; under mpirun give the ranks with -n instead")
    if n > 1 and (args.trace or args.dataset_path or args.use_burst_trace or args.io_trace_log):
        raise UsageError("--processes splits synthetic users; it cannot be combined with a trace or --io-trace-log")
    if n > args.num_users:
        raise UsageError(f"--processes {n} needs at least as many users (--num-users {args.num_users})")
    return n


def _storage(args: argparse.Namespace, config: BenchConfig) -> StorageSettings:
    """The config's storage section with the --io-* flags given on the command line laid over it."""
    storage = config.storage
    return StorageSettings(
        chunk_bytes=(args.io_chunk_mb if args.io_chunk_mb is not None else storage.chunk_size_mb) * MIB,
        fsync=False if args.no_fsync else storage.fsync,
        io_mode=args.io_mode if args.io_mode is not None else storage.io_mode,
        io_workers=args.io_workers if args.io_workers is not None else storage.io_workers,
        io_retries=storage.io_retries, max_storage_errors=storage.max_storage_errors,
        remote_grace_s=_given(args, "remote_grace_s", storage.remote_grace_s),
        remote_failover_s=_given(args, "remote_failover_s", storage.remote_failover_s),
        verify=bool(getattr(args, "verify", StorageSettings.verify)),
        **shaping_fields(getattr(args, "tier_bandwidth", None), getattr(args, "tier_latency", None)),
    )


def _given(args: argparse.Namespace, name: str, configured: float) -> float:
    """A flag given on the command line (as a float), else the config file's value."""
    value = getattr(args, name, None)
    return float(value) if value is not None else float(configured)


def _workload(args: argparse.Namespace) -> WorkloadSettings:
    trace_stats = load_trace_stats(args.validation_trace) if args.validation_trace else None
    trace_paths, trace_format = trace_source(args)
    return from_flags(WorkloadSettings, args, trace_paths=trace_paths, trace_format=trace_format,
                      think_time=parse_think_time(args.think_time), validation_trace_stats=trace_stats)


def from_flags(cls: type[T], args: argparse.Namespace, **computed: Any) -> T:
    """A settings section from the parsed flags, by walking its fields: a flagged field takes its flag's
    value (`not` it for a --disable-X switch; an int flag of a float setting as a float), a flag missing
    from a partial namespace its default; `computed` gives the fields that are derived, not copied."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        flag = flag_of(f)
        if f.name in computed or flag is None:
            continue
        default = field_default(f)
        value = getattr(args, flag.dest, flag.default_for(default))
        if flag.invert:
            value = not value
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        values[f.name] = value
    return cls(**values, **computed)


def trace_source(args: argparse.Namespace) -> tuple[tuple[str, ...], str | None]:
    """Which trace (if any) drives the run, and in which format ("auto" = detected when opened)."""
    chosen = [flag for flag, on in (("--trace", args.trace), ("--dataset-path", args.dataset_path),
                                    ("--use-burst-trace", args.use_burst_trace)) if on]
    if len(chosen) > 1:
        raise UsageError(f"choose one workload source, not {' and '.join(chosen)}")
    if args.kv_block_tokens < 0:
        raise UsageError(f"--kv-block-tokens cannot be negative, got {args.kv_block_tokens}")
    if args.trace:
        paths, fmt = (args.trace,), args.trace_format
    elif args.dataset_path:
        paths, fmt = (args.dataset_path,), "sharegpt"
    elif args.use_burst_trace:
        paths, fmt = tuple(resolve_burst_paths(args.burst_trace_path)), "burstgpt"
    else:
        return (), None
    if args.enable_autoscaling:
        raise UsageError("--enable-autoscaling scales synthetic users; it cannot be combined with a trace")
    return paths, fmt


def mpi_local_size() -> int:
    """How many ranks of this MPI job run on this host (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's
    MPI_LOCALNRANKS, MVAPICH's MV2_COMM_WORLD_LOCAL_SIZE); for a launcher that says none of these, the
    node-local communicator's size (mpi_node_local); 1 when that cannot be had either."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"):
        try:
            return max(1, int(os.environ[var]))
        except (KeyError, ValueError):
            continue
    node = mpi_node_local()
    return node[1] if node else 1


def mpi_node_local() -> tuple[int, int] | None:
    """(this rank's index, the rank count) among the ranks sharing this host, from MPI itself: the MPI-3
    shared-memory split of COMM_WORLD (MPI_COMM_TYPE_SHARED), for launchers that set no local-rank
    variables. Collective: every rank of the job calls it at the same point (_rank_of_world calls it on
    every rank, the launcher's variables set or not; later calls return the first answer). None without
    mpi4py or outside a multi-rank job."""
    global _NODE_LOCAL
    if _NODE_LOCAL is None:
        try:
            from mpi4py import MPI  # noqa: PLC0415  (only under mpirun)

            world = MPI.COMM_WORLD
            if world.Get_size() <= 1:
                _NODE_LOCAL = ()
            else:
                node = world.Split_type(MPI.COMM_TYPE_SHARED)
                _NODE_LOCAL = (node.Get_rank(), node.Get_size())
                node.Free()
        except Exception:  # noqa: BLE001  (no mpi4py, or an MPI without MPI-3 shared split: say 1)
            _NODE_LOCAL = ()
    return _NODE_LOCAL or None


_NODE_LOCAL: tuple[int, ...] | None = None


def mpi_local_rank() -> tuple[int, str]:
    """(this rank's index among the ranks on this host, the variable it came from): Open MPI's
    OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID, MVAPICH's MV2_COMM_WORLD_LOCAL_RANK, or Slurm's
    SLURM_LOCALID (srun starting the ranks through PMI sets no MPI variable for it); else MPI's own
    node-local split (mpi_node_local); (0, "") when none says."""
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        try:
            return max(0, int(os.environ[var])), var
        except (KeyError, ValueError):
            continue
    node = mpi_node_local()
    return (node[0], "MPI_COMM_TYPE_SHARED") if node else (0, "")


def mpi_rank() -> tuple[int, int]:
    """(rank, world size) from the MPI launcher's environment (Open MPI or PMI); (0, 1) otherwise."""
    env = os.environ
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank_var in env:
            try:
                return int(env[rank_var]), int(env.get(size_var, "1"))
            except ValueError:
                raise UsageError(f"{rank_var}={env[rank_var]!r} is not an integer") from None
    return 0, 1
