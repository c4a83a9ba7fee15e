"""A `kv-cache sessions` run's document: its method, each (model, GPU) cell's `parameters` (where the storage
tier was, the pace transform, the tiers' shaping, the engine model's calibration) and `tier_backends`, and
the whole document of a run's cells, built once here and written by the composition root."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kv_cache import __version__
from kv_cache.results import measurement as meas
from kv_cache.results.integrity import sessions_integrity
from kv_cache.results.run_document import SESSIONS_SCHEMA_VERSION, results_document
from kv_cache.serving.engine.calibration import (
    calibration_errors,
    constants,
    gpu_checks,
    leave_one_out,
    prefill_ttft_errors,
)
from kv_cache.settings.pacing import Pace
from kv_cache.settings.run import redacted_argv
from kv_cache.settings.sessions import LadderSettings, SessionsSettings
from kv_cache.specs import GIB
from kv_cache.storage import backends
from kv_cache.storage.shaped import Shaping

__all__ = ["METHOD", "cell_parameters", "engine_calibration", "engine_gpu_warning", "pace_transform",
           "sessions_cell", "sessions_document", "sessions_storage_location", "tier_backends", "tier_shaping", "this_gpu"]

METHOD = (
    "Closed loop: each of N session slots issues its next turn only after the previous answer completed and "
    "its pause elapsed; a finished session is replaced by the next one. Compute is modelled (roofline per "
    "continuous-batching iteration: its linear layers, then its attention, each the larger of its compute and "
    "memory times; HBM = GPU memory - weights, block prefix cache with LRU); offload tiers "
    "are real: evicted blocks are written to DRAM / files, found blocks are read back. 95 % CIs: rates over "
    "fine bins of the measured window, circular block bootstrap (block length from the data), t interval on its "
    "standard error, clamped at 0 (or, with --replications K, t-interval across K seeded replications, every figure from all K); "
    "TTFT percentiles: pooled per-turn samples of the window, circular block bootstrap interval (block length "
    "from the data); ratios: CI of the ratio of mean throughputs (paired across replications when K > 1). "
    "Effective capacity = the rung (sessions) with the highest mean per-GPU throughput, or with "
    "--slo-ttft-p90 the largest session count whose p90 TTFT of returning turns meets the SLO; the answer: "
    "the SLO bracket bisected (up to 3 extra rungs), then a monotone fit of log p90 on log sessions over every "
    "cell with the evidence (>= 36 returning turns per rung), its crossing, and a paired two-level (replications, cells) residual bootstrap "
    "interval (metrics/slo_fit.py)."
)


def sessions_document(s: SessionsSettings, started: datetime, cells: Sequence[Mapping[str, Any]],
                      libraries: dict[str, Any]) -> dict[str, Any]:
    """The document of a run's cells (each `{"parameters": ..., **its ladder's body}`): the first cell's at the
    top, every cell under `grid` with --models / --gpus, the integrity block of the libraries mapped at start."""
    first = cells[0]
    return results_document({
        "tool": f"kv-cache {__version__}",
        "mode": "sessions",
        "timestamp": started.isoformat(timespec="seconds"),
        "command": " ".join(["kv-cache", "sessions", *redacted_argv(s.argv)]),
        "parameters": first["parameters"],
        "method": METHOD,
        **{k: v for k, v in first.items() if k != "parameters"},
        **({"grid": list(cells)} if s.grid else {}),
        "integrity": sessions_integrity(libraries),
    }, SESSIONS_SCHEMA_VERSION)


def sessions_cell(s: SessionsSettings, ls: LadderSettings, body: Mapping[str, Any],
                  rungs: list[dict[str, Any]]) -> dict[str, Any]:
    """One (model, GPU) cell of the document: its `parameters`, its ladder's body, the backends its rungs ran on."""
    return {"parameters": cell_parameters(s, ls, rungs), **body, "tier_backends": tier_backends(rungs)}


def tier_backends(rungs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The document's `tier_backends`: per tier configuration run (``dram``, ``dram+storage``), the
    registered backend behind each offload tier, as its rungs recorded it (a run document's
    measurement.tier_backends); {} for a configuration with no offload tier."""
    out: dict[str, dict[str, str]] = {}
    for rung in rungs:
        out.setdefault(str(rung.get("tiers")), dict(rung.get("tier_backends") or {}))
    return out


def sessions_storage_location(ls: LadderSettings, tiers: list[str]) -> dict[str, Any]:
    """parameters.storage_location (results/measurement.py): where the storage offload tier's files go (a
    temp dir without --cache-dir) and the I/O mode asked for; without a storage configuration, none."""
    if "dram+storage" not in tiers:
        return meas.storage_location(None, None)
    remote = ls.remote.storage_backend
    backend = backends.find(remote)
    if backend is not None and backend.location is not None:  # a remote tier: the server, no path
        where, source = backend.location(ls.remote)
        return {"cache_dir": where, "mount_point": None, "filesystem": remote, "filesystem_kind": meas.REMOTE,
                "mount_source": source, "block_device": None,
                "io_mode": "network", "io_mode_reason": "a remote storage tier (--storage-backend)"}
    return meas.storage_location(ls.cache_dir or tempfile.gettempdir(), ls.storage.io_mode,
                                 "requested; each rung's storage tier probes O_DIRECT (auto: used where it works)")


def cell_parameters(s: SessionsSettings, ls: LadderSettings, done_rungs: list[dict[str, Any]]) -> dict[str, Any]:
    """The results document's `parameters` for one (model, GPU) cell."""
    tiers = list(s.tiers)
    return {
        "model": ls.model_name, "gpu": ls.gpu_name, "hbm_gb": ls.gpu.hbm_gb, "num_gpus": ls.num_gpus,
        "tensor_parallel": ls.tensor_parallel, "block_tokens": ls.block_tokens,
        "ladder": list(s.ladder) if not s.ladder_auto_start else sorted({r["sessions"] for r in done_rungs}),
        "ladder_auto_start": s.ladder_auto_start or None,
        "tiers": tiers, "window_s": ls.window_s, "warmup_s": ls.warmup_s, "subwindows": ls.subwindows,
        "dram_gib": ls.dram_bytes / GIB, "pace": s.pace_text, "seed": ls.seed, "trace": s.trace,
        "hbm_kv_capacity_blocks": ls.hbm_capacity_blocks(), "io_workers": ls.storage.io_workers,
        "load_policy": ls.load_policy, "steady_state": ls.steady_state, "replications": s.replications,
        "slo_ttft_p90_s": s.slo_ttft_p90_s, "window_plan": s.window_plan if s.slo_ttft_p90_s is not None else "fixed",
        "block_bytes": ls.block_bytes, "block_bytes_per_gpu": ls.block_bytes_per_gpu,
        "dram_usable_fraction": ls.dram_usable_fraction,
        "replica_assignment": "blake2b(seed:session_id) mod replicas",
        "storage_location": sessions_storage_location(ls, tiers),
        "pace_transform": pace_transform(ls.pace, s.pace_text, ls.seed),
        "dram_write_through": ls.dram_write_through,
        "engine_calibration": engine_calibration(ls),
        "tier_shaping": tier_shaping(ls),
    }


def tier_shaping(ls: LadderSettings) -> dict[str, Any]:
    """parameters.tier_shaping: the storage tier's shaping at the top (its keys from before per-tier shaping)
    and every shaped tier's under `tiers` (cpu = the DRAM tier, storage)."""
    tiers = {tier: {"bandwidth_gbps": gbps or None, "latency_ms": ms or None,
                    "described": Shaping(gbps, ms).describe()} for tier, (gbps, ms) in ls.storage.tier_shaping().items()}
    return {"bandwidth_gbps": ls.storage.tier_bandwidth_gbps or None,
            "latency_ms": ls.storage.tier_latency_ms or None, "unit": "GB/s = 10^9 bytes/s",
            "applies_to": "the storage tier's real reads and writes (token bucket per direction); "
                          "`tiers`: each shaped tier's, the DRAM tier (cpu) included",
            "tiers": tiers}


def pace_transform(pace: Pace | None, text: str, seed: int) -> dict[str, Any]:
    """parameters.pace_transform: what `--pace` did to the inter-turn delays, in words and numbers."""
    if pace is None or pace.mode == "trace":
        return {"pace": text, "description": "inter-turn delays as the trace or generator gives them"}
    if pace.mode == "fixed":
        return {"pace": text, "mode": "fixed", "low_s": pace.low_s, "high_s": pace.low_s,
                "description": f"every inter-turn delay replaced by {pace.low_s:g} s"}
    return {"pace": text, "mode": pace.mode, "low_s": pace.low_s, "high_s": pace.high_s, "seed": seed,
            "description": f"every inter-turn delay replaced by a uniform {pace.low_s:g}-{pace.high_s:g} s draw "
                           f"(a {pace.mode} pause), seeded by (seed {seed}, session, turn); first turns untouched"}


def engine_calibration(ls: LadderSettings) -> dict[str, Any]:
    """parameters.engine_calibration: the roofline's efficiencies and its error on every published entry
    (kv_cache/specs/calibration.yaml), and on this run's (GPU, model) where the table has it.

    ``max_abs_prefill_error`` / ``max_abs_decode_error`` and ``this_pair`` are over the per-layer entries
    (vidur's profiling data); ``end_to_end`` gives each end-to-end entry's source kind and error (vLLM's
    benchmark results, MLPerf Inference results), and which of them are within 20 %."""
    rows = calibration_errors(ls.efficiency)
    layers = [r for r in rows if r["kind"] == "layer_profile"]
    whole = [r for r in rows if r["kind"] == "end_to_end"]
    steps = [r for r in rows if r["kind"] == "decode_step"]
    this = [r for r in layers if (r["gpu"], r["model"]) == (ls.gpu_name, ls.model_name)]
    fp8 = constants()["fp8_compute_efficiency"]
    return {
        "fp8_compute_efficiency": {"value": fp8.value, "fitted_on": list(fp8.fitted_on),
                                   "held_out": list(fp8.held_out), "method": fp8.method,
                                   "leave_one_out_errors": dict(fp8.leave_one_out)},
        "prefill_mfu": ls.efficiency.prefill_mfu, "decode_hbm_efficiency": ls.efficiency.decode_hbm_efficiency,
        "max_abs_prefill_error": max(abs(r["prefill_error"]) for r in layers),
        "max_abs_decode_error": max(abs(r["decode_error"]) for r in layers),
        "this_pair": this[0] if this else None,
        "this_pair_published": [r for r in whole + steps if (r["gpu"], r["model"]) == (ls.gpu_name, ls.model_name)],
        "this_gpu": this_gpu(ls),
        "end_to_end": [{"gpu": r["gpu"], "model": r["measured_model"], "source_kind": r["source_kind"],
                        "dtype": r["dtype"], "error": r["error"], "within_20pct": r["within_20pct"],
                        "compute_efficiency": r["compute_efficiency"],
                        "contradicted_by": r.get("contradicted_by"), "input_tokens": r["input_tokens"],
                        "ttft_error": r.get("ttft_error")} for r in whole],
        "decode_steps": [{"gpu": r["gpu"], "model": r["model"], "source_kind": r["source_kind"], "dtype": r["dtype"],
                          "context_tokens": r["context_tokens"], "error": r["error"],
                          "within_20pct": r["within_20pct"]} for r in steps],
        "entries": rows,
        # single-request TTFTs at long inputs (calibration.yaml kind prefill_ttft): TTFTs, not throughputs,
        # so not among `entries`; each with its error over the published figure's reading error
        "prefill_ttfts": prefill_ttft_errors(ls.efficiency),
        "leave_one_out": leave_one_out(ls.efficiency),
        "leave_one_out_method": "each entry's error with it left out of the fit of the constant its kind "
                                "calibrates (prefill_mfu: vidur's prefill profiles; decode_hbm_efficiency: their "
                                "decode steps; fp8_compute_efficiency: the four FP8 runs); an entry in no fit "
                                "(vLLM's runs, decode steps and TTFTs, FlexAI's run) is out of sample as it is "
                                "(serving/engine/calibration.py leave_one_out)",
    }


def this_gpu(ls: LadderSettings) -> dict[str, Any]:
    """parameters.engine_calibration.this_gpu: what the published table holds for this run's GPU at its
    precision (calibration.gpu_checks)."""
    return gpu_checks(calibration_errors(ls.efficiency), ls.gpu_name, ls.efficiency.weight_bytes_per_param, ls.gpu)


def engine_gpu_warning(ls: LadderSettings) -> list[str]:
    """A warning when no published check of the roofline on this run's GPU is within 20 % (this_gpu): the
    run's absolute figures then rest on constants no run of that GPU supports."""
    this = this_gpu(ls)
    return [f"engine model unvalidated on this GPU: {this['statement']}"] if this["unvalidated"] else []
