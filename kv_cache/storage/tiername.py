"""The one name of each cache tier.

The cache keys its tiers by the MLPerf tool's names (``gpu``, ``cpu``, ``nvme``: the usage table of the
results, the I/O trace log and the tests' expectations carry them), while the statistics and the metric
names call the last tier ``storage``. :class:`TierName` is the one type both sides use; ``legacy`` is the
name at the MLPerf edge, ``value`` the name everywhere else.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["TierName"]


class TierName(str, Enum):
    """A cache tier, fastest first (``str``: it compares and formats as its statistics name)."""

    GPU = "gpu"
    CPU = "cpu"
    STORAGE = "storage"

    def __str__(self) -> str:
        return self.value

    @property
    def legacy(self) -> str:
        """The MLPerf tool's name of the tier: the storage tier is ``nvme`` there."""
        return "nvme" if self is TierName.STORAGE else self.value

    @classmethod
    def of(cls, name: str) -> TierName:
        """The tier called `name` in either vocabulary (``nvme`` and ``storage`` are the same tier)."""
        if isinstance(name, TierName):
            return name
        try:
            return cls("storage" if name == "nvme" else name)
        except ValueError:
            raise ValueError(f"unknown tier {name!r} (tiers: gpu, cpu, storage or nvme)") from None
