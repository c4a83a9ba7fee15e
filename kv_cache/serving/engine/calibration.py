"""The roofline against published throughputs: kv_cache/specs/calibration.yaml, and the model's error on
each entry.

An entry gives a (GPU, model, tensor parallelism) and the measured throughput of the layers' linear work
for one prefill batch and one decode step (see the YAML's header for what was measured and where). The
roofline's figure for the same work:

- prefill: ``tokens / (2 x active_params x tokens / (tp x peak_dense_tflops x 1e12 x prefill_mfu))``
  (``prefill_seconds`` without its attention term);
- decode: ``tokens / decode_step_seconds(batch = tokens, context = 0)`` (the weights read once, no KV).

The error is ``modelled / published - 1`` (+0.10: the roofline is 10 % faster than the measurement).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from kv_cache.serving.engine import roofline
from kv_cache.specs import gpu_specs
from kv_cache.specs.models import MODEL_CONFIGS, SESSION_MODELS

__all__ = ["CalibrationEntry", "calibration_entries", "calibration_errors"]


@dataclass(frozen=True)
class CalibrationEntry:
    """One published measurement: tokens per second of a prefill batch and of a decode step."""

    gpu: str
    model: str
    tp: int
    source: str
    prefill_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float


@cache
def calibration_entries() -> tuple[CalibrationEntry, ...]:
    """The entries of kv_cache/specs/calibration.yaml."""
    text = resources.files("kv_cache.specs").joinpath("calibration.yaml").read_text(encoding="utf-8")
    return tuple(
        CalibrationEntry(
            gpu=e["gpu"], model=e["model"], tp=int(e["tp"]), source=e["source"],
            prefill_tokens=int(e["prefill"]["tokens"]), prefill_tokens_per_s=float(e["prefill"]["tokens_per_s"]),
            decode_tokens=int(e["decode"]["tokens"]), decode_tokens_per_s=float(e["decode"]["tokens_per_s"]),
        )
        for e in yaml.safe_load(text)
    )


def modelled_tokens_per_s(entry: CalibrationEntry, eff: roofline.Efficiency) -> tuple[float, float]:
    """The roofline's (prefill, decode) tokens per second for the entry's work (see the module doc)."""
    gpu, model = gpu_specs()[entry.gpu], {**MODEL_CONFIGS, **SESSION_MODELS}[entry.model]
    n = entry.prefill_tokens
    prefill_s = roofline.prefill_seconds(gpu, eff, model, n, 0, tp=entry.tp) - roofline.attention_flops(
        model, n, 0) / (entry.tp * gpu.peak_dense_tflops * 1e12 * eff.prefill_mfu)
    decode_s = roofline.decode_step_seconds(gpu, eff, model, entry.decode_tokens, 0, tp=entry.tp)
    return n / prefill_s, entry.decode_tokens / decode_s


def calibration_errors(eff: roofline.Efficiency) -> list[dict[str, Any]]:
    """Per entry: the published and modelled throughputs and the roofline's relative error (results
    document parameters.engine_calibration)."""
    rows = []
    for e in calibration_entries():
        prefill, decode = modelled_tokens_per_s(e, eff)
        rows.append({
            "gpu": e.gpu, "model": e.model, "tp": e.tp, "source": e.source,
            "prefill_tokens": e.prefill_tokens,
            "prefill_published_tokens_per_s": e.prefill_tokens_per_s,
            "prefill_modelled_tokens_per_s": round(prefill, 1),
            "prefill_error": round(prefill / e.prefill_tokens_per_s - 1, 4),
            "decode_batch": e.decode_tokens,
            "decode_published_tokens_per_s": e.decode_tokens_per_s,
            "decode_modelled_tokens_per_s": round(decode, 1),
            "decode_error": round(decode / e.decode_tokens_per_s - 1, 4),
        })
    return rows
