"""The run's configuration: the config.yaml schema with its defaults, strict loading, and resolved run settings."""

from kv_cache.settings.schema import BenchConfig, load_config

__all__ = ["BenchConfig", "load_config"]
