"""QoS classes: the levels and their draw (priorities and SLA targets come from the config, never hard-coded)."""

from __future__ import annotations

import random

QOS_LEVELS = ("interactive", "responsive", "batch")


def draw_qos_level(rng: random.Random, interactive_probability: float, responsive_threshold: float) -> str:
    """MLPerf-compatible draw: r < p_interactive -> interactive; r < threshold -> responsive; else batch."""
    r = rng.random()
    if r < interactive_probability:
        return "interactive"
    if r < responsive_threshold:
        return "responsive"
    return "batch"
