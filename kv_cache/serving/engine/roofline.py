"""The roofline cost model of a modelled inference engine.

Pure functions, no state. Units: FLOPs, bytes, seconds. ``eff`` is the ``inference_model`` config section
(``kv_cache.settings.InferenceModelConfig``) or anything with the same four attributes:

- ``prefill_mfu``: share of the GPU's peak dense FLOP/s a prefill (compute-bound) pass achieves;
- ``decode_hbm_efficiency``: share of the HBM bandwidth a decode (memory-bound) step achieves;
- ``hbm_reserved_fraction``: share of HBM kept for activations, workspace, CUDA graphs (not weights, not KV);
- ``weight_bytes_per_param``: 2 for bf16/fp16 weights, 1 for fp8, ~0.53 for MXFP4.

The model (``kv_cache.specs.models.ModelConfig``) gives ``weights_params`` (resident), ``active_params`` (per
token, MoE < total), ``num_layers``, ``num_heads``, ``head_dim`` and ``bytes_per_token`` (KV per token).

Tensor parallelism ``tp`` shards weights, KV and FLOPs evenly over ``tp`` GPUs of one replica, so every
time below divides by ``tp`` (communication is not modelled) and capacities multiply by it.

GPU datasheet specs (``GPUSpec``) live with the model specs in ``kv_cache.specs.models``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kv_cache.specs.models import GIB, GPU_SPECS, GPUSpec

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.specs.models import ModelConfig

__all__ = [
    "GIB",
    "GPUSpec",
    "GPU_SPECS",
    "IterationCost",
    "attention_flops",
    "decode_flops",
    "decode_step_seconds",
    "hbm_kv_capacity_bytes",
    "hbm_kv_capacity_tokens",
    "iteration_cost",
    "iteration_seconds",
    "kv_bytes_per_token",
    "prefill_flops",
    "prefill_seconds",
    "weight_bytes",
]

class Efficiency(Protocol):
    prefill_mfu: float
    decode_hbm_efficiency: float
    hbm_reserved_fraction: float
    weight_bytes_per_param: float


def _check_tp(tp: int) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor parallelism must be an integer >= 1, got {tp!r}")
    return tp


def _check_tokens(value: float, what: str) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)) or not value >= 0:
        raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    return value


def kv_bytes_per_token(model: ModelConfig) -> int:
    """Bytes of KV cache per token of context (all layers, un-sharded): ``model.bytes_per_token``."""
    return model.bytes_per_token


def weight_bytes(model: ModelConfig, eff: Efficiency) -> float:
    """Bytes of weights resident in HBM (all tp shards together): ``weights_params x weight_bytes_per_param``.

    Llama 3.1 8B in bf16: 8.03e9 x 2 = 16.06e9 bytes.
    """
    return model.weights_params * eff.weight_bytes_per_param


def attention_flops(model: ModelConfig, new_tokens: float, cached_tokens: float) -> float:
    """FLOPs of the attention score/value products when ``new_tokens`` tokens are processed after
    ``cached_tokens`` already-cached ones (causal).

    Per layer and query head, a query token attending to ``c`` keys costs ``2 x head_dim x c`` for QK^T and
    the same for AV: ``4 x head_dim x c``. New token ``j`` (1-based) attends to ``cached + j`` keys, so the
    ``n`` new tokens attend to ``n x (cached + (n + 1) / 2)`` keys in total::

        4 x num_layers x num_heads x head_dim x new_tokens x (cached_tokens + (new_tokens + 1) / 2)

    (MLA is costed with the model's ``head_dim`` like MHA/GQA: an approximation.)
    """
    _check_tokens(new_tokens, "new_tokens")
    _check_tokens(cached_tokens, "cached_tokens")
    per_key = 4.0 * model.num_layers * model.num_heads * model.head_dim
    return per_key * new_tokens * (cached_tokens + (new_tokens + 1) / 2)


def prefill_flops(model: ModelConfig, new_tokens: float, cached_tokens: float = 0) -> float:
    """FLOPs to prefill ``new_tokens`` after ``cached_tokens`` of reused (prefix-cached) context::

        2 x active_params x new_tokens + attention_flops(model, new_tokens, cached_tokens)

    (2 FLOPs per active parameter per token for the matrix multiplies; the cached tokens cost only the
    attention of the new tokens to them.)
    """
    _check_tokens(new_tokens, "new_tokens")
    if new_tokens == 0:
        return 0.0
    return 2.0 * model.active_params * new_tokens + attention_flops(model, new_tokens, cached_tokens)


def decode_flops(model: ModelConfig, batch_size: int, total_context_tokens: float) -> float:
    """FLOPs of one decode step generating one token for each of ``batch_size`` requests whose contexts
    sum to ``total_context_tokens``::

        2 x active_params x batch_size + 4 x num_layers x num_heads x head_dim x total_context_tokens

    (the second term is ``attention_flops`` with one new token per request; small next to the first for
    short contexts, and irrelevant to a memory-bound step, but kept so the roofline is right at long ones.)
    """
    _check_tokens(batch_size, "batch_size")
    _check_tokens(total_context_tokens, "total_context_tokens")
    if batch_size == 0:
        return 0.0
    attention = 4.0 * model.num_layers * model.num_heads * model.head_dim * total_context_tokens
    return 2.0 * model.active_params * batch_size + attention


def prefill_seconds(
    gpu: GPUSpec,
    eff: Efficiency,
    model: ModelConfig,
    new_tokens: float,
    cached_tokens: float = 0,
    tp: int = 1,
) -> float:
    """Compute-bound prefill time: ``prefill_flops / (tp x peak_dense_tflops x 1e12 x prefill_mfu)``."""
    tp = _check_tp(tp)
    return prefill_flops(model, new_tokens, cached_tokens) / (
        tp * gpu.peak_dense_tflops * 1e12 * eff.prefill_mfu
    )


def decode_step_seconds(
    gpu: GPUSpec,
    eff: Efficiency,
    model: ModelConfig,
    batch_size: int,
    total_context_tokens: float,
    tp: int = 1,
) -> float:
    """Memory-bound time of one decode step (one token for every request of the batch)::

        (weight_bytes + kv_bytes_per_token x total_context_tokens) / (tp x hbm_bandwidth_gbs x 1e9 x
                                                                      decode_hbm_efficiency)

    The weights are read once per step whatever the batch size, each request's KV once; a batch of 0 takes
    0 s. ``iteration_seconds`` is the roofline (compute vs memory) version of a whole iteration.
    """
    tp = _check_tp(tp)
    _check_tokens(batch_size, "batch_size")
    _check_tokens(total_context_tokens, "total_context_tokens")
    if batch_size == 0:
        return 0.0
    moved = weight_bytes(model, eff) + kv_bytes_per_token(model) * total_context_tokens
    return moved / (tp * gpu.hbm_bandwidth_gbs * 1e9 * eff.decode_hbm_efficiency)


def hbm_kv_capacity_bytes(gpu: GPUSpec, eff: Efficiency, model: ModelConfig, tp: int = 1) -> float:
    """HBM left for KV cache in one replica of ``tp`` GPUs::

        tp x hbm_gb x 2**30 x (1 - hbm_reserved_fraction) - weight_bytes

    Raises ValueError (naming GPU, model, tp and the numbers) when the weights do not fit.
    """
    tp = _check_tp(tp)
    usable = tp * gpu.hbm_bytes * (1.0 - eff.hbm_reserved_fraction)
    weights = weight_bytes(model, eff)
    capacity = usable - weights
    if capacity <= 0:
        raise ValueError(
            f"model {model.name!r} does not fit on {tp} x {gpu.name}: weights need {weights / 1e9:.1f} GB "
            f"({model.weights_params / 1e9:.2f}B params x {eff.weight_bytes_per_param:g} bytes) but only "
            f"{usable / 1e9:.1f} GB of HBM is usable ({tp} x {gpu.hbm_gb:g} GiB x "
            f"(1 - {eff.hbm_reserved_fraction:g} reserved)); use more tensor parallelism or a larger GPU"
        )
    return capacity


def hbm_kv_capacity_tokens(gpu: GPUSpec, eff: Efficiency, model: ModelConfig, tp: int = 1) -> int:
    """Tokens of KV that fit in HBM: ``floor(hbm_kv_capacity_bytes / kv_bytes_per_token)``."""
    return int(hbm_kv_capacity_bytes(gpu, eff, model, tp) // kv_bytes_per_token(model))


@dataclass(frozen=True)
class IterationCost:
    """The roofline of one continuous-batching iteration, per operator kind: the linear layers (matrix
    multiplies over every token of the iteration, reading the weights once) and the attention (each
    request's score / value products, reading its KV) run as separate kernels, one after the other, and each
    lasts the larger of its compute and its memory time. ``compute_s`` / ``memory_s`` are the whole
    iteration's (for ``compute_bound``)."""

    flops: float
    bytes_moved: float
    compute_s: float  # flops / (tp x peak x mfu)
    memory_s: float  # bytes_moved / (tp x bandwidth x efficiency)
    linear_s: float = 0.0  # max(linear FLOPs / rate, weight bytes / bandwidth)
    attention_s: float = 0.0  # max(attention FLOPs / rate, KV bytes / bandwidth)

    @property
    def seconds(self) -> float:
        return self.linear_s + self.attention_s

    @property
    def compute_bound(self) -> bool:
        return self.compute_s > self.memory_s


def iteration_cost(
    gpu: GPUSpec,
    eff: Efficiency,
    model: ModelConfig,
    prefill_tokens_with_cached: Iterable[tuple[float, float]],
    decode_batch_size: int,
    decode_context_tokens: float,
    tp: int = 1,
) -> IterationCost:
    """Cost of one engine iteration that prefills the chunks ``(new_tokens, cached_tokens)`` and advances
    ``decode_batch_size`` decoding requests (their contexts summing to ``decode_context_tokens``) by one
    token each.

    - FLOPs = ``sum(prefill_flops(new, cached)) + decode_flops(batch, decode_context_tokens)``: the linear
      part ``2 x active_params`` per token of the iteration, the rest attention;
      ``compute_s = FLOPs / (tp x peak_dense_tflops x 1e12 x prefill_mfu)``;
    - bytes = ``weight_bytes`` (read once per iteration, by the linear layers) ``+ kv_bytes_per_token x
      (decode_context_tokens + sum(cached + new))`` (by the attention: each decoding request's KV is read;
      each prefill chunk reads its cached KV and writes its new KV);
      ``memory_s = bytes / (tp x hbm_bandwidth_gbs x 1e9 x decode_hbm_efficiency)``;
    - seconds = ``max(linear FLOPs / rate, weight bytes / bandwidth) + max(attention FLOPs / rate, KV bytes
      / bandwidth)``: the two kinds of kernel run one after the other (as vidur composes an iteration from
      its operators' profiled times), so an iteration whose linear layers are compute-bound (a prefill
      chunk) and whose attention is memory-bound (many decodes over long contexts) pays both. Where both
      parts are bound the same way this is ``max(compute_s, memory_s)``.

    An empty iteration costs 0.
    """
    tp = _check_tp(tp)
    _check_tokens(decode_batch_size, "decode_batch_size")
    _check_tokens(decode_context_tokens, "decode_context_tokens")
    flops = 0.0
    tokens = 0.0  # tokens through the linear layers
    kv_tokens = 0.0
    for new, cached in prefill_tokens_with_cached:
        _check_tokens(new, "new_tokens")
        _check_tokens(cached, "cached_tokens")
        if new == 0:
            continue
        flops += prefill_flops(model, new, cached)
        tokens += new
        kv_tokens += new + cached
    if decode_batch_size > 0:
        flops += decode_flops(model, decode_batch_size, decode_context_tokens)
        tokens += decode_batch_size
        kv_tokens += decode_context_tokens
    if tokens == 0:
        return IterationCost(0.0, 0.0, 0.0, 0.0)
    rate = tp * gpu.peak_dense_tflops * 1e12 * eff.prefill_mfu
    bandwidth = tp * gpu.hbm_bandwidth_gbs * 1e9 * eff.decode_hbm_efficiency
    linear_flops = 2.0 * model.active_params * tokens
    weights, kv = weight_bytes(model, eff), kv_bytes_per_token(model) * kv_tokens
    return IterationCost(flops, weights + kv, flops / rate, (weights + kv) / bandwidth,
                         linear_s=max(linear_flops / rate, weights / bandwidth),
                         attention_s=max((flops - linear_flops) / rate, kv / bandwidth))


def iteration_seconds(*args: Any, **kwargs: Any) -> float:
    """Seconds of one continuous-batching iteration: ``iteration_cost(...).seconds`` (the same arguments),
    its linear layers' roofline time plus its attention's."""
    return iteration_cost(*args, **kwargs).seconds
