"""kv-cache: a device-honest KV-cache offload storage benchmark (MLPerf Storage v3 compatible)."""

__version__ = "0.7.3"  # the top entry of CHANGELOG.md; pyproject.toml reads it (tests/test_docs.py)
