"""Live progress: what a line says, when plain lines come, quiet levels, the driver's ticks, --help defaults."""

import io
import threading
from types import SimpleNamespace

from kv_cache.benchmarks.standard.scheduler import Driver, DriverOptions
from kv_cache.cli import build_parser
from kv_cache.core.observe import Tick
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render.progress import LiveProgress, PlainProgress, make_progress, progress_line
from kv_cache.render.sessions_live import rung_eta

GIB = 1 << 30
ROW = {"t_s": 12.0, "seconds": 1.0, "requests": 7, "storage_read_gibps": 1.5, "storage_write_gibps": 0.25,
       "storage_read_p95_ms": 3.25, "cpu_read_gibps": 4.0, "occupancy_storage_bytes": 2 * GIB,
       "active_users": 9}


def tick(elapsed: float, row=ROW) -> Tick:
    return Tick(elapsed_s=elapsed, duration_s=60.0, issued=40, completed=33, row=row)


def test_line_says_time_requests_bandwidth_p95_and_occupancy():
    line = progress_line(tick(12.0))
    assert line.startswith("[0:12 elapsed, 0:48 left] 33 requests done (7 in the last 1 s), 7 in progress")
    assert "storage R 1.50 W 0.25 GiB/s (p95 R 3.2 ms)" in line
    assert "cpu R 4.00 W 0.00 GiB/s" in line and "gpu" not in line
    assert "used GiB: storage 2.00" in line and line.endswith("users 9")


def test_plain_lines_come_every_interval_only():
    out = io.StringIO()
    p = PlainProgress(out, every_s=5.0)
    for t in range(1, 13):
        p.tick(tick(float(t)))
    lines = out.getvalue().splitlines()
    assert [ln.split(" elapsed")[0] for ln in lines] == ["[0:05", "[0:10"]


def test_quiet_levels_print_nothing_and_a_pipe_gets_plain_lines():
    assert make_progress("WARNING", 60, io.StringIO()) is None
    assert make_progress("ERROR", 60, io.StringIO()) is None
    p = make_progress("INFO", 30, io.StringIO())
    assert isinstance(p, PlainProgress) and p.every_s == 3.0


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_live_panel():
    p = make_progress("INFO", 60, FakeTty())
    assert isinstance(p, LiveProgress)
    p.tick(tick(30.0))
    p.done()


def test_driver_closes_a_bucket_each_second_and_tells_the_observers():
    seen = []
    observer = SimpleNamespace(tick=seen.append, done=lambda: seen.append("done"))
    metrics = RunMetrics()
    metrics.open_window(0)
    usage = {"cpu": {"used_bytes": 5}, "nvme": {"used_bytes": 7}}
    d = Driver([], cache=SimpleNamespace(usage=lambda: usage), metrics=metrics,
               options=DriverOptions(duration_s=10.0), stop=threading.Event(), observers=[observer])
    d.pool = SimpleNamespace(qsize=lambda: 3)
    d.loop.dispatch(1_000_000_000, "second", None)
    d.loop.dispatch(2_000_000_000, "second", None)
    assert [t.elapsed_s for t in seen] == [1.0, 2.0]
    assert seen[1].row["occupancy_storage_bytes"] == 7 and seen[1].row["queue_depth"] == 3
    assert [r["t_s"] for r in metrics.series.rows] == [1.0, 2.0]
    d._last_bucket(2_500_000_000)
    assert metrics.series.rows[-1]["seconds"] == 0.5 and seen[-1] == "done"


def test_rung_eta_nominal_first_then_measured():
    ls = SimpleNamespace(warmup_s=10.0, window_s=40.0)
    assert rung_eta(0, 9, 0.0, ls) == "ETA 7m30s (nominal)"
    assert rung_eta(3, 9, 120.0, ls) == "ETA 4m00s"


def test_help_shows_defaults_for_both_commands():
    assert "(default: 100)" in build_parser().format_help()
    assert "(default: 8.0)" in build_parser("sessions").format_help()
