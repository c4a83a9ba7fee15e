"""Load shapes come from one registry: the --autoscaler-mode choices, the standard run's autoscaler and
a sessions rung's constant count are its entries."""

from types import SimpleNamespace

import pytest

from kv_cache.cli import build_parser, parse_settings
from kv_cache.core import shapes
from kv_cache.core.autoscale import Autoscaler, ConstantShape, IntervalSample

SCALER = SimpleNamespace(interval_seconds=5.0, min_users=1, max_users=100, scale_up_factor=1.2,
                         scale_down_factor=0.8, consecutive_samples_required=2)
SAT = SimpleNamespace(history_window_size=3, queue_depth_threshold=10, read_latency_p95_threshold_ms=100.0,
                      write_latency_p95_threshold_ms=100.0)


def _mode_action():
    (action,) = [a for a in build_parser()._actions if "--autoscaler-mode" in a.option_strings]
    return action


def test_the_built_in_entries():
    assert shapes.autoscaler_modes()[:2] == ("qos", "capacity")  # (a new shape adds to them)
    assert {s.name for s in shapes.all_shapes()} >= {"constant", "qos", "capacity"}
    assert not shapes.get("constant").autoscaling
    scaler = shapes.build("capacity", shapes.ShapeRequest(4, target_saturation=0.7, scaler_cfg=SCALER,
                                                          saturation_cfg=SAT))
    assert isinstance(scaler, Autoscaler) and scaler.mode == "capacity" and scaler.users == 4
    constant = shapes.build("constant", shapes.ShapeRequest(3, interval_s=0.5))
    assert isinstance(constant, ConstantShape) and constant.interval_s == 0.5 and constant.tick(None) == 3
    with pytest.raises(KeyError, match="no load shape 'nope'"):
        shapes.get("nope")


def test_the_cli_offers_the_autoscaling_entries():
    action = _mode_action()
    assert tuple(action.choices) == shapes.autoscaler_modes()
    assert all(s.summary in action.help for s in shapes.all_shapes() if s.autoscaling)


class _Step:
    """A toy shape: one more user at every tick, ending after three."""

    def __init__(self, users: int) -> None:
        self.users, self.interval_s, self.history = users, 1.0, []

    def tick(self, sample):
        self.history.append({"users": self.users})
        self.users += 1
        return self.users if len(self.history) < 3 else None

    def summary(self):
        return {"mode": "step-test", "samples": len(self.history)}


def test_a_registered_shape_is_offered_and_built(monkeypatch):
    shapes.all_shapes()
    entry = shapes.Shape("step-test", "one more user per tick", lambda r: _Step(r.users), autoscaling=True)
    monkeypatch.setitem(shapes._ENTRIES, entry.name, entry)
    assert "step-test" in _mode_action().choices
    settings = parse_settings(["--enable-autoscaling", "--autoscaler-mode", "step-test", "--num-users", "2"])
    shape = shapes.build(settings.driver.autoscaler_mode, shapes.ShapeRequest(settings.workload.num_users))
    sample = IntervalSample(0.0, 2, 0.0, 0.0, 0.0, 0.0, None, None, 0)
    assert [shape.tick(sample) for _ in range(3)] == [3, 4, None]


def test_a_sessions_rung_holds_its_count_through_the_constant_entry(tmp_path):
    from kv_cache.benchmarks.sessions.ladder import RungRun
    from kv_cache.cli import parse_sessions_settings
    from kv_cache.workload.session_supply import script_supply

    s = parse_sessions_settings(["--window", "2", "--subwindows", "4", "--output", str(tmp_path / "s.json")])
    rung = RungRun(s.ladder_settings, "none", 5, script_supply(None, s.sessions, 1))
    assert isinstance(rung.shape, ConstantShape) and rung.shape.users == 5 and rung.shape.interval_s == 0.5
