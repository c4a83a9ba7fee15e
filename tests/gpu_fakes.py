"""Fake CUDA devices for the GPU tier's tests (the interface of kv_cache/storage/gpu_device.py).

Each fake device has its own memory (numpy arrays), its own free/total memory figures, and streams that are
timelines: a copy launched on a stream advances that stream's clock by a made-up, deterministic cost (2 ns
per byte H2D, 3 ns per byte D2H), and an event records the clock of the stream it is recorded on, as a
CUDA event does. So an event pair measures exactly the copies launched on its stream between the two
records: with one stream per worker that is the worker's own copy; with a stream shared by workers
(``shared_streams=True``, the old design) it can include another worker's. ``barrier`` makes concurrent
launches interleave deterministically (every launcher records its start event, then waits for the others).
"""

from __future__ import annotations

import threading

import numpy as np

NS_PER_BYTE = {"h2d": 2, "d2h": 3}
GIB = 1 << 30


class FakeStream:
    def __init__(self) -> None:
        self.clock = 0
        self.lock = threading.Lock()


class FakeEvent:
    t = 0


class FakeLane:
    def __init__(self, streams: dict[str, FakeStream], device: int) -> None:
        self.streams = streams
        self.events = {d: (FakeEvent(), FakeEvent()) for d in ("h2d", "d2h")}
        self.device = device


class FakeDevice:
    backend = "fake"

    def __init__(self, index: int = 0, free: int = 80 * GIB, total: int = 80 * GIB, shared_streams: bool = False,
                 barrier: threading.Barrier | None = None) -> None:
        self.index = index
        self.name = f"fake{index}"
        self.free, self.total = free, total
        self.allocs: list[int] = []
        self.arrays: list[np.ndarray] = []  # what alloc handed out ("device memory")
        self.pinned_allocs = 0
        self.launches: list[tuple[str, list[tuple[int, int, int]]]] = []  # (direction, pieces) per launch
        self.waits = 0
        self.lanes = 0
        self.barrier = barrier
        self._shared = {d: FakeStream() for d in ("h2d", "d2h")} if shared_streams else None

    def alloc(self, nbytes: int) -> np.ndarray:
        self.allocs.append(nbytes)
        self.arrays.append(np.zeros(nbytes, np.uint8))
        return self.arrays[-1]

    def pinned(self, nbytes: int):
        self.pinned_allocs += 1
        a = np.zeros(nbytes, np.uint8)
        return a, a

    def lane(self) -> FakeLane:
        self.lanes += 1
        return FakeLane(self._shared or {d: FakeStream() for d in ("h2d", "d2h")}, self.index)

    def _launch(self, direction: str, lane: FakeLane, pieces, move) -> None:
        assert lane.device == self.index  # the lane of THIS device
        stream = lane.streams[direction]
        start, end = lane.events[direction]
        with stream.lock:
            start.t = stream.clock
        if self.barrier is not None:
            self.barrier.wait(timeout=10)
        for a, s, n in pieces:
            move(a, s, n)
            with stream.lock:
                stream.clock += NS_PER_BYTE[direction] * n
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # every launcher's copies are on the streams before any end
        with stream.lock:
            end.t = stream.clock
        self.launches.append((direction, list(pieces)))

    def h2d(self, arena, staging, pieces, lane) -> None:
        def move(a, s, n):
            arena[a:a + n] = staging[s:s + n]
        self._launch("h2d", lane, pieces, move)

    def d2h(self, staging, arena, pieces, lane) -> None:
        def move(a, s, n):
            staging[s:s + n] = arena[a:a + n]
        self._launch("d2h", lane, pieces, move)

    def wait(self, lane: FakeLane, direction: str) -> int:
        self.waits += 1
        start, end = lane.events[direction]
        return end.t - start.t

    def mem_info(self) -> tuple[int, int]:
        return self.free, self.total

    def plain_copy_gbs(self, nbytes: int) -> tuple[float, float]:
        return 1 / NS_PER_BYTE["h2d"], 1 / NS_PER_BYTE["d2h"]  # bytes per ns = GB/s of the fake's cost
