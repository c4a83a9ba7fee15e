"""What a new load shape or storage backend may rely on, end to end (issue 17, registries): a toy shape
registered here (not in the package) runs as an --autoscaler-mode and its report prints, whatever its
summary() leaves out (the shape-summary contract, core/autoscale.py); a toy backend is named in the
results (measurement.tier_backends) and in the report's measurement section."""

import io

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.core import shapes
from kv_cache.core.autoscale import SUMMARY_KEYS, IntervalSample, LoadShape, history_entry, summarise
from kv_cache.render.console import autoscaling, measurement, print_report
from kv_cache.storage import backends
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tiername import TierName


class _ToyRamp:
    """A toy shape that is not a LoadShape subclass: one more user per tick; its summary() names only what
    it cares about (no mode, no users), as the reviewer's did."""

    def __init__(self, users: int) -> None:
        self.users, self.interval_s, self.history = users, 0.5, []

    def tick(self, sample: IntervalSample) -> int | None:
        self.history.append(history_entry(sample, sample.users + 1))
        return sample.users + 1

    def summary(self) -> dict:
        return {"ramp_step": 1}


class _Subclassed(LoadShape):
    """A shape that subclasses LoadShape and keeps the default summary()."""

    mode = "sub"

    def __init__(self) -> None:
        self.interval_s, self.history = 1.0, []

    def tick(self, sample: IntervalSample) -> int | None:
        self.history.append(history_entry(sample, None))
        return None


def _sample(t: float, users: int) -> IntervalSample:
    return IntervalSample(t, users, 10.0, 1.0, 0.1, 0.1, None, None, 0)


def test_summarise_completes_a_partial_summary_from_the_history():
    shape = _ToyRamp(2)
    for t, users in ((1.0, 2), (2.0, 3)):
        shape.tick(_sample(t, users))
    out = summarise(shape.summary(), shape.history, "toyramp", 2)
    assert out == {"ramp_step": 1, "mode": "toyramp", "initial_users": 2, "final_users": 4, "samples": 2,
                   "total_scale_events": 2}


def test_the_default_summary_of_a_load_shape_satisfies_the_contract():
    shape = _Subclassed()
    assert shape.tick(_sample(1.0, 3)) is None
    out = shape.summary()
    assert set(SUMMARY_KEYS) <= set(out) and out["mode"] == "sub" and out["final_users"] == 3
    assert shape.history[0]["action"] == "stop"


def test_the_console_prints_a_document_whose_summary_lacks_the_contract_keys():
    # a document as the reviewer's toy shape wrote it before the contract: no mode, entries of its own
    doc = {"run_parameters": {"autoscaler_mode": "toyramp", "num_users": 2},
           "summary": {"autoscaling_summary": {"ramp_step": 1}, "autoscaling_stats": [{"users": 2}, {"users": 3}]}}
    assert autoscaling(doc) == ["", "### AUTOSCALING (toyramp mode) ###",
                                "  Users: 2 -> 3 over 2 samples, 0 scale events",
                                "  t=Nones users     2 ->     2", "  t=Nones users     3 ->     3"]


@pytest.mark.slow  # a real run (wall clock)
def test_a_toy_shape_registered_in_the_test_runs_and_reports(quick_settings, monkeypatch, tmp_path):
    shapes.all_shapes()
    entry = shapes.Shape("toyramp", "one more user per tick", lambda r: _ToyRamp(r.users), autoscaling=True)
    monkeypatch.setitem(shapes._ENTRIES, entry.name, entry)
    out = io.StringIO()
    results, _ = execute(quick_settings("--enable-autoscaling", "--autoscaler-mode", "toyramp"), out)
    auto = results["summary"]["autoscaling_summary"]
    assert auto["mode"] == "toyramp" and auto["ramp_step"] == 1 and auto["samples"] >= 1
    assert auto["initial_users"] == 4 and auto["final_users"] == 4 + auto["samples"]
    assert "### AUTOSCALING (toyramp mode) ###" in out.getvalue()
    assert f"  Users: 4 -> {auto['final_users']} over {auto['samples']} samples" in out.getvalue()


class _ToyStore(MemoryStore):
    pass


@pytest.mark.slow  # a real run (wall clock)
def test_a_toy_backend_is_named_in_the_results_and_the_report(quick_settings, monkeypatch):
    backends.all_backends()
    entry = backends.Backend(name="toy-test", tier=TierName.CPU, summary="a toy RAM tier",
                             capabilities=backends.Capabilities(verify=True, host_ram=True),
                             open=lambda r: _ToyStore(r.capacity_bytes), selects=lambda t: t.cpu_mem_gb > 0,
                             priority=5)
    monkeypatch.setitem(backends._ENTRIES, entry.name, entry)
    out = io.StringIO()
    results, _ = execute(quick_settings("--cpu-mem-gb", "0.05"), out)
    assert results["measurement"]["tier_backends"] == {"cpu": "toy-test", "storage": "file"}
    assert "  Tier backends: cpu toy-test, storage file\n" in out.getvalue()


def test_documents_without_tier_backends_print_as_before():
    meas = {"io_mode": "direct", "run_dir": "/x", "filesystem": "ext4"}
    assert not any("Tier backends" in line for line in measurement({"measurement": meas}))
    with_backends = measurement({"measurement": {**meas, "tier_backends": {"cpu": "memory", "storage": "file"}}})
    assert with_backends[3] == "  Tier backends: cpu memory, storage file"
    report = io.StringIO()
    print_report({"measurement": {**meas, "tier_backends": {"storage": "file"}}}, report)
    assert "  Tier backends: storage file\n" in report.getvalue()
