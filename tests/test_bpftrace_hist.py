"""The bpftrace output parser on captured output with every bucket form (hist, lhist, keyed, values)."""

from kv_cache.host.bpftrace_hist import (
    bucket_text,
    number,
    parse_bucket,
    parse_output,
    quantile_bucket,
    total,
)

# Captured on this machine (bpftrace 0.17, a D2C histogram of 64 MiB of O_DIRECT writes), plus an lhist,
# a keyed map and plain values in the forms bpftrace prints them.
CAPTURED = """Attaching 4 probes...


@d2c_us:
[0]                    1 |                                                    |
[1]                    2 |                                                    |
[2, 4)                 3 |                                                    |
[16, 32)               5 |                                                    |
[32, 64)              22 |                                                    |
[512, 1K)             49 |@                                                   |
[1K, 2K)              20 |                                                    |
[8K, 16K)           1016 |@@@@@@@@@@@@@@@@@@@@@@@@@                           |
[16K, 32K)          2111 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[4M, 8M)               1 |                                                    |
[1G, 2G)               1 |                                                    |

@lba_gib:
(..., 0)               2 |@                                                   |
[0, 5)                 7 |@@@@                                              |
[-10, -5)              1 |                                                    |
[5, 10)               90 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[100, ...)             3 |@                                                   |

@bs_bytes[WS]:
[4K, 8K)               4 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|
[1M, 2M)               2 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |

@bs_bytes[R]:
[128K, 256K)           9 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|

@inflight_max: 12
@comm: kv-cache
"""


def test_every_bucket_form_is_read():
    maps = parse_output(CAPTURED)
    d2c = maps["@d2c_us"]
    assert len(d2c) == 11 and total(d2c) == 1 + 2 + 3 + 5 + 22 + 49 + 20 + 1016 + 2111 + 1 + 1
    assert d2c[0] == {"low": 0, "high": 1, "count": 1}
    assert d2c[2] == {"low": 2, "high": 4, "count": 3}
    assert d2c[5] == {"low": 512, "high": 1024, "count": 49}  # the form the reference's parser dropped
    assert d2c[6] == {"low": 1024, "high": 2048, "count": 20}
    assert d2c[9] == {"low": 4 << 20, "high": 8 << 20, "count": 1}
    assert d2c[10] == {"low": 1 << 30, "high": 2 << 30, "count": 1}
    lba = maps["@lba_gib"]
    assert lba[0] == {"low": None, "high": 0, "count": 2}
    assert lba[2] == {"low": -10, "high": -5, "count": 1}
    assert lba[4] == {"low": 100, "high": None, "count": 3}


def test_keyed_maps_and_values():
    maps = parse_output(CAPTURED)
    assert set(maps["@bs_bytes"]) == {"WS", "R"}
    assert maps["@bs_bytes"]["WS"] == [{"low": 4096, "high": 8192, "count": 4},
                                       {"low": 1 << 20, "high": 2 << 20, "count": 2}]
    assert maps["@bs_bytes"]["R"][0]["low"] == 128 << 10
    assert maps["@inflight_max"] == 12 and maps["@comm"] == "kv-cache"


def test_a_key_printed_twice_is_one_histogram():
    text = "@bs[RS]:\n[4K, 8K)  2 |@@|\n\n@bs[RS]:\n[4K, 8K)  3 |@@@|\n[1M, 2M)  1 |@|\n"
    buckets = parse_output(text)["@bs"]["RS"]
    assert buckets == [{"low": 4096, "high": 8192, "count": 5}, {"low": 1 << 20, "high": 2 << 20, "count": 1}]
    assert quantile_bucket(buckets, 0.9)["low"] == 1 << 20  # one histogram, in order, counts added


def test_single_lines_and_bounds():
    assert parse_bucket("[512, 1K)             49 |@   |") == {"low": 512, "high": 1024, "count": 49}
    assert parse_bucket("Attaching 4 probes...") is None
    assert [number(t) for t in ("0", "7", "1K", "2M", "3G", "1T", "-4")] == [0, 7, 1024, 2 << 20, 3 << 30, 1 << 40, -4]


def test_quantile_bucket():
    d2c = parse_output(CAPTURED)["@d2c_us"]
    assert quantile_bucket(d2c, 0.5) == {"low": 16384, "high": 32768, "count": 2111}
    assert quantile_bucket(d2c, 0.01)["high"] == 64
    assert quantile_bucket([], 0.5) is None
    assert bucket_text(quantile_bucket(d2c, 0.5), " us") == "[16384, 32768) us"
    assert bucket_text({"low": None, "high": 0, "count": 1}) == "< 0"
    assert bucket_text(None) == "-"
