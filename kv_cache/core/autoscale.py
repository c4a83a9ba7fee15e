"""Load shapes: at every monitor tick, decide how many users (or session slots) should be active.

A load shape is the only thing that changes the offered load during a run (as locust's LoadTestShape):
the scheduler samples the interval, asks the shape, and applies the answer.
- `ConstantShape`: a fixed count (a plain run, one rung of the sessions ladder);
- `Autoscaler`, two modes (the MLPerf tool's mode names): `qos` keeps storage saturation near a target;
  `capacity` grows the user count while throughput still rises and stops at the peak. The decision is
  applied: the driver really starts or stops users. Factors and sample counts come from config.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Protocol


@dataclass(frozen=True)
class IntervalSample:
    t_s: float  # seconds since the window opened
    users: int
    tokens_per_sec: float
    requests_per_sec: float
    storage_read_gbps: float
    storage_write_gbps: float
    read_p95_ms: float | None
    write_p95_ms: float | None
    queued_requests: int


# The shape-summary contract: what every reader of a run's autoscaling results (the console, compare,
# merge, scripts) may rely on, whatever shape ran. `summary.autoscaling_summary` always holds these keys:
#   mode                the shape's registry name (its --autoscaler-mode)
#   initial_users       users at the first tick
#   final_users         users at the end
#   samples             ticks recorded (len of autoscaling_stats)
#   total_scale_events  ticks whose action was "scale_up" or "scale_down"
# and any keys of the shape's own (qos: target_saturation, max_users_within_target; capacity:
# peak_user_count, peak_throughput_tokens_per_sec, peak_found). Each entry of `summary.autoscaling_stats`
# (a shape's `history`) holds t_s, users, users_after and action; the IntervalSample fields and
# saturation_level are printed when an entry has them.
SUMMARY_KEYS = ("mode", "initial_users", "final_users", "samples", "total_scale_events")
SCALE_ACTIONS = ("scale_up", "scale_down")


def history_entry(sample: IntervalSample, users_after: int | None, action: str | None = None) -> dict:
    """One autoscaling_stats entry under the contract: the sample, what the shape decided (None: stop, the
    users stay) and the action's name (by default scale_up / scale_down / hold / stop)."""
    after = sample.users if users_after is None else users_after
    if action is None:
        action = ("stop" if users_after is None else "scale_up" if after > sample.users
                  else "scale_down" if after < sample.users else "hold")
    return {**asdict(sample), "action": action, "users_after": after}


def summarise(summary: dict | None, history: list[dict], mode: str, initial_users: int | None = None) -> dict:
    """`summary` (a shape's own, possibly partial, or None) completed to the contract above from the
    shape's `history`: a shape's own values win; what it leaves out is derived."""
    out = dict(summary or {})
    first = history[0] if history else {}
    last = history[-1] if history else {}
    out.setdefault("mode", mode)
    out.setdefault("initial_users", first.get("users", initial_users))
    out.setdefault("final_users", last.get("users_after", last.get("users", out["initial_users"])))
    out.setdefault("samples", len(history))
    out.setdefault("total_scale_events", sum(1 for h in history if h.get("action") in SCALE_ACTIONS))
    return out


class LoadShape(Protocol):
    """What the scheduler asks at every monitor tick. A shape offered as an --autoscaler-mode also keeps
    `history` (one history_entry per tick) and `summary()`: the default below (inherited by a shape that
    subclasses LoadShape; `summarise` applies it to one that does not) satisfies the shape-summary contract
    from the history alone; a shape adds its own keys by overriding it."""

    interval_s: float  # seconds between ticks

    def tick(self, sample: IntervalSample) -> int | None:
        """The number of users to run from now on; None = stop the run."""
        ...

    def summary(self) -> dict:
        """The results' autoscaling_summary: the contract's keys, derived from `history`."""
        history = getattr(self, "history", [])
        return summarise(None, history, getattr(self, "mode", type(self).__name__))


class ConstantShape:
    def __init__(self, users: int, interval_s: float = 10.0) -> None:
        self.users = users
        self.interval_s = interval_s

    def tick(self, sample: IntervalSample) -> int | None:
        return self.users


class Autoscaler:
    def __init__(self, mode: str, target_saturation: float, scaler_cfg, saturation_cfg, initial_users: int) -> None:
        if mode not in ("qos", "capacity"):
            raise ValueError(f"unknown autoscaler mode {mode!r}")
        self.mode = mode
        self.target = target_saturation
        self.cfg = scaler_cfg
        self.sat = saturation_cfg
        self.initial_users = initial_users
        self.users = initial_users
        self._levels: deque[float] = deque(maxlen=saturation_cfg.history_window_size)
        self._streak = 0
        self.peak_throughput = 0.0
        self.peak_users = initial_users
        self.history: list[dict] = []
        self.stopped = False

    @property
    def interval_s(self) -> float:
        return self.cfg.interval_seconds

    def tick(self, sample: IntervalSample) -> int | None:
        return self.decide(sample)

    def saturation(self, s: IntervalSample) -> float:
        """1.0 = at the configured thresholds; the worst of read P95, write P95 and queue backlog,
        averaged over the last `saturation_detection.history_window_size` samples."""
        parts = [s.queued_requests / max(1, self.sat.queue_depth_threshold)]
        if s.read_p95_ms is not None:
            parts.append(s.read_p95_ms / max(1e-9, self.sat.read_latency_p95_threshold_ms))
        if s.write_p95_ms is not None:
            parts.append(s.write_p95_ms / max(1e-9, self.sat.write_latency_p95_threshold_ms))
        self._levels.append(max(parts))
        return sum(self._levels) / len(self._levels)

    def _up(self) -> int:
        return min(self.cfg.max_users, max(self.users + 1, int(self.users * self.cfg.scale_up_factor)))

    def _down(self) -> int:
        return max(self.cfg.min_users, min(self.users - 1, int(self.users * self.cfg.scale_down_factor)))

    def decide(self, s: IntervalSample) -> int | None:
        """Returns the new user count, or None when capacity mode has found the peak (stop the run)."""
        level = self.saturation(s)
        action = "hold"
        new = self.users
        if self.mode == "qos":
            if level > 1.1 * self.target:
                self._streak += 1
                if self._streak >= self.cfg.consecutive_samples_required:
                    new, self._streak = self._down(), 0
            else:
                self._streak = 0
                if level < 0.9 * self.target:
                    new = self._up()
            action = "scale_up" if new > self.users else "scale_down" if new < self.users else "hold"
        elif s.tokens_per_sec == 0 and self.peak_throughput == 0:
            action = "hold"  # nothing has completed yet: no evidence about capacity either way
        else:
            if s.tokens_per_sec > 1.01 * self.peak_throughput or not self.history:
                if s.tokens_per_sec > self.peak_throughput:
                    self.peak_throughput, self.peak_users = s.tokens_per_sec, self.users
                self._streak = 0
                new = self._up()
                action = "scale_up" if new > self.users else "hold"
            else:
                self._streak += 1
                if self._streak >= self.cfg.consecutive_samples_required:
                    action = "stop"
                    self.stopped = True
        entry = {**asdict(s), "saturation_level": level, "action": action,
                 "users_after": new if action != "stop" else self.users}
        self.history.append(entry)
        self.users = new
        return None if action == "stop" else new

    def summary(self) -> dict:
        out = {
            "mode": self.mode,
            "initial_users": self.initial_users,
            "final_users": self.users,
            "total_scale_events": sum(1 for h in self.history if h["action"] in ("scale_up", "scale_down")),
            "samples": len(self.history),
        }
        if self.mode == "capacity":
            out["peak_user_count"] = self.peak_users
            out["peak_throughput_tokens_per_sec"] = self.peak_throughput
            out["peak_found"] = self.stopped
        else:
            out["target_saturation"] = self.target
            within = [h["users"] for h in self.history if h["saturation_level"] <= self.target]
            out["max_users_within_target"] = max(within) if within else None
        return out
