"""The summaries tests/test_figures.py compares with tests/fixtures/golden/summary_figures.json: built from the
rank fixtures' recorders (merge), and from an empty recorder (a run stopped before its window), in both
profiles. Regenerate the golden only on purpose: `python tests/golden_summary_cases.py > that file`."""

from __future__ import annotations

import json
from pathlib import Path

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.results.documents import load
from kv_cache.results.merge import _default_qos, merge_documents
from kv_cache.results.summary import build_summary

RANKS = Path(__file__).parent / "fixtures" / "results" / "ranks"


def cases() -> dict:
    docs = [load(RANKS / f"x_rank{i}.json") for i in (0, 1)]
    out = {"merged": merge_documents(docs)["summary"],
           "rank0_alone": merge_documents(docs[:1], allow_missing=True)["summary"]}
    for profile in ("latency", "throughput"):
        out[f"empty_{profile}"] = build_summary(RunMetrics(), {}, _default_qos(), profile, None, 0.0, None, True)
    out["fatal"] = build_summary(RunMetrics(), {}, _default_qos(), "latency", None, 0.5, "storage error: ENOSPC", False)
    return out


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, default=list)


if __name__ == "__main__":
    print(dumps(cases()))
