"""GPU specs come from one data file (kv_cache/specs/gpus.yaml); a config's `gpus:` overlays it and the
flags' help lists its keys."""

import pytest

from kv_cache import specs
from kv_cache.cli import build_parser
from kv_cache.settings.schema import load_config
from kv_cache.specs.models import GPU_SPECS


def _help(parser, flag):
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return action.help


def test_the_shipped_table_is_the_data_file():
    assert GPU_SPECS is specs.gpu_specs()
    assert list(GPU_SPECS)[:5] == ["a100", "h100", "h200", "b200", "l40s"]  # (a new GPU adds to them)
    h100 = GPU_SPECS["h100"]
    assert (h100.hbm_gb, h100.hbm_bandwidth_gbs, h100.peak_dense_tflops, h100.host_link_gbs) == (80, 3350, 989, 64)


def test_a_config_overlays_a_field_and_adds_a_gpu(tmp_path):
    cfg = tmp_path / "g.yaml"
    cfg.write_text("gpus:\n  h100:\n    hbm_gb: 94\n  toy:\n    name: Toy GPU\n    hbm_gb: 8\n"
                   "    hbm_bandwidth_gbs: 100\n    peak_dense_tflops: 10\n")
    gpus = load_config(str(cfg)).gpus
    assert gpus["h100"].hbm_gb == 94 and gpus["h100"].hbm_bandwidth_gbs == 3350  # the rest from the file
    assert gpus["toy"].name == "Toy GPU" and gpus["a100"] == GPU_SPECS["a100"]


def test_the_help_lists_the_data_files_keys():
    keys = ", ".join(GPU_SPECS)
    assert keys in _help(build_parser(), "--gpu-type")
    assert keys in _help(build_parser("sessions"), "--gpu")


def test_a_new_entry_in_the_data_is_a_gpu():
    table = specs.load_gpu_specs("toy:\n  name: Toy\n  hbm_gb: 8\n  hbm_bandwidth_gbs: 100\n  peak_dense_tflops: 10\n")
    assert table["toy"] == specs.GPUSpec("Toy", 8.0, 100.0, 10.0)


@pytest.mark.parametrize(("text", "message"), [
    ("toy:\n  name: T\n  hbm_gbs: 8\n", "toy: unknown field"),
    ("toy:\n  name: T\n  hbm_gb: lots\n  hbm_bandwidth_gbs: 1\n  peak_dense_tflops: 1\n", "toy.hbm_gb: expected a number"),
    ("toy:\n  name: T\n", "toy: "),
    ("- a\n", "expected a mapping"),
])
def test_a_bad_entry_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        specs.load_gpu_specs(text)
