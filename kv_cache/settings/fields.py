"""Building blocks of the config schema: a hashable read-only mapping, and field checks kept in the
dataclass field metadata (so each key's type, range and default are written once, on the field)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

__all__ = [
    "COPY", "OFFSET", "SPLIT", "Flag", "FrozenMap", "field_default", "flag_defaults", "flag_of", "flags_of", "setting",
    "split_rule",
]

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


class _NotSet:
    """The type of NOT_SET: a flag default that is its setting's."""

    def __repr__(self) -> str:
        return "NOT_SET"


NOT_SET: Any = _NotSet()


@dataclass(frozen=True)
class Flag:
    """The command-line flag of a setting: name, help, and the argparse arguments (`type`, `choices`,
    `action`, `metavar`); the parser is generated from these (cli/flags.py), so a flag is written once,
    on its setting's field.

    `group`: the --help section it is listed under (None: the main list). `default`: the flag's own
    default where it is not the setting's (`NOT_SET` = the setting's); e.g. None for "as the config file
    says". `invert`: a `--disable-X` switch, whose value is `not` the setting's. `registry`: the registry whose
    entries are the flag's choices and are listed in its help (`load_shapes`, `trace_formats`, `gpu_specs`);
    the CLI fills them in, since settings sit below every registry in the layers."""

    name: str
    help: str | None = None
    type: Any = None
    choices: tuple[str, ...] | None = None
    action: str | None = None
    metavar: str | None = None
    group: str | None = None
    default: Any = NOT_SET
    invert: bool = False
    registry: str | None = None

    @property
    def dest(self) -> str:
        """The argparse attribute of the flag (`--num-users` -> `num_users`)."""
        return self.name.lstrip("-").replace("-", "_")

    def default_for(self, setting_default: Any) -> Any:
        """The flag's default, given its setting's."""
        if self.default is not NOT_SET:
            return self.default
        return (not setting_default) if self.invert else setting_default

    def argparse_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `add_argument`, default excluded."""
        kw = {"type": self.type, "choices": self.choices, "action": self.action, "metavar": self.metavar,
              "help": self.help}
        return {k: v for k, v in kw.items() if v is not None}


def setting(default: Any = MISSING, *, split: str = COPY, default_factory: Any = MISSING,
            flag: Flag | None = None) -> Any:
    """A run setting's dataclass field: its default (written only here), its rule across ranks (`SPLIT`,
    `OFFSET`, `COPY`; read back with `split_rule`) and its command-line flag, if it has one (`flag_of`)."""
    if split not in SPLIT_RULES:
        raise ValueError(f"unknown split rule {split!r}")
    metadata = {"split": split, "flag": flag}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def flag_of(f: Any) -> Flag | None:
    """The command-line flag of a dataclass field made with `setting` (None: no flag)."""
    return f.metadata.get("flag")


def field_default(f: Any) -> Any:
    """A dataclass field's default value (its factory's product for a default_factory field)."""
    return f.default_factory() if f.default is MISSING else f.default


def flags_of(classes: Iterable[type]) -> Iterator[tuple[Flag, Any]]:
    """(flag, its setting's default) of every flagged field of the dataclasses `classes`, in declaration
    order: the one walk that both the parser (cli/flags.py) and the partial-namespace defaults use."""
    for cls in classes:
        for f in fields(cls):
            flag = flag_of(f)
            if flag is not None:
                yield flag, field_default(f)


def flag_defaults(classes: Iterable[type]) -> dict[str, Any]:
    """Every flag's default by its argparse dest (`--disable-X`: `not` the setting's), from the fields."""
    return {flag.dest: flag.default_for(default) for flag, default in flags_of(classes)}


def split_rule(f: Any) -> str:
    """The rule of a dataclass field made with `setting` (COPY for any other field)."""
    return f.metadata.get("split", COPY)
