"""The benchmarks, each a plugin over the shared core with its own build, loop and results:
standard/ the MLPerf-compatible run, sessions/ the `kv-cache sessions` ladder. Neither imports the other
(an import-linter contract in pyproject.toml)."""
