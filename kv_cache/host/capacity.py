"""How much of a filesystem's free space a storage tier takes when no capacity is given.

Not all of it: other runs (or ranks of this one) may share the filesystem, entries being written need room
beyond what is counted, and a tier that fills the disk to the last byte turns every write into ENOSPC."""

from __future__ import annotations

from kv_cache.settings.sections import AUTO_FRACTION  # of the free space, before the largest entry

__all__ = ["AUTO_FRACTION", "auto_capacity"]


def auto_capacity(free: int, largest_entry: int, runs: int = 1, ram_room: int | None = None) -> float:
    """The storage tier's capacity when none is given: 90 % of the free space, split between the `runs`
    (this one included) on that filesystem, less room for the largest entry (headers and writes in
    flight); >= 0.

    `ram_room`: for a filesystem in RAM (tmpfs), the bytes the run's memory budget has left after its RAM
    tiers; the capacity stays within it, as the tier's bytes are host memory like the CPU tier's."""
    share = AUTO_FRACTION * free / max(1, runs)
    if ram_room is not None:
        share = min(share, ram_room)
    return max(0.0, share - largest_entry)
