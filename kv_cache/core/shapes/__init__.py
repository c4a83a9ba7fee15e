"""Load shapes, found by a registry: each module of this package registers one or more :class:`Shape`
entries (a name, what it does, whether it is offered as an ``--autoscaler-mode``, the config it reads and
how it is built). The CLI's ``--autoscaler-mode`` choices, the standard run's autoscaler and a sessions
rung's constant count are all looked up here, so adding a shape is adding one module (and its test).

A shape is what autoscale.LoadShape says: ``interval_s`` and ``tick(sample) -> users | None``; one
offered as an autoscaler mode also keeps ``history`` (one autoscale.history_entry per tick) and may
define ``summary()``. The results hold its summary completed to the shape-summary contract
(autoscale.SUMMARY_KEYS, autoscale.summarise: mode, initial and final users, samples, scale events), and
every reader relies on that contract alone, so a new shape needs no change to the console or the merge. Entries are loaded on the first lookup, by importing every module of this package once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kv_cache.core.autoscale import LoadShape
from kv_cache.registry import Registry

__all__ = ["Shape", "ShapeRequest", "all_shapes", "autoscaler_modes", "build", "get", "register"]


@dataclass(frozen=True)
class ShapeRequest:
    """What a shape is built with: the users (or session slots) it starts from, the seconds between its
    ticks (None: the shape's own, from its config), the run's saturation target and the config's
    `autoscaler` and `saturation_detection` sections (None where the caller has none)."""

    users: int
    interval_s: float | None = None
    target_saturation: float = 0.8
    scaler_cfg: Any = None
    saturation_cfg: Any = None


@dataclass(frozen=True)
class Shape:
    """One registry entry. `autoscaling`: offered as an --autoscaler-mode of the standard run (with its
    history and its summary, completed to the shape-summary contract, in the results); `options`: the
    settings and config keys it reads."""

    name: str
    summary: str
    build: Callable[[ShapeRequest], LoadShape]
    autoscaling: bool = False
    options: tuple[str, ...] = ()


_REGISTRY: Registry[Shape] = Registry("load shape", __name__, __path__, key=lambda e: e.name)
_ENTRIES = _REGISTRY.entries  # (tests register a toy entry into it)
register = _REGISTRY.register
all_shapes = _REGISTRY.all  # in registration order
get = _REGISTRY.get


def autoscaler_modes() -> tuple[str, ...]:
    """The shapes offered as --autoscaler-mode, in registration order."""
    return tuple(s.name for s in all_shapes() if s.autoscaling)


def build(name: str, request: ShapeRequest) -> LoadShape:
    return get(name).build(request)
