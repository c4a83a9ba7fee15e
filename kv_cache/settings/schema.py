"""The config file: schema (frozen dataclasses), strict YAML loading, defaults = the shipped config.yaml.

Every section of config.yaml is one frozen dataclass whose attribute names are the YAML key names and
whose defaults are the shipped values. `load_config(None)` returns those defaults; `load_config(path)`
merges a (possibly partial) YAML file over them key by key and rejects anything it does not know, with a
one-line `ConfigError` that names the file and the dotted key.

This module is the public face; the parts are fields.py (field checks), sections.py (the dataclasses)
and loader.py (YAML reading and merging).
"""

from kv_cache.settings.fields import FrozenMap
from kv_cache.settings.loader import config_from_mapping, load_config
from kv_cache.settings.sections import (
    RETRIEVAL_DISTRIBUTIONS,
    AutoscalerConfig,
    BenchConfig,
    ConversationConfig,
    DecodeConfig,
    DriverConfig,
    EvictionConfig,
    GenerationTiming,
    GPUBackendConfig,
    InferenceModelConfig,
    PerformanceCriteria,
    PrefixCacheConfig,
    QoSDistribution,
    QoSProfile,
    RAGConfig,
    SaturationDetectionConfig,
    SessionsConfig,
    ShareGPTConfig,
    StorageConfig,
    UserTemplate,
    ValidationLimits,
)
from kv_cache.specs.models import ModelConfig

__all__ = [
    "AutoscalerConfig",
    "BenchConfig",
    "ConversationConfig",
    "DecodeConfig",
    "DriverConfig",
    "EvictionConfig",
    "FrozenMap",
    "GPUBackendConfig",
    "GenerationTiming",
    "InferenceModelConfig",
    "ModelConfig",
    "PerformanceCriteria",
    "PrefixCacheConfig",
    "QoSDistribution",
    "QoSProfile",
    "RAGConfig",
    "RETRIEVAL_DISTRIBUTIONS",
    "SaturationDetectionConfig",
    "SessionsConfig",
    "ShareGPTConfig",
    "StorageConfig",
    "UserTemplate",
    "ValidationLimits",
    "config_from_mapping",
    "load_config",
]
