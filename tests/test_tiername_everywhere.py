"""One tier-name type everywhere: the statistics, results and rendering layers name their tiers by
:class:`TierName`, and a str-enum keeps every JSON key and printed line what it was."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from kv_cache.render import console, plots, progress
from kv_cache.results import summary
from kv_cache.storage.tiername import TierName
from kv_cache.storage.tracelog import TIER_LABELS

PKG = Path(__file__).resolve().parent.parent / "kv_cache"
TIER_WORDS = {"gpu", "cpu", "storage"}


def test_tier_tuples_are_tiername():
    for tiers in (console.TIERS, summary.TIERS, progress.TIER_ORDER, tuple(t for t, _ in plots.TIER_OPS)[::2]):
        assert all(isinstance(t, TierName) for t in tiers), tiers
        assert [str(t) for t in tiers] == ["gpu", "cpu", "storage"]
    assert set(console.TIER_TITLES) == set(TierName)
    assert TIER_LABELS == {"gpu": "Tier-0", "cpu": "Tier-1", "nvme": "Tier-2"}  # the trace log's labels kept


def test_json_keys_and_formatting_unchanged():
    doc = {t: {f"tier_{t}_read_ops": 1} for t in TierName}
    assert json.loads(json.dumps(doc)) == {w: {f"tier_{w}_read_ops": 1} for w in ("gpu", "cpu", "storage")}


def _tier_literal_tuples(path: Path) -> list[int]:
    """Line numbers of tuple/list literals made only of tier words (a second spelling of the tier set)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and e.value in TIER_WORDS for e in node.elts):
            out.append(node.lineno)
    return out


def test_no_second_spelling_of_the_tier_set():
    offenders = {str(p.relative_to(PKG)): lines for layer in ("metrics", "results", "render")
                 for p in sorted((PKG / layer).rglob("*.py")) if (lines := _tier_literal_tuples(p))}
    assert offenders == {}


def test_no_literal_mlperf_storage_name_in_the_statistics_results_and_render_layers():
    """The MLPerf name of the storage tier ("nvme") is TierName.STORAGE.legacy there, never a literal."""
    offenders = {str(p.relative_to(PKG)): [n.lineno for n in ast.walk(ast.parse(p.read_text()))
                                            if isinstance(n, ast.Constant) and n.value == "nvme"]
                 for layer in ("metrics", "results", "render") for p in sorted((PKG / layer).rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}
