"""One registry mechanism for every closed set that grows by one file: storage backends, trace formats,
load shapes, output metrics. Each entry module calls `register` at import; the registry imports every module
of its package on the first lookup, so adding an entry changes no list anywhere else."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind (`what`, for messages) by name (`key` of an entry), in registration order.

    `package` and `path`: where the entry modules live (a package's `__name__` and `__path__`); `skip`:
    module names in that path that hold no entry (the registry's own module, private helpers); `by_name`:
    `all` and the names in `get`'s error are sorted by name, not in registration order; `missing`: `get`'s
    KeyError message, from `what`, `name` and `known` (the names known, comma-separated)."""

    def __init__(self, what: str, package: str, path: Iterable[str], key: Callable[[T], str],
                 skip: Callable[[str], bool] = lambda name: False, by_name: bool = False,
                 missing: str = "no {what} {name!r} (known: {known})") -> None:
        self.what, self._package, self._path, self._key, self._skip = what, package, list(path), key, skip
        self._by_name, self._missing = by_name, missing
        self.entries: dict[str, T] = {}
        self._loaded = False
        self._lock = threading.RLock()

    def register(self, entry: T) -> T:
        """Add an entry; a second, different entry of one name is refused (two modules claiming it)."""
        name = self._key(entry)
        known = self.entries.get(name)
        if known is not None and known is not entry:
            raise ValueError(f"{self.what} {name!r} registered twice")
        self.entries[name] = entry
        return entry

    def load(self) -> None:
        """Import every entry module once (in module-name order); re-entrant while they import."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            for module in sorted(pkgutil.iter_modules(self._path), key=lambda m: m.name):
                if not self._skip(module.name):
                    importlib.import_module(f"{self._package}.{module.name}")

    def _names(self) -> list[str]:
        return sorted(self.entries) if self._by_name else list(self.entries)

    def all(self) -> list[T]:
        """Every entry, in registration order (the entry modules' name order, then within a module), or by
        name where the registry is `by_name`."""
        self.load()
        return [self.entries[n] for n in self._names()]

    def get(self, name: str) -> T:
        """The entry called `name` (KeyError naming the known ones otherwise)."""
        self.load()
        try:
            return self.entries[name]
        except KeyError:
            known = ", ".join(self._names())
            raise KeyError(self._missing.format(what=self.what, name=name, known=known)) from None
