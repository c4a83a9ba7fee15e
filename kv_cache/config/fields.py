"""Building blocks of the config schema: a hashable read-only mapping, and field checks kept in the
dataclass field metadata (so each key's type, range and default are written once, on the field)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, TypeVar

__all__ = ["FrozenMap"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only mapping that, unlike `types.MappingProxyType`, can be hashed and pickled."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[K, V] | None = None) -> None:
        self._data: dict[K, V] = dict(data or {})

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self):
        return (FrozenMap, (self._data,))


# --------------------------------------------------------------------------------------------------
# Field checks (kept in the dataclass field metadata, so the schema has one source of truth)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Check:
    kind: str  # int | float | prob | range_int | range_float | choice | bool | str
    minimum: float | None = None
    exclusive_min: bool = False
    choices: tuple[str, ...] = ()


def _f(kind: str, default: Any = MISSING, **kw: Any) -> Any:
    return field(default=default, metadata={"check": _Check(kind, **kw)})


def _int(default: Any = MISSING, minimum: int = 0) -> Any:
    return _f("int", default, minimum=minimum)


def _num(default: Any = MISSING, minimum: float = 0.0, exclusive_min: bool = False) -> Any:
    return _f("float", default, minimum=minimum, exclusive_min=exclusive_min)


def _prob(default: Any = MISSING) -> Any:
    return _f("prob", default)


# --------------------------------------------------------------------------------------------------
# How a run setting divides across ranks (kept in the field metadata of the settings dataclasses)
# --------------------------------------------------------------------------------------------------

SPLIT = "split"  # a total: rank r gets total / N (integers: remainders to the first ranks), summing to it
OFFSET = "offset"  # a base: rank r gets base + r (seeds, so that no two ranks draw the same numbers)
COPY = "copy"  # every rank gets the value as given
SPLIT_RULES = (SPLIT, OFFSET, COPY)


def setting(default: Any = MISSING, *, split: str = COPY, default_factory: Any = MISSING) -> Any:
    """A run setting's dataclass field with its default and its rule across ranks (`SPLIT`, `OFFSET`,
    `COPY`); read back with `split_rule`."""
    if split not in SPLIT_RULES:
        raise ValueError(f"unknown split rule {split!r}")
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={"split": split})
    return field(default=default, metadata={"split": split})


def split_rule(f: Any) -> str:
    """The rule of a dataclass field made with `setting` (COPY for any other field)."""
    return f.metadata.get("split", COPY)
