"""Model specifications and the KV-cache size of one token (reference `models.py`, spec section 4)."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

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

    @property
    def bytes_per_element(self) -> int:
        """float32 4, float16/bfloat16 2, int8 1 (anything else 2, as the reference)."""
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
        """Reference name of `bytes_per_token`."""
        return self.bytes_per_token

    @property
    def is_large_model(self) -> bool:
        """Reference RAG sizing rule: hidden_dim >= 8192 or num_layers >= 64."""
        return self.hidden_dim >= 8192 or self.num_layers >= 64


# Field defaults a model defined only in config.yaml gets for the fields it omits (spec 3.4).
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
}

# The nine built-in models. Display names are the shipped config.yaml ones (the defaults always equal
# config.yaml); the reference's code-only names differ for four models, in the banner only.
MODEL_CONFIGS: Mapping[str, ModelConfig] = types.MappingProxyType(
    {
        "tiny-1b": ModelConfig("Tiny 1B", 12, 1024, 8, 4),
        "mistral-7b": ModelConfig("Mistral 7B", 32, 4096, 32, 8),
        "llama2-7b": ModelConfig("Llama 2 7B", 32, 4096, 32, 32),
        "llama3.1-8b": ModelConfig("Llama 3.1 8B", 32, 4096, 32, 8),
        "llama3.1-70b-instruct": ModelConfig("Llama 3.1 70B Instruct", 80, 8192, 64, 8),
        "deepseek-v3": ModelConfig(
            "Deepseek v3", 61, 7168, 128, 128, attention_type="mla", kv_lora_rank=512, qk_rope_head_dim=64
        ),
        "qwen3-32b": ModelConfig("Qwen 3 32B", 64, 5120, 64, 8, kv_dim_per_head=128),
        "gpt-oss-120b": ModelConfig("GPT-OSS 120B (5.1B active)", 36, 2880, 64, 8, kv_dim_per_head=64),
        "gpt-oss-20b": ModelConfig("GPT-OSS 20B (3.6B active)", 24, 2880, 64, 8, kv_dim_per_head=64),
    }
)
