"""docs/adding-a-backend.md's toy backend (docs/examples/toy_backend.py): registered from the page's own file,
its option reaches the flags, their checks and the settings, and a short real run stores on it and names it
in the results and the report."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli import build_parser, parse_settings
from kv_cache.errors import UsageError
from kv_cache.settings.run import RemoteTierSettings
from kv_cache.storage import backends

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "toy_backend.py"


@pytest.fixture
def toy(monkeypatch):
    """The example module, imported (so registered) for this test only."""
    backends.all_backends()  # the shipped entries first
    for table in ("option_defaults", "option_rules"):
        monkeypatch.setattr(RemoteTierSettings, table, dict(getattr(RemoteTierSettings, table)))
    saved = dict(backends._ENTRIES)
    spec = importlib.util.spec_from_file_location("toy_backend", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    backends._ENTRIES.clear()
    backends._ENTRIES.update(saved)


def test_the_pages_example_is_the_file_the_test_loads():
    page = (EXAMPLE.parents[1] / "adding-a-backend.md").read_text()
    shown = page.split("```python\n", 1)[1].split("```\n", 1)[0]
    assert "docs/examples/toy_backend.py" in page and shown == EXAMPLE.read_text()


def test_its_option_is_a_flag_with_its_default_and_check(toy):
    text = " ".join(build_parser("run").format_help().split())  # (the help's lines rewrapped)
    assert "--toy-pause-us" in text and "toy (a dict in RAM, the docs' example)" in text
    assert "--toy-pause-us" in build_parser("sessions").format_help()
    assert parse_settings(["--storage-backend", "toy"]).tiers.remote.toy_pause_us == 0
    assert parse_settings(["--storage-backend", "toy", "--toy-pause-us", "7"]).tiers.remote.toy_pause_us == 7
    with pytest.raises(UsageError, match="--toy-pause-us cannot be negative, got -1"):
        parse_settings(["--storage-backend", "toy", "--toy-pause-us", "-1"])
    # owned: given without --storage-backend toy, it is refused rather than the file tier measured
    with pytest.raises(UsageError, match="--toy-pause-us given but --storage-backend is file: add --storage-backend toy"):
        parse_settings(["--toy-pause-us", "5"])


@pytest.mark.slow  # a real run (wall clock)
def test_a_short_run_stores_on_it_and_names_it(toy, quick_settings):
    settings = quick_settings("--storage-backend", "toy", "--toy-pause-us", "20", "--storage-capacity-gb", "0.5")
    assert settings.tiers.remote.toy_pause_us == 20
    out = io.StringIO()
    results, _ = execute(settings, out)
    assert results["measurement"]["tier_backends"] == {"storage": "toy"}
    assert results["summary"]["cache_stats"]["tier_storage_kv_bytes_written_gb"] > 0
    assert "### STORAGE PERFORMANCE (storage tier only: the toy backend's dict in RAM) ###" in out.getvalue()
    assert "  Tier backends: storage toy\n" in out.getvalue()


def test_a_split_option_is_divided_between_the_ranks(toy):
    from kv_cache.settings.fields import SPLIT, Flag
    from kv_cache.settings.ranks import rank_share

    entry = backends.Backend(
        name="toy-split", tier=toy.BACKEND.tier, summary="the toy, with a total", capabilities=toy.BACKEND.capabilities,
        open=toy.BACKEND.open, choice="the toy with a total", options=(backends.Option(
            "toy_total", "a total the ranks share", 0, Flag("--toy-total", type=int, help="A total."), split=SPLIT),))
    backends.register(entry)
    settings = parse_settings(["--storage-backend", "toy-split", "--toy-total", "10"])
    shares = [rank_share(settings, rank, 3).tiers.remote.toy_total for rank in range(3)]
    assert shares == [4, 3, 3] and rank_share(settings, 0, 3).rank_totals["toy_total"] == 10
