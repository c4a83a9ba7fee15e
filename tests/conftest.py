import io
import threading
from pathlib import Path

import numpy as np
import pytest

from kv_cache.cli import parse_settings
from kv_cache.storage import BLOCK, WorkerBuffers, key_id

# Small real traces committed with the tests (first 300 rows of the Mooncake traces, two WEKA agentic
# sessions), so no test depends on data outside the repository.
TRACE_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"


def pytest_configure(config):
    """The suite runs with the stop signals at their defaults, however it was started: a CI launcher that
    starts it with SIGHUP or SIGINT ignored (nohup, a background job of a non-interactive shell) would hand
    SIG_IGN to every run the tests start, and a run keeps a SIGHUP ignored on purpose (nohup's meaning), so
    the signal tests would test the launcher instead. The tests of that nohup rule set SIG_IGN themselves."""
    import signal

    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _no_stop_signal_from_an_earlier_test():
    """ABANDON_IO is process-wide: a test that calls a run's signal handler directly (test_leftovers) must not
    make a remote store in the next test on the same xdist worker abandon its requests. The runs themselves
    clear it when they return (tests/test_signal_scope.py checks that without this fixture's help)."""
    from kv_cache.host.signals import ABANDON_IO

    ABANDON_IO.clear()
    yield


@pytest.fixture
def quick_settings(tmp_path):
    """Settings for a tiny, fast, real run on tmp_path (ext4 here, so O_DIRECT is exercised)."""

    config = tmp_path / "micro.yaml"
    # 1 layer x 1 KV head x 128 dims x K,V x fp16 = 512 bytes/token: a 25k-token entry is 12.5 MiB.
    config.write_text(
        "model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
        "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n"
    )

    def make(*extra: str, output: str | None = None, model: str = "micro"):
        argv = [
            "--config", str(config), "--model", model, "--num-users", "4", "--duration", "2", "--gpu-mem-gb", "0",
            "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "42",
            "--cache-dir", str(tmp_path / "cache"), "--output", output or str(tmp_path / "r.json"),
            "--io-chunk-mb", "1",
        ]
        return parse_settings(argv + list(extra))

    return make


@pytest.fixture
def sink():
    return io.StringIO()


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    return TRACE_FIXTURES


# ----------------------------------------------------------------------------------------- storage tests
@pytest.fixture
def bufs(request):
    """One worker's buffers, sized by the requesting test module's CHUNK (the storage tests' chunk grid)."""
    b = WorkerBuffers(request.module.CHUNK, 5, 0)
    yield b
    b.close()


def _expected_bytes(bufs: WorkerBuffers, key: str, nbytes: int, lead: int = 0) -> np.ndarray:
    """The payload a store must hold for ``key`` written through ``bufs``.

    Chunks follow the store's grid: ``lead`` is what shares the first chunk with the payload (a
    FileStore's 4 KiB header, nothing in RAM), so the first chunk carries ``chunk - lead`` bytes.
    """
    out = []
    kid = key_id(key)
    total = -(-nbytes // BLOCK) * BLOCK
    off = 0
    n = min(bufs.chunk_bytes - lead, total)
    while off < total:
        bufs.stamp(kid, off // BLOCK, n // BLOCK)
        out.append(bufs.write_buf[:n].copy())
        off += n
        n = min(bufs.chunk_bytes, total - off)
    return np.concatenate(out)[:nbytes] if out else np.zeros(0, np.uint8)


def _read_all(store, key: str, bufs: WorkerBuffers, verify: bool = True):
    """The entry's bytes as the store hands them out chunk by chunk, and the read's IOResult."""
    chunks = []
    res = store.read(
        key, bufs, verify=verify, on_chunk=lambda c, v: chunks.append(np.frombuffer(v, np.uint8).copy())
    )
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)), res


class _SetAfterFirstCheck(threading.Event):
    """A stop event that lets the first chunk through and stops everything after it."""

    calls = 0

    def is_set(self):
        self.calls += 1
        return self.calls > 1


@pytest.fixture
def expected_bytes():
    return _expected_bytes


@pytest.fixture
def read_all():
    return _read_all


@pytest.fixture
def stop_after_first():
    return _SetAfterFirstCheck()


@pytest.fixture
def run_workers(request):
    """``run(work, n, seed)``: ``work(worker_id, bufs)`` on n threads at once, each with its own buffers
    (as the benchmark's workers have); returns the exceptions they raised."""
    chunk = request.module.CHUNK

    def run(work, nworkers: int, seed: int = 1) -> list[BaseException]:
        errors: list[BaseException] = []

        def one(wid: int) -> None:
            b = WorkerBuffers(chunk, seed, wid)
            try:
                work(wid, b)
            except Exception as e:  # reported to the test, which asserts there is none
                errors.append(e)
            finally:
                b.close()

        threads = [threading.Thread(target=one, args=(w,)) for w in range(nworkers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    return run
