"""The roofline against published throughputs: kv_cache/specs/calibration.yaml, and the model's error on
each entry.

Two kinds of entry (the YAML's header says what was measured and where):

- ``layer_profile`` (vidur's profiling data): a (GPU, model, tensor parallelism) and the measured
  throughput of the layers' linear work for one prefill batch and one decode step. The roofline's figure
  for the same work:

  - prefill: ``tokens / (2 x active_params x tokens / (tp x peak_dense_tflops x 1e12 x prefill_mfu))``
    (``prefill_seconds`` without its attention term);
  - decode: ``tokens / decode_step_seconds(batch = tokens, context = 0)`` (the weights read once, no KV).

- ``decode_step`` (vLLM's benchmark results): the time of one decode step at batch 1 and a stated context,
  from a published fit of inter-token latency against context length; the roofline's figure is
  ``decode_step_seconds(batch = 1, context)``, as tokens per second.

- ``end_to_end`` (vLLM's benchmark results, MLPerf Inference results): output tokens per second of a whole
  benchmark run (prefill, decode, attention and batching mixed) with stated mean input and output lengths,
  concurrency (or batch size) and precision. The roofline's figure is the sessions engine's own batching
  rule on modelled time (``closed_loop``): the benchmark's requests through one replica, times the
  replicas the published system had.

And one kind of TTFT check, kept apart from the throughputs (``prefill_ttft_errors``):

- ``prefill_ttft`` (vLLM's benchmark results): the time to first token of one request alone on the GPU at
  stated input lengths (no batching, no queue, no cached prefix); the roofline's figure is ``closed_loop``'s
  TTFT of that one request.

The error is ``modelled / published - 1`` (+0.10: the roofline is 10 % faster than the measurement).

An FP8 entry is costed at ``fp8_compute_efficiency`` of the FP8 dense peak (a ``kind: constant`` item of
the YAML, fitted on the entries it names: ``fit_fp8_compute_efficiency`` recomputes it), a BF16 one at
``prefill_mfu`` of the BF16 peak.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from kv_cache.serving.engine import roofline
from kv_cache.serving.engine.closed_loop import closed_loop
from kv_cache.specs import GPUSpec, gpu_specs
from kv_cache.specs.models import MODEL_CONFIGS, SESSION_MODELS, ModelConfig

__all__ = [
    "CalibrationEntry",
    "DecodeStepEntry",
    "EndToEndEntry",
    "PRECISIONS",
    "Precision",
    "calibration_entries",
    "calibration_errors",
    "end_to_end_tokens_per_s",
    "exact_compute_efficiency",
    "fit_fp8_compute_efficiency",
    "fp8_compute_efficiency",
    "fp8_leave_one_out",
    "leave_one_out",
    "end_to_end_median_ttft_s",
    "gpu_checks",
    "PrefillTTFTEntry",
    "prefill_ttft_entries",
    "prefill_ttft_errors",
    "prefill_ttft_seconds",
]

BAND = 0.20  # the error the tests hold each claimed entry within


@dataclass(frozen=True)
class Precision:
    """What a run's number format changes in the roofline: bytes per weight, bytes per KV element, the
    tensor cores' dense rate as a multiple of the GPU's BF16 figure (``peak_dense_tflops``), and the share
    of that rate a run achieves (None: ``prefill_mfu``, the BF16 calibration)."""

    weight_bytes_per_param: float
    kv_dtype: str  # a kv_cache.specs.models DTYPE_BYTES key
    flops_multiplier: float
    compute_efficiency: str | None = None  # a calibration.yaml `kind: constant` name, or None


# bf16: the roofline as the sessions engine runs it. fp8: 1-byte weights and KV, and twice the BF16 dense rate
# (NVIDIA H100 / H200 datasheets: FP8 3,958 TFLOPS with sparsity = 1,979 dense, against BF16 1,979 with
# sparsity = 989 dense; L40S: FP8 1,466 with sparsity = 733 dense, against BF16 362 dense), of which a run
# achieves the yaml's fp8_compute_efficiency (fitted on published FP8 runs; prefill_mfu stays the BF16 rate).
# The KV is costed at 1 byte per element ("int8" in the model table).
PRECISIONS = {
    "bf16": Precision(weight_bytes_per_param=2.0, kv_dtype="bfloat16", flops_multiplier=1.0),
    "fp8": Precision(weight_bytes_per_param=1.0, kv_dtype="int8", flops_multiplier=2.0,
                     compute_efficiency="fp8_compute_efficiency"),
}


@dataclass(frozen=True)
class CalibrationEntry:
    """One published per-layer measurement: tokens per second of a prefill batch and of a decode step."""

    gpu: str
    model: str
    tp: int
    source: str
    prefill_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float
    source_kind: str = "vidur profiling data"
    kind: str = "layer_profile"


@dataclass(frozen=True)
class EndToEndEntry:
    """One published end-to-end benchmark result: output tokens per second of a whole run."""

    gpu: str
    model: str
    tp: int
    source: str
    source_kind: str  # "vLLM benchmark results" | "MLPerf Inference results"
    gpus: int  # GPUs of the published system (replicas = gpus / tp)
    dtype: str  # a PRECISIONS key
    input_tokens: float  # mean per request
    output_tokens: float  # mean per request
    concurrency: int  # requests in flight per replica (max concurrency, or the submission's batch size)
    requests: int  # requests simulated per replica
    spread: float  # lengths uniform within +-spread of the mean (0: every request at the mean)
    steady_state: bool  # measure without the start-up ramp and the tail (a run far longer than a batch)
    prefill_chunk_tokens: int
    published_tokens_per_s: float  # the system's output tokens per second
    held_within_band: bool  # the table's claim: |error| <= 20 % (tests check it either way)
    id: str = ""  # the name a `kind: constant` fit refers to it by
    params_b: float = 0.0  # the measured model's parameter count where it differs from the table's model
    measured_model: str = ""  # the model the source ran, where the table's `model` stands in for it
    # a published measurement of the same work that no value of the roofline's constants holds within 20 %
    # together with this one (calibration.yaml `contradicted_by`; a test proves it): "" for none
    contradicted_by: str = ""
    published_median_ttft_ms: float = 0.0  # the run's median TTFT where it publishes one (0: none)
    kind: str = "end_to_end"


@dataclass(frozen=True)
class DecodeStepEntry:
    """One published decode step: batch 1 at ``context_tokens`` of context, in milliseconds (a point of a
    published linear fit ``ITL = intercept + slope x context``)."""

    gpu: str
    model: str
    tp: int
    source: str
    source_kind: str
    dtype: str
    context_tokens: int
    published_ms: float
    held_within_band: bool
    kind: str = "decode_step"


@dataclass(frozen=True)
class PrefillTTFTEntry:
    """One published single-request TTFT: one request of ``input_tokens`` alone on the GPU, its prefill
    recomputed (no cached prefix), in milliseconds (calibration.yaml ``kind: prefill_ttft``; one entry per
    input length it lists)."""

    gpu: str
    model: str
    tp: int
    source: str
    source_kind: str
    dtype: str  # a PRECISIONS key
    input_tokens: int
    published_ms: float
    prefill_chunk_tokens: int
    reading_error_ms: float  # the published figure's own reading error (a value read off a plot), 0 if tabulated
    tokens_per_k: int  # how the source's "K tokens" were costed (1000); the tests also try 1024
    held_within_band: bool
    kind: str = "prefill_ttft"


def _prefill_entries(e: dict[str, Any]) -> list[PrefillTTFTEntry]:
    if e["dtype"] not in PRECISIONS:
        raise ValueError(f"calibration.yaml: dtype {e['dtype']!r} is not one of {', '.join(PRECISIONS)}")
    return [PrefillTTFTEntry(
        gpu=e["gpu"], model=e["model"], tp=int(e["tp"]), source=e["source"], source_kind=e["source_kind"],
        dtype=e["dtype"], input_tokens=int(n), published_ms=float(ms),
        prefill_chunk_tokens=int(e["prefill_chunk_tokens"]), reading_error_ms=float(e.get("reading_error_ms", 0.0)),
        tokens_per_k=int(e.get("tokens_per_k", 1000)), held_within_band=bool(e["held_within_20pct"]))
        for n, ms in sorted(e["published_ttft_ms"].items())]


def _decode_entries(e: dict[str, Any]) -> list[DecodeStepEntry]:
    fit = e["fit"]
    return [DecodeStepEntry(
        gpu=e["gpu"], model=e["model"], tp=int(e["tp"]), source=e["source"], source_kind=e["source_kind"],
        dtype=e["dtype"], context_tokens=int(c),
        published_ms=float(fit["intercept_ms"]) + float(fit["slope_ms_per_token"]) * int(c),
        held_within_band=bool(e["held_within_20pct"])) for c in e["context_tokens"]]


def _layer_entry(e: dict[str, Any]) -> CalibrationEntry:
    return CalibrationEntry(
        gpu=e["gpu"], model=e["model"], tp=int(e["tp"]), source=e["source"],
        prefill_tokens=int(e["prefill"]["tokens"]), prefill_tokens_per_s=float(e["prefill"]["tokens_per_s"]),
        decode_tokens=int(e["decode"]["tokens"]), decode_tokens_per_s=float(e["decode"]["tokens_per_s"]),
        source_kind=e.get("source_kind", "vidur profiling data"),
    )


def _end_to_end_entry(e: dict[str, Any]) -> EndToEndEntry:
    w = e["workload"]
    if e["dtype"] not in PRECISIONS:
        raise ValueError(f"calibration.yaml: dtype {e['dtype']!r} is not one of {', '.join(PRECISIONS)}")
    return EndToEndEntry(
        gpu=e["gpu"], model=e["model"], tp=int(e["tp"]), source=e["source"], source_kind=e["source_kind"],
        gpus=int(e["gpus"]), dtype=e["dtype"], input_tokens=float(w["input_tokens"]),
        output_tokens=float(w["output_tokens"]), concurrency=int(w["concurrency"]), requests=int(w["requests"]),
        spread=float(w.get("spread", 0.0)), steady_state=bool(w.get("steady_state", False)),
        prefill_chunk_tokens=int(w["prefill_chunk_tokens"]),
        published_tokens_per_s=float(e["published"]["output_tokens_per_s"]),
        held_within_band=bool(e["held_within_20pct"]), id=e.get("id", ""), params_b=float(e.get("params_b", 0.0)),
        measured_model=e.get("measured_model", e["model"]), contradicted_by=str(e.get("contradicted_by", "")),
        published_median_ttft_ms=float(e["published"].get("median_ttft_ms", 0.0)),
    )


Entry = CalibrationEntry | DecodeStepEntry | EndToEndEntry


@dataclass(frozen=True)
class Constant:
    """A constant of the model derived from entries of the table (``kind: constant``)."""

    name: str
    value: float
    fitted_on: tuple[str, ...]  # entry ids it was fitted on
    held_out: tuple[str, ...]  # entry ids it is checked on, not fitted on
    method: str
    leave_one_out: tuple[tuple[str, float], ...] = ()  # (entry id, its error with it left out of the fit)


@cache
def _yaml() -> tuple[dict[str, Any], ...]:
    text = resources.files("kv_cache.specs").joinpath("calibration.yaml").read_text(encoding="utf-8")
    return tuple(yaml.safe_load(text))


@cache
def constants() -> dict[str, Constant]:
    """The ``kind: constant`` items of calibration.yaml, by name."""
    return {c["name"]: Constant(c["name"], float(c["value"]), tuple(c["fitted_on"]), tuple(c["held_out"]),
                                c["method"], tuple((k, float(v)) for k, v in (c.get("leave_one_out") or {}).items()))
            for c in _yaml() if c.get("kind") == "constant"}


def fp8_compute_efficiency() -> float:
    """FP8 achieved / FP8 dense peak, as calibration.yaml derives it (its ``fp8_compute_efficiency``)."""
    return constants()["fp8_compute_efficiency"].value


@cache
def calibration_entries() -> tuple[Entry, ...]:
    """The entries of kv_cache/specs/calibration.yaml, in its order (a decode_step entry gives one entry
    per context length it lists; ``kind: constant`` items are not entries)."""
    out: list[Entry] = []
    for e in _yaml():
        kind = e.get("kind", "layer_profile")
        if kind in ("constant", "prefill_ttft"):  # prefill_ttft: TTFT checks, prefill_ttft_entries()
            continue
        if kind == "end_to_end":
            out.append(_end_to_end_entry(e))
        elif kind == "decode_step":
            out.extend(_decode_entries(e))
        else:
            out.append(_layer_entry(e))
    return tuple(out)


@cache
def prefill_ttft_entries() -> tuple[PrefillTTFTEntry, ...]:
    """The ``kind: prefill_ttft`` items of calibration.yaml, one entry per input length, in its order."""
    return tuple(x for e in _yaml() if e.get("kind") == "prefill_ttft" for x in _prefill_entries(e))


def _model(name: str) -> ModelConfig:
    return {**MODEL_CONFIGS, **SESSION_MODELS}[name]


def modelled_tokens_per_s(entry: CalibrationEntry, eff: roofline.Efficiency) -> tuple[float, float]:
    """The roofline's (prefill, decode) tokens per second for a layer entry's work (see the module doc), at
    the profile's 2-byte (fp16) weights whatever ``eff.weight_bytes_per_param`` a run sets: the profile
    measured 16-bit kernels."""
    gpu, model = gpu_specs()[entry.gpu], _model(entry.model)
    eff = _Eff(eff.prefill_mfu, eff.decode_hbm_efficiency, eff.hbm_reserved_fraction, 2.0)
    n = entry.prefill_tokens
    prefill_s = roofline.prefill_seconds(gpu, eff, model, n, 0, tp=entry.tp) - roofline.attention_flops(
        model, n, 0) / (entry.tp * gpu.peak_dense_tflops * 1e12 * eff.prefill_mfu)
    decode_s = roofline.decode_step_seconds(gpu, eff, model, entry.decode_tokens, 0, tp=entry.tp)
    return n / prefill_s, entry.decode_tokens / decode_s


@dataclass(frozen=True)
class _Eff:
    prefill_mfu: float
    decode_hbm_efficiency: float
    hbm_reserved_fraction: float
    weight_bytes_per_param: float


def _lengths(entry: EndToEndEntry) -> list[tuple[int, int]]:
    """The simulated requests: every one at the mean lengths, or (spread > 0) input and output lengths
    evenly spaced over mean x [1 - spread, 1 + spread], paired in two different fixed orders."""
    n = entry.requests
    if entry.spread <= 0 or n == 1:
        return [(round(entry.input_tokens), round(entry.output_tokens))] * n
    span = [1 - entry.spread + 2 * entry.spread * k / (n - 1) for k in range(n)]
    steps = (s for s in range(n // 3 + 1, n) if _coprime(s, n))
    a, b = next(steps), next(steps)  # two fixed scrambles of the quantiles
    return [(round(entry.input_tokens * span[k * a % n]), round(entry.output_tokens * span[k * b % n]))
            for k in range(n)]


def _coprime(a: int, b: int) -> bool:
    while b:
        a, b = b, a % b
    return a == 1


def _at_precision(entry: DecodeStepEntry | EndToEndEntry | PrefillTTFTEntry, eff: roofline.Efficiency,
                  params_b: float = 0.0, compute: float | None = None) -> tuple[GPUSpec, ModelConfig, _Eff]:
    """The entry's GPU, model and efficiencies at its precision (PRECISIONS); ``compute`` overrides the
    precision's compute efficiency (for the fit)."""
    p = PRECISIONS[entry.dtype]
    if compute is None:
        compute = eff.prefill_mfu if p.compute_efficiency is None else constants()[p.compute_efficiency].value
    gpu: GPUSpec = gpu_specs()[entry.gpu]
    gpu = dataclasses.replace(gpu, peak_dense_tflops=gpu.peak_dense_tflops * p.flops_multiplier)
    model = dataclasses.replace(_model(entry.model), dtype=p.kv_dtype)
    if params_b > 0:
        model = dataclasses.replace(model, total_params_b=params_b)
    return gpu, model, _Eff(compute, eff.decode_hbm_efficiency, eff.hbm_reserved_fraction,
                            p.weight_bytes_per_param)


def end_to_end_tokens_per_s(entry: EndToEndEntry, eff: roofline.Efficiency,
                            compute: float | None = None) -> tuple[float, int]:
    """The roofline's output tokens per second for the published system (replicas x one replica's closed
    loop, at the entry's precision, or at compute efficiency ``compute``), and the concurrency HBM allowed
    one replica."""
    gpu, model, e = _at_precision(entry, eff, entry.params_b, compute)
    skip = 2 * entry.concurrency if entry.steady_state else 0
    run = closed_loop(gpu, e, model, _lengths(entry), entry.concurrency, entry.prefill_chunk_tokens,
                      tp=entry.tp, skip=skip)
    return run.output_tokens_per_s * (entry.gpus // entry.tp), run.max_running


def end_to_end_median_ttft_s(entry: EndToEndEntry, eff: roofline.Efficiency) -> float:
    """The roofline's median TTFT over the published workload's requests (closed_loop: first token less
    admission, as a client holding `concurrency` requests in flight times it), at the entry's precision."""
    gpu, model, e = _at_precision(entry, eff, entry.params_b)
    run = closed_loop(gpu, e, model, _lengths(entry), entry.concurrency, entry.prefill_chunk_tokens, tp=entry.tp)
    ttfts = sorted(run.ttfts_s)
    mid = len(ttfts) // 2
    return ttfts[mid] if len(ttfts) % 2 else (ttfts[mid - 1] + ttfts[mid]) / 2


def prefill_ttft_seconds(entry: PrefillTTFTEntry, eff: roofline.Efficiency, input_tokens: int | None = None) -> float:
    """The roofline's TTFT of one request of ``input_tokens`` (default: the entry's) alone on one replica:
    ``closed_loop`` at concurrency 1, one output token, chunks of the entry's ``prefill_chunk_tokens``, at the
    entry's precision."""
    gpu, model, e = _at_precision(entry, eff)
    run = closed_loop(gpu, e, model, [(input_tokens or entry.input_tokens, 1)], 1, entry.prefill_chunk_tokens,
                      tp=entry.tp)
    return run.ttfts_s[0]


def _prefill_row(e: PrefillTTFTEntry, eff: roofline.Efficiency) -> dict[str, Any]:
    modelled = prefill_ttft_seconds(e, eff) * 1e3
    err = modelled / e.published_ms - 1
    lo, hi = (modelled / (e.published_ms + e.reading_error_ms) - 1, modelled / (e.published_ms - e.reading_error_ms) - 1)
    return {
        "gpu": e.gpu, "model": e.model, "measured_model": e.model, "tp": e.tp, "source": e.source,
        "kind": e.kind, "source_kind": e.source_kind, "dtype": e.dtype, "input_tokens": e.input_tokens,
        "published_ttft_ms": e.published_ms, "reading_error_ms": e.reading_error_ms,
        "modelled_ttft_ms": round(modelled, 1), "error": round(err, 4),
        "error_over_reading": [round(lo, 4), round(hi, 4)],  # the error at the published value -/+ its reading error
        "held_within_20pct": e.held_within_band, "within_20pct": abs(err) <= BAND,
    }


@cache
def _prefill_rows(eff: _Eff) -> tuple[dict[str, Any], ...]:
    return tuple(_prefill_row(e, eff) for e in prefill_ttft_entries())


def prefill_ttft_errors(eff: roofline.Efficiency) -> list[dict[str, Any]]:
    """Per ``prefill_ttft`` entry: the published and modelled single-request TTFT and the roofline's relative
    error (``modelled / published - 1``), with the error's range over the figure's reading error (results
    document parameters.engine_calibration.prefill_ttfts). TTFTs, not throughputs: kept out of
    ``calibration_errors``."""
    key = _Eff(eff.prefill_mfu, eff.decode_hbm_efficiency, eff.hbm_reserved_fraction, eff.weight_bytes_per_param)
    return [dict(r) for r in _prefill_rows(key)]


def exact_compute_efficiency(entry: EndToEndEntry, eff: roofline.Efficiency) -> float:
    """The compute efficiency (achieved / the precision's dense peak) at which the closed loop reproduces
    the entry's published output tokens per second: a bisection on a log scale over (0.05, 1]."""
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if end_to_end_tokens_per_s(entry, eff, mid)[0] > entry.published_tokens_per_s:
            hi = mid
        else:
            lo = mid
    return math.sqrt(lo * hi)


def fit_fp8_compute_efficiency(eff: roofline.Efficiency) -> tuple[float, dict[str, float]]:
    """calibration.yaml's ``fp8_compute_efficiency`` recomputed: the geometric mean of the exact efficiencies
    of the entries it names as ``fitted_on`` (rounded to 3 decimals), and each named entry's exact one."""
    c = constants()["fp8_compute_efficiency"]
    by_id = {e.id: e for e in calibration_entries() if isinstance(e, EndToEndEntry) and e.id}
    exact = {i: exact_compute_efficiency(by_id[i], eff) for i in c.fitted_on + c.held_out}
    fit = math.exp(sum(math.log(exact[i]) for i in c.fitted_on) / len(c.fitted_on))
    return round(fit, 3), exact


def fp8_leave_one_out(eff: roofline.Efficiency) -> dict[str, float]:
    """calibration.yaml's ``leave_one_out`` recomputed: for each entry the FP8 constant is fitted on, its
    error (rounded to 4 decimals) at the geometric mean of the other fitted entries' exact efficiencies
    (rounded to 3 decimals, as the constant is): the fit's out-of-sample check."""
    c = constants()["fp8_compute_efficiency"]
    by_id = {e.id: e for e in calibration_entries() if isinstance(e, EndToEndEntry) and e.id}
    _, exact = fit_fp8_compute_efficiency(eff)
    out = {}
    for i in c.fitted_on:
        rest = [math.log(exact[j]) for j in c.fitted_on if j != i]
        at = round(math.exp(sum(rest) / len(rest)), 3)
        out[i] = round(end_to_end_tokens_per_s(by_id[i], eff, at)[0] / by_id[i].published_tokens_per_s - 1, 4)
    return out


def _layer_row(e: CalibrationEntry, eff: roofline.Efficiency) -> dict[str, Any]:
    prefill, decode = modelled_tokens_per_s(e, eff)
    return {
        "gpu": e.gpu, "model": e.model, "tp": e.tp, "source": e.source,
        "prefill_tokens": e.prefill_tokens,
        "prefill_published_tokens_per_s": e.prefill_tokens_per_s,
        "prefill_modelled_tokens_per_s": round(prefill, 1),
        "prefill_error": round(prefill / e.prefill_tokens_per_s - 1, 4),
        "decode_batch": e.decode_tokens,
        "decode_published_tokens_per_s": e.decode_tokens_per_s,
        "decode_modelled_tokens_per_s": round(decode, 1),
        "decode_error": round(decode / e.decode_tokens_per_s - 1, 4),
        "kind": e.kind, "source_kind": e.source_kind, "dtype": "fp16",  # vidur profiles in torch.float16
        "within_20pct": abs(prefill / e.prefill_tokens_per_s - 1) <= BAND and abs(decode / e.decode_tokens_per_s - 1) <= BAND,
    }


def _end_to_end_row(e: EndToEndEntry, eff: roofline.Efficiency) -> dict[str, Any]:
    modelled, running = end_to_end_tokens_per_s(e, eff)
    error = modelled / e.published_tokens_per_s - 1
    return {
        "gpu": e.gpu, "model": e.model, "tp": e.tp, "source": e.source,
        "measured_model": e.measured_model or e.model,
        "kind": e.kind, "source_kind": e.source_kind, "gpus": e.gpus, "dtype": e.dtype,
        "input_tokens": e.input_tokens, "output_tokens": e.output_tokens, "concurrency": e.concurrency,
        "modelled_concurrency": running,
        "compute_efficiency": _at_precision(e, eff)[2].prefill_mfu,
        "published_output_tokens_per_s": e.published_tokens_per_s,
        "modelled_output_tokens_per_s": round(modelled, 1),
        "error": round(error, 4),
        "held_within_20pct": e.held_within_band,
        "within_20pct": abs(error) <= BAND,
        "contradicted_by": e.contradicted_by or None,
    } | _ttft_fields(e, eff)


def _ttft_fields(e: EndToEndEntry, eff: roofline.Efficiency) -> dict[str, Any]:
    """A long-input run's published median TTFT against the modelled one (no keys when it publishes none)."""
    if e.published_median_ttft_ms <= 0:
        return {}
    modelled = end_to_end_median_ttft_s(e, eff) * 1e3
    err = modelled / e.published_median_ttft_ms - 1
    return {"published_median_ttft_ms": e.published_median_ttft_ms, "modelled_median_ttft_ms": round(modelled, 1),
            "ttft_error": round(err, 4), "ttft_within_20pct": abs(err) <= BAND}


def _decode_row(e: DecodeStepEntry, eff: roofline.Efficiency) -> dict[str, Any]:
    gpu, model, at = _at_precision(e, eff)
    modelled = 1.0 / roofline.decode_step_seconds(gpu, at, model, 1, e.context_tokens, tp=e.tp)
    published = 1000.0 / e.published_ms
    error = modelled / published - 1
    return {
        "gpu": e.gpu, "model": e.model, "measured_model": e.model, "tp": e.tp, "source": e.source,
        "kind": e.kind, "source_kind": e.source_kind, "dtype": e.dtype, "decode_batch": 1,
        "context_tokens": e.context_tokens, "published_step_ms": round(e.published_ms, 4),
        "published_tokens_per_s": round(published, 1), "modelled_tokens_per_s": round(modelled, 1),
        "error": round(error, 4), "held_within_20pct": e.held_within_band, "within_20pct": abs(error) <= BAND,
    }


@cache
def _rows(eff: _Eff) -> tuple[dict[str, Any], ...]:
    rows = []
    for e in calibration_entries():
        if isinstance(e, EndToEndEntry):
            rows.append(_end_to_end_row(e, eff))
        elif isinstance(e, DecodeStepEntry):
            rows.append(_decode_row(e, eff))
        else:
            rows.append(_layer_row(e, eff))
    return tuple(rows)


def calibration_errors(eff: roofline.Efficiency) -> list[dict[str, Any]]:
    """Per entry: the published and modelled throughputs and the roofline's relative error (results
    document parameters.engine_calibration). Layer entries carry ``prefill_error`` and ``decode_error``,
    decode-step and end-to-end entries ``error``; every row has ``kind`` and ``source_kind``."""
    key = _Eff(eff.prefill_mfu, eff.decode_hbm_efficiency, eff.hbm_reserved_fraction, eff.weight_bytes_per_param)
    return [dict(r) for r in _rows(key)]


# fp16 and bf16 share the tensor cores' dense rate and 2 bytes per element: one precision class to the roofline
_CLASS = {"fp16": "16-bit", "bf16": "16-bit", "fp8": "fp8"}


def leave_one_out(eff: roofline.Efficiency) -> list[dict[str, Any]]:
    """Every entry's out-of-sample error: its error with it left out of the fit of the constant its kind
    calibrates. prefill_mfu (vidur's prefill profiles) and decode_hbm_efficiency (their decode steps) scale
    the modelled rate of those entries in proportion (compute- and memory-bound work), so the efficiency that
    reproduces entry i exactly is c / (1 + error_i), and its error with it left out is (1 + error_i) x
    c_(-i) / c - 1, c_(-i) the geometric mean of the other entries' exact efficiencies: the error the entry would
    show had the constant been fitted on the other three (0.65 and 0.70 are the table's chosen constants, not
    this fit: on all four it gives 0.70 and 0.69). The FP8 runs: calibration.yaml's fp8 leave-one-out. Every
    other entry (vLLM's runs and decode steps, FlexAI's run, the TTFTs: the median of vLLM's Table 4 run and
    the single-request ``prefill_ttft`` entries) is in no fit: its error is out of sample as it is."""
    rows = calibration_errors(eff)
    layers = [r for r in rows if r["kind"] == "layer_profile"]
    fp8 = {k: v for k, v in constants()["fp8_compute_efficiency"].leave_one_out}
    fp8_ids = {e.id: e for e in calibration_entries() if isinstance(e, EndToEndEntry) and e.id}
    out = []

    def loo(errors: list[float]) -> list[float]:
        exact = [math.log(1.0 / (1.0 + x)) for x in errors]  # log(c_i / c)
        res = []
        for i, x in enumerate(errors):
            rest = [v for j, v in enumerate(exact) if j != i]
            res.append(round((1.0 + x) * math.exp(sum(rest) / len(rest)) - 1.0, 4))
        return res

    pre, dec = loo([r["prefill_error"] for r in layers]), loo([r["decode_error"] for r in layers])
    for r, p, d in zip(layers, pre, dec, strict=True):
        out.append({"entry": f"vidur {r['gpu']} {r['model']} prefill", "in_sample": r["prefill_error"],
                    "out_of_sample": p, "fit": "prefill_mfu"})
        out.append({"entry": f"vidur {r['gpu']} {r['model']} decode", "in_sample": r["decode_error"],
                    "out_of_sample": d, "fit": "decode_hbm_efficiency"})
    for r in rows:
        if r["kind"] == "layer_profile":
            continue
        label = (f"{r['source_kind'].split(' ')[0]} {r['gpu']} {r.get('measured_model') or r['model']} {r['dtype']}"
                 + (f" decode step {r['context_tokens']:,} tokens" if r["kind"] == "decode_step" else ""))
        ident = next((i for i, e in fp8_ids.items() if e.source == r["source"] and e.gpu == r["gpu"]), None)
        if ident in fp8:
            out.append({"entry": label, "in_sample": r["error"], "out_of_sample": fp8[ident],
                        "fit": "fp8_compute_efficiency"})
        else:
            out.append({"entry": label, "in_sample": r["error"], "out_of_sample": r["error"], "fit": None})
        if "ttft_error" in r:
            out.append({"entry": f"{label} median TTFT at ~{r['input_tokens']:,.0f} input tokens",
                        "in_sample": r["ttft_error"], "out_of_sample": r["ttft_error"], "fit": None})
    for r in prefill_ttft_errors(eff):  # in no fit (prefill_mfu was chosen on vidur's profiles, no attention)
        out.append({"entry": f"{r['source_kind'].split(' ')[0]} {r['gpu']} {r['model']} {r['dtype']} single-request "
                             f"TTFT at {r['input_tokens']:,} input tokens",
                    "in_sample": r["error"], "out_of_sample": r["error"], "fit": None})
    return out


def _errors(row: dict[str, Any]) -> list[float]:
    return [row["prefill_error"], row["decode_error"]] if row["kind"] == "layer_profile" else [row["error"]]


def _check_text(row: dict[str, Any]) -> str:
    errs = " / ".join(f"{x:+.0%}" for x in _errors(row))
    what = {"layer_profile": "prefill / decode ",
            "decode_step": f"decode step at {row.get('context_tokens', 0):,} tokens "}.get(row["kind"], "")
    return f"{row['source_kind'].split(' ')[0]} {row.get('measured_model') or row['model']} {row['dtype']} {what}{errs}"


def _respecified(gpu: str, spec: GPUSpec | None) -> str:
    """What of the run's GPU spec differs from the built-in one the table's checks were costed with (the
    rates the roofline divides by; HBM size, e.g. ``--gpu-mem-gb``, changes no check), or ''."""
    base = gpu_specs().get(gpu)
    if spec is None or base is None:
        return ""
    return ", ".join(f"{f} {getattr(spec, f):g} (the checks' {getattr(base, f):g})"
                     for f in ("peak_dense_tflops", "hbm_bandwidth_gbs") if getattr(spec, f) != getattr(base, f))


def gpu_checks(rows: list[dict[str, Any]], gpu: str, weight_bytes_per_param: float,
               spec: GPUSpec | None = None) -> dict[str, Any]:
    """What the published table says of the roofline on one run's GPU at the run's precision: the entries on
    that GPU, and ``status`` (the sessions engine costs every run at the 16-bit dense rate: 2-byte weights are
    the table's 16-bit entries; other weight sizes match no entry, as the FP8 entries are costed at the FP8
    rate):

    - ``validated``: every check at this precision on this GPU is within 20 %;
    - ``mixed``: some within 20 %, some outside;
    - ``outside``: every check at this precision is outside 20 %;
    - ``other_precision``: no check at this precision, only at another;
    - ``unchecked``: no published entry on this GPU;
    - ``respecified``: ``spec`` (the run's GPU, e.g. a config file's ``gpus:`` overlay) has another dense
      rate or HBM bandwidth than the built-in GPU of that name the checks were costed with: none applies.

    ``unvalidated`` is true where no check on this GPU at the run's precision is within 20 % (``outside``,
    ``other_precision``, ``unchecked``): the run's absolute figures then rest on constants no published run of
    this GPU at this precision supports, and the run says so. ``statement`` is the sentence."""
    mine = [r for r in rows if r["gpu"] == gpu]
    w = float(weight_bytes_per_param)
    cls = "16-bit" if w == 2.0 else f"{w:g}-byte weights at the 16-bit rate"
    here = [r for r in mine if _CLASS.get(r["dtype"]) == cls]
    within = [r for r in here if r["within_20pct"]]
    others = [r for r in mine if r not in here]
    g = gpu.upper()
    if not mine:
        status, text = "unchecked", f"on {g} the roofline has no published check: this run's absolute figures are unvalidated"
    elif not here:
        status = "other_precision"
        text = (f"on {g} the roofline has no check at {cls}; at other precisions: "
                + ", ".join(_check_text(r) for r in others))
    else:
        status = "validated" if len(within) == len(here) else "mixed" if within else "outside"
        out = [r for r in here if r not in within]
        text = (f"on {g} at {cls} the roofline has {len(here)} published check{'s' * (len(here) > 1)}: "
                f"{len(within)} within 20 %" + (f" ({', '.join(_check_text(r) for r in within)})" if within else "")
                + (f"; {len(out)} outside ({', '.join(_check_text(r) for r in out)})" if out else ""))
    changed = _respecified(gpu, spec)
    if changed:
        status, within = "respecified", []
        text = (f"this run's {g} is not the table's: {changed}; the roofline's published checks of the "
                f"built-in {g} do not apply to it")
    unvalidated = not within
    if unvalidated and mine:
        text += (f"; no check on this GPU at {cls} is within 20 %: this run's absolute figures (sessions held, "
                 "throughput, TTFT) are unvalidated")
    return {"gpu": gpu, "precision": cls, "status": status, "unvalidated": unvalidated, "respecified": changed,
            "checks": [{"kind": r["kind"], "source_kind": r["source_kind"], "model": r.get("measured_model") or r["model"],
                        "dtype": r["dtype"], "errors": _errors(r),
                        "within_20pct": r["within_20pct"]} for r in mine],
            "statement": text}
