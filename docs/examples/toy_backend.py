"""A toy storage tier: every entry a bytearray in a dict, in this process's RAM (docs/adding-a-backend.md).

Copied into kv_cache/storage/backends/ it is found by the registry; tests/test_toy_backend.py registers it
from here and runs a short benchmark on it."""

from __future__ import annotations

import threading
from time import perf_counter_ns

from kv_cache.settings.fields import Flag
from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.base import SizedStore
from kv_cache.storage.tiername import TierName


class ToyStore(SizedStore):
    """Entries in a dict; `pause_us` of sleep before each write (the toy's one knob)."""

    name = "toy"
    fs_type, io_mode, io_mode_reason, cache_dir, run_dir = "toy", "buffered", "a dict in RAM", "toy:", "toy:"

    def __init__(self, pause_us: int) -> None:
        self.pause_s = pause_us / 1e6
        self._data: dict[str, bytearray] = {}
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def free_bytes(self) -> None:  # no free space to read: the capacity is --storage-capacity-gb
        return None

    def _begin_write(self, key, nbytes):
        threading.Event().wait(self.pause_s)
        return (key, bytearray(nbytes)), 0

    def _put(self, h, offset, view, first):
        t0 = perf_counter_ns()
        h[1][offset:offset + len(view)] = view
        return len(view), perf_counter_ns() - t0

    def _commit(self, h):
        with self._lock:
            self._data[h[0]], self._sizes[h[0]] = h[1], len(h[1])
        return 0

    def _abort(self, h):
        return None

    def _begin_read(self, key):
        with self._lock:
            data = self._data[key]  # KeyError: not stored
        return data, len(data), 0

    def _get(self, h, offset, view):
        t0 = perf_counter_ns()
        view[:] = h[offset:offset + len(view)]
        return len(view), perf_counter_ns() - t0

    def _end_read(self, h):
        return 0

    def delete(self, key):
        with self._lock:
            self._data.pop(key, None)
            self._sizes.pop(key, None)

    def close(self):
        with self._lock:
            self._data.clear()
            self._sizes.clear()
            self._closed = True


def _open(request: BackendRequest) -> ToyStore:
    request.notes.append("storage tier: the toy backend's dict (docs/adding-a-backend.md)")
    return ToyStore(request.tiers.remote.toy_pause_us)


BACKEND = register(Backend(
    name="toy", tier=TierName.STORAGE, summary="a dict in RAM (the docs' example backend)",
    capabilities=Capabilities(verify=True), open=_open,
    selects=lambda tiers: tiers.remote.storage_backend == "toy", priority=20,
    choice="a dict in RAM, the docs' example", title="the toy backend's dict in RAM",
    options=(Option("toy_pause_us", "microseconds of sleep before each write", 0, Flag(
        "--toy-pause-us", type=int, group="toy storage tier (docs/adding-a-backend.md)",
        help="Microseconds the toy tier sleeps before each write."),
        lambda v: f"--toy-pause-us cannot be negative, got {v}" if v < 0 else None, owned=True),
        Option("storage_capacity_gb", "the tier's capacity (0: unbounded)")),
))
