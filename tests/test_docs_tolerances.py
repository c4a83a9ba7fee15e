"""The tolerances the docs quote for `kv-cache audit` (docs/integrity.md: bandwidth within 1 %, a device's rated
GB/s within 2 %), held at their edges on the shipped run document: just inside passes, just outside does not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from kv_cache.cli.audit import audit_path
from kv_cache.results import integrity as integ

RUN = json.loads((Path(__file__).parent / "fixtures" / "integrity" / "run.json").read_text())
KEY = "tier_storage_read_bandwidth_gbps"


def _check(tmp_path: Path, doc: dict, name: str, limit=None) -> str:
    p = tmp_path / "doc.json"
    p.write_text(json.dumps(doc))
    (_, block), = audit_path(str(p), limit=limit)
    return next(c["status"] for c in block["checks"] if c["check"] == name)


def _scaled(k: float) -> dict:
    doc = copy.deepcopy(RUN)
    doc["summary"]["cache_stats"][KEY] *= k
    return doc


def test_a_reported_bandwidth_within_1_percent_of_bytes_over_window_passes_and_beyond_does_not(tmp_path):
    assert integ.BANDWIDTH_TOLERANCE == 0.01
    assert _check(tmp_path, _scaled(1.009), "bandwidth") == integ.OK
    assert _check(tmp_path, _scaled(0.991), "bandwidth") == integ.OK
    assert _check(tmp_path, _scaled(1.02), "bandwidth") != integ.OK
    assert _check(tmp_path, _scaled(0.98), "bandwidth") != integ.OK


def test_a_storage_rate_within_2_percent_above_the_rated_limit_passes_and_beyond_is_invalid(tmp_path):
    assert integ.DEVICE_LIMIT_TOLERANCE == 0.02
    gbs = RUN["summary"]["cache_stats"][KEY] * 2**30 / 1e9  # decimal GB/s, as the limit is rated
    assert _check(tmp_path, RUN, "device_limit", limit=(gbs / 1.015, "a drive just slower")) == integ.OK
    assert _check(tmp_path, RUN, "device_limit", limit=(gbs / 1.03, "a drive slower")) == integ.INVALID


def _window_status(avg_in_flight: float) -> str:
    import dataclasses

    base = integ.facts_from_ours(RUN)
    f = dataclasses.replace(base, summed_storage_s=avg_in_flight * base.window_s, read_ops=0, write_ops=0)
    return integ.check_window(f)["status"]


def test_summed_device_time_over_the_window_may_pass_the_workers_by_5_percent_and_no_more():
    assert integ.IN_FLIGHT_TOLERANCE == 0.05
    workers = integ.facts_from_ours(RUN).workers
    assert workers and _window_status(workers * 1.04) != integ.INVALID
    assert _window_status(workers * 1.06) == integ.INVALID
