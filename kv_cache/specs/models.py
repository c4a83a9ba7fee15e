"""Model specifications and the KV-cache size of one token (MLPerf-compatible table and byte formula)."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

from kv_cache.specs import GIB, GPUSpec, gpu_specs  # noqa: F401  (re-exported: the GPU table is data, kv_cache/specs/gpus.yaml)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
ATTENTION_TYPES = ("mha", "gqa", "mla")


@dataclass(frozen=True)
class ModelConfig:
    """The architectural numbers that decide how many bytes of KV cache one token needs."""

    name: str
    num_layers: int
    hidden_dim: int
    num_heads: int
    kv_heads: int
    dtype: str = "float16"
    kv_dim_per_head: int = 0  # head-dim override; 0 = hidden_dim // num_heads
    attention_type: str = "mha"  # mha | gqa | mla
    kv_lora_rank: int = 0  # MLA: compressed KV latent dimension
    qk_rope_head_dim: int = 0  # MLA: decoupled RoPE key dimension
    total_params_b: float = 0.0  # billions of parameters resident in GPU memory; 0 = derive (weights_params)
    active_params_b: float = 0.0  # billions used per token (MoE: < total); 0 = all of them (dense)

    @property
    def bytes_per_element(self) -> int:
        """float32 4, float16/bfloat16 2, int8 1 (anything else 2, as in the MLPerf tool)."""
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def head_dim(self) -> int:
        """Per-head K/V dimension: the override when > 0, else hidden_dim // num_heads."""
        if self.kv_dim_per_head > 0:
            return self.kv_dim_per_head
        return self.hidden_dim // self.num_heads if self.num_heads > 0 else 0

    @property
    def bytes_per_token(self) -> int:
        """Bytes of KV cache for one token of one full (un-sharded) entry.

        MHA/GQA: layers x kv_heads x head_dim x 2 (K and V) x bytes/element.
        MLA:     layers x (kv_lora_rank + qk_rope_head_dim) x bytes/element (one joint latent, no x2).
        """
        if self.attention_type == "mla":
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.bytes_per_element
        return self.num_layers * self.kv_heads * self.head_dim * 2 * self.bytes_per_element

    @property
    def kv_cache_size_per_token(self) -> int:
        """`bytes_per_token` under the MLPerf tool's name."""
        return self.bytes_per_token

    @property
    def derived_params(self) -> int:
        """Parameter count estimated from the architecture (used when ``total_params_b`` is 0).

        Per layer: attention ``2 x hidden_dim x head_dim x (num_heads + kv_heads)`` (Q and O projections
        ``hidden x num_heads x head_dim`` each, K and V ``hidden x kv_heads x head_dim`` each) plus a gated
        (SwiGLU) MLP of three ``hidden x ffn`` matrices with the usual ``ffn = 8/3 x hidden`` (= the classic
        4x two-matrix FFN), i.e. ``8 x hidden_dim**2``. Times ``num_layers``. Embeddings / LM head (the
        vocabulary is not in the model table), norms, biases and MoE experts beyond one dense MLP are
        ignored, and MLA is counted as if it were GQA, so this is an estimate (e.g. 5.64e9 for Llama 3.1 8B,
        whose card says 8.03e9): give ``total_params_b`` for any real model.
        """
        attention = 2 * self.hidden_dim * self.head_dim * (self.num_heads + self.kv_heads)
        mlp = 8 * self.hidden_dim * self.hidden_dim
        return self.num_layers * (attention + mlp)

    @property
    def weights_params(self) -> int:
        """Parameters whose weights are resident in GPU memory: ``total_params_b x 1e9``, or the estimate
        ``derived_params`` when ``total_params_b`` is 0."""
        if self.total_params_b > 0:
            return round(self.total_params_b * 1e9)
        return self.derived_params

    @property
    def active_params(self) -> int:
        """Parameters used per token (what the FLOPs scale with): ``active_params_b x 1e9`` when > 0 (MoE),
        else all of ``weights_params`` (a dense model)."""
        if self.active_params_b > 0:
            return round(self.active_params_b * 1e9)
        return self.weights_params

    @property
    def is_large_model(self) -> bool:
        """RAG documents use the large size range: hidden_dim >= 8192 or num_layers >= 64 (MLPerf rule)."""
        return self.hidden_dim >= 8192 or self.num_layers >= 64


# Field defaults a model defined only in config.yaml gets for the fields it omits (MLPerf-compatible).
NEW_MODEL_DEFAULTS = {
    "num_layers": 32,
    "hidden_dim": 4096,
    "num_heads": 32,
    "kv_heads": 8,
    "dtype": "float16",
    "kv_dim_per_head": 0,
    "attention_type": "mha",
    "kv_lora_rank": 0,
    "qk_rope_head_dim": 0,
    "total_params_b": 0.0,
    "active_params_b": 0.0,
}

# The nine built-in models. Display names are the shipped config.yaml ones (the defaults always equal
# config.yaml), so the banner names a model the same way with or without a config file.
# Parameter counts (billions) are the published model cards' totals (active = per token, for MoE).
MODEL_CONFIGS: Mapping[str, ModelConfig] = types.MappingProxyType(
    {
        # synthetic test model: no card, parameters derived from the architecture (derived_params)
        "tiny-1b": ModelConfig("Tiny 1B", 12, 1024, 8, 4),
        # huggingface.co/mistralai/Mistral-7B-v0.1: 7.24B (safetensors parameter count)
        "mistral-7b": ModelConfig("Mistral 7B", 32, 4096, 32, 8, total_params_b=7.24),
        # huggingface.co/meta-llama/Llama-2-7b-hf: 6.74B (safetensors parameter count)
        "llama2-7b": ModelConfig("Llama 2 7B", 32, 4096, 32, 32, total_params_b=6.74),
        # huggingface.co/meta-llama/Llama-3.1-8B: 8.03B
        "llama3.1-8b": ModelConfig("Llama 3.1 8B", 32, 4096, 32, 8, total_params_b=8.03),
        # huggingface.co/meta-llama/Llama-3.1-70B-Instruct: 70.6B
        "llama3.1-70b-instruct": ModelConfig("Llama 3.1 70B Instruct", 80, 8192, 64, 8, total_params_b=70.6),
        # DeepSeek-V3 technical report / model card: 671B total, 37B activated per token (MoE)
        "deepseek-v3": ModelConfig(
            "Deepseek v3",
            61,
            7168,
            128,
            128,
            attention_type="mla",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            total_params_b=671.0,
            active_params_b=37.0,
        ),
        # huggingface.co/Qwen/Qwen3-32B: 32.8B
        "qwen3-32b": ModelConfig("Qwen 3 32B", 64, 5120, 64, 8, kv_dim_per_head=128, total_params_b=32.8),
        # OpenAI gpt-oss model card: 117B total, 5.1B active per token (MoE)
        "gpt-oss-120b": ModelConfig(
            "GPT-OSS 120B (5.1B active)",
            36,
            2880,
            64,
            8,
            kv_dim_per_head=64,
            total_params_b=117.0,
            active_params_b=5.1,
        ),
        # OpenAI gpt-oss model card: 21B total, 3.6B active per token (MoE)
        "gpt-oss-20b": ModelConfig(
            "GPT-OSS 20B (3.6B active)",
            24,
            2880,
            64,
            8,
            kv_dim_per_head=64,
            total_params_b=21.0,
            active_params_b=3.6,
        ),
    }
)

# Models of the session-aware article's grid that the MLPerf tool's nine lack: `kv-cache sessions` accepts them
# (a config's model_configs entry of the same name wins); the standard run keeps the MLPerf tool's nine.
SESSION_MODELS: Mapping[str, ModelConfig] = types.MappingProxyType(
    {
        # huggingface.co/meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16384, 128 heads, 8 KV
        # heads (head_dim 128); model card: 405B parameters. 126 x 8 x 128 x 2 x 2 = 516,096 bytes/token
        "llama3.1-405b": ModelConfig("Llama 3.1 405B", 126, 16384, 128, 8, total_params_b=405.0),
    }
)



def __getattr__(name: str):
    """GPU_SPECS: the built-in GPUs, read from kv_cache/specs/gpus.yaml when first asked for (a config's
    `gpus:` section overlays them)."""
    if name == "GPU_SPECS":
        return gpu_specs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
