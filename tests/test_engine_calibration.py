"""The roofline against published prefill and decode throughputs (kv_cache/specs/calibration.yaml)."""

from __future__ import annotations

import pytest

from kv_cache.serving.engine.calibration import calibration_entries, calibration_errors
from kv_cache.settings.sections import InferenceModelConfig

ENTRIES = calibration_entries()


def test_at_least_three_gpu_model_pairs_each_with_a_source():
    pairs = {(e.gpu, e.model) for e in ENTRIES}
    assert len(pairs) >= 3
    assert all(e.source.startswith("https://") for e in ENTRIES)


@pytest.mark.parametrize("row", calibration_errors(InferenceModelConfig()), ids=lambda r: f"{r['gpu']}-{r['model']}")
def test_roofline_within_20_percent_of_each_published_figure(row):
    assert abs(row["prefill_error"]) <= 0.20, row
    assert abs(row["decode_error"]) <= 0.20, row


def test_error_is_modelled_over_published_minus_one():
    row = calibration_errors(InferenceModelConfig())[0]
    assert row["prefill_error"] == pytest.approx(
        row["prefill_modelled_tokens_per_s"] / row["prefill_published_tokens_per_s"] - 1, abs=1e-3)


def test_the_old_typical_constants_miss_the_published_prefill():
    # prefill_mfu 0.5 (the uncalibrated value) is > 20 % slow on at least one entry: why it was recalibrated
    rows = calibration_errors(InferenceModelConfig(prefill_mfu=0.5, decode_hbm_efficiency=0.8))
    assert min(r["prefill_error"] for r in rows) < -0.20
