"""kv-cache: a device-honest KV-cache offload storage benchmark (MLPerf Storage v3 compatible)."""

__version__ = "0.1.0"
