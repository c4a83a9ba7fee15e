"""A fixed count: a plain run, one rung of the sessions ladder."""

from __future__ import annotations

from kv_cache.core.autoscale import ConstantShape
from kv_cache.core.shapes import Shape, ShapeRequest, register


def _build(r: ShapeRequest) -> ConstantShape:
    return ConstantShape(r.users) if r.interval_s is None else ConstantShape(r.users, interval_s=r.interval_s)


CONSTANT = register(Shape("constant", "the same users from start to end", _build))
