"""The MLPerf tool's two autoscaler modes (autoscale.Autoscaler): qos holds storage saturation near the
target, capacity grows the users while throughput rises and stops at the peak."""

from __future__ import annotations

from kv_cache.core.autoscale import Autoscaler
from kv_cache.core.shapes import Shape, ShapeRequest, register

_OPTIONS = ("target_saturation", "autoscaler", "saturation_detection")


def _builder(mode: str):
    def build(r: ShapeRequest) -> Autoscaler:
        return Autoscaler(mode, r.target_saturation, r.scaler_cfg, r.saturation_cfg, r.users)

    return build


QOS = register(Shape("qos", "keep storage saturation near --target-saturation", _builder("qos"),
                     autoscaling=True, options=_OPTIONS))
CAPACITY = register(Shape("capacity", "add users while throughput rises; stop at the peak", _builder("capacity"),
                          autoscaling=True, options=_OPTIONS))
