"""Device limits (host/devices.py, the device_limit check): a storage bandwidth above the drive's or its link's
rated GB/s is invalid, with the excess stated. The published row: SAMSUNG MEMORY_AE option 3 trial 2 (one
15.36 TB drive), 4258.41 GiB read in 300.002 s = 15.24 GB/s (tests/fixtures/mlperf/README.md)."""

import json
from pathlib import Path

import pytest

from kv_cache.cli import main
from kv_cache.errors import UsageError
from kv_cache.host.devices import Drive, limit_of_host, load_devices, sysfs_drive

SAMSUNG = Path(__file__).parent / "fixtures" / "mlperf" / "samsung_memory_ae_run"


def test_audit_flags_the_published_single_drive_row_above_its_rating(capsys):
    assert main(["audit", "--json", "--devices", str(SAMSUNG / "devices.yaml"), str(SAMSUNG)]) == 1
    (block,) = json.loads(capsys.readouterr().out)["files"].values()
    c = next(c for c in block["checks"] if c["check"] == "device_limit")
    assert c["status"] == "invalid"
    assert c["numbers"]["read_gb_per_s"] == pytest.approx(15.242, abs=0.001)
    assert "by 0.74 GB/s (+5.1%)" in c["reason"]


def test_the_flag_gives_the_limit_and_without_one_the_check_says_none_is_known(capsys):
    assert main(["audit", "--device-limit-gbs", "14.5", str(SAMSUNG)]) == 1
    assert "above the 14.5 GB/s read limit of --device-limit-gbs 14.5 by 0.74 GB/s" in capsys.readouterr().out
    main(["audit", "--device-limit-gbs", "16", str(SAMSUNG)])
    assert "[ok] device_limit" in capsys.readouterr().out
    main(["audit", str(SAMSUNG)])
    assert "[n/a] device_limit: no device limit known" in capsys.readouterr().out
    assert main(["audit", "--device-limit-gbs", "0", str(SAMSUNG)]) == 2


def test_a_drive_s_write_rating_bounds_its_writes_apart_from_its_reads(tmp_path, capsys):
    """The host YAML's write_gbs: SAMSUNG's row writes 2.804 GiB/s (3.01 GB/s); a drive rated 14 GB/s read but
    2 GB/s write cannot have written it (the read figure alone bounded both directions)."""
    y = tmp_path / "d.yaml"
    y.write_text("drives:\n  - name: nvme0n1\n    read_gbs: 16\n    write_gbs: 2\n")
    assert main(["audit", "--devices", str(y), str(SAMSUNG)]) == 1
    out = capsys.readouterr().out
    assert "storage write" in out and "above the 2 GB/s write limit" in out and "storage read" not in out
    y.write_text("drives:\n  - name: nvme0n1\n    read_gbs: 16\n    write_gbs: 4\n")
    main(["audit", "--devices", str(y), str(SAMSUNG)])
    assert "[ok] device_limit" in capsys.readouterr().out


def test_a_host_is_limited_by_the_link_when_it_is_slower_than_the_drive(tmp_path):
    y = tmp_path / "d.yaml"
    y.write_text("hosts:\n  n1:\n    drives:\n      - {name: a, read_gbs: 14.5, pcie: {gen: 4, width: 4}}\n"
                 "      - {name: b, read_gbs: 7.0}\n")
    table = load_devices(y)
    gbs, what = limit_of_host(table, "n1")
    assert gbs == pytest.approx(7.876 + 7.0) and "PCIe Gen4 x4" in what
    assert limit_of_host(table, "other") == (gbs, what)  # the only host named
    y.write_text("drives: [{model: x}]\n")
    with pytest.raises(UsageError, match="each drive needs a name"):
        load_devices(y)


def test_sysfs_gives_the_model_and_the_trained_link(tmp_path):
    pci = tmp_path / "devices" / "pci0000:00" / "0000:01:00.0"
    ctrl = pci / "nvme" / "nvme0"
    ctrl.mkdir(parents=True)
    (pci / "current_link_speed").write_text("32.0 GT/s PCIe\n")
    (pci / "current_link_width").write_text("4\n")
    (ctrl / "model").write_text("SAMSUNG MZTLD15THEPB-00AGG\n")
    block = tmp_path / "block" / "nvme0n1"
    block.mkdir(parents=True)
    (block / "device").symlink_to(ctrl)
    d = sysfs_drive("nvme0n1", str(tmp_path / "block"))
    assert d == Drive("nvme0n1", "SAMSUNG MZTLD15THEPB-00AGG", None, None, 5, 4)
    assert d.limit() == pytest.approx(15.752)
    assert sysfs_drive("nope", str(tmp_path / "block")) is None


def test_an_fsync_only_write_p50_above_the_drive_is_flagged():
    """The MLPerf tool's write 'device' time is the fsync alone: a median implying more than the drive (17.4
    GB/s on a 14.5 GB/s drive) is suspect, more than twice it or than the link ceiling impossible."""
    from kv_cache.results import integrity as integ  # noqa: PLC0415

    def facts(p50_ms: float, limit: float | None = 14.5) -> integ.IntegrityFacts:
        return integ.IntegrityFacts(source="mlperf-tool", read_bytes=0.0, write_bytes=100 * 1.74e9, write_ops=100,
                                    write_device_p95_ms=1000.0, write_device_p50_ms=p50_ms,
                                    write_device_is_fsync_only=True, device_limit_gbs=limit)
    c = integ.check_device_time(facts(100.0))
    assert c["status"] == integ.SUSPECT and c["numbers"]["write_p50_implied_gb_per_s"] == pytest.approx(17.4)
    assert "the fsync alone: the flush path" in c["reason"] and "above the device's 14.5 GB/s" in c["reason"]
    assert integ.check_device_time(facts(40.0))["status"] == integ.INVALID  # 43.5 GB/s: twice the drive
    assert integ.check_device_time(facts(100.0, None))["status"] == integ.OK  # no limit known: possible
    assert integ.check_device_time(facts(0.01, None))["status"] == integ.INVALID  # 174 TB/s: above any link
