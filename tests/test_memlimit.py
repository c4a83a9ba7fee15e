"""The memory a run may use: MemAvailable and the cgroup limit (v1 and v2); the RAM tier is clamped to it
with a warning, or refused under --strict-memory."""

import subprocess
import sys
from pathlib import Path

import pytest

from kv_cache.errors import StorageSetupError
from kv_cache.host.memlimit import MemoryLimit, cgroup_headroom
from kv_cache.serving.tiers import RESERVE_BYTES, ram_tier_bytes

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v1_limit_minus_usage_tightest_level_wins(tmp_path):
    root = tmp_path / "cg"
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # the root: no limit
    _write(root / "memory" / "box" / "memory.limit_in_bytes", str(4 * GIB))
    _write(root / "memory" / "box" / "memory.usage_in_bytes", str(1 * GIB))
    _write(root / "memory" / "box" / "run" / "memory.limit_in_bytes", str(8 * GIB))
    proc = tmp_path / "cgroup"
    proc.write_text("9:name=systemd:/\n4:memory:/box/run\n0::/\n")
    room, source = cgroup_headroom(str(proc), root)
    assert room == 3 * GIB and source.endswith("box/memory.limit_in_bytes")


def test_v2_memory_max(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "job" / "memory.max", str(2 * GIB))
    _write(root / "job" / "memory.current", str(GIB // 2))
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    assert cgroup_headroom(str(proc), root) == (GIB + GIB // 2, str(root / "job" / "memory.max"))
    _write(root / "job" / "memory.max", "max\n")
    assert cgroup_headroom(str(proc), root) is None


def test_ram_tier_is_clamped_with_a_note_or_refused_when_strict():
    limit = MemoryLimit(4 * GIB, "cgroup limit /x/memory.max")
    notes = []
    assert ram_tier_bytes(GIB, limit, GIB, False, notes) == GIB and notes == []
    got = ram_tier_bytes(32 * GIB, limit, GIB, False, notes)
    assert got == int(0.9 * 4 * GIB) - GIB - RESERVE_BYTES
    assert "clamped to" in notes[0] and "/x/memory.max" in notes[0]
    with pytest.raises(StorageSetupError, match="does not fit") as info:
        ram_tier_bytes(32 * GIB, limit, GIB, True, [])
    assert info.value.setting == "cpu_mem_gb"
    from kv_cache.cli import explain

    assert explain(info.value).startswith("--cpu-mem-gb 32.00 GiB (CPU tier) does not fit")  # reads after the flag


@pytest.mark.slow  # a real process
def test_strict_memory_refuses_with_exit_2_and_one_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--cpu-mem-gb", "16000", "--strict-memory",
           "--gpu-mem-gb", "0", "--duration", "1", "--cache-dir", str(tmp_path / "c"),
           "--output", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "--cpu-mem-gb" in last and "does not fit" in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "c").exists()  # the cache dir it created is gone again
