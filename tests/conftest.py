import io

import pytest

from kv_cache.cli import parse_settings


@pytest.fixture
def quick_settings(tmp_path):
    """Settings for a tiny, fast, real run on tmp_path (ext4 here, so O_DIRECT is exercised)."""

    config = tmp_path / "micro.yaml"
    # 1 layer x 1 KV head x 128 dims x K,V x fp16 = 512 bytes/token: a 25k-token entry is 12.5 MiB.
    config.write_text(
        "model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
        "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n"
    )

    def make(*extra: str, output: str | None = None, model: str = "micro"):
        argv = [
            "--config", str(config), "--model", model, "--num-users", "4", "--duration", "2", "--gpu-mem-gb", "0",
            "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "42",
            "--cache-dir", str(tmp_path / "cache"), "--output", output or str(tmp_path / "r.json"),
            "--io-chunk-mb", "1",
        ]
        return parse_settings(argv + list(extra))

    return make


@pytest.fixture
def sink():
    return io.StringIO()
