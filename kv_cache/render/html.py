"""One self-contained HTML page: which storage was measured, the headline figures, the plots (PNGs embedded
as data URIs) and the run's parameters.

The headline of a standard or merged run is the storage's: read and write GiB/s, the storage read and write
device P95 and the end-to-end P95 (requests and tokens follow on a line of their own). A sessions run's is
the peak per-GPU throughput of each offload configuration. The storage (cache directory, mount point,
filesystem, block device, I/O mode, tier configuration; results/storage_info.py) is named in the page's title,
in its first table and under every figure.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from kv_cache.host.files import atomic_target, keep_existing
from kv_cache.results.figures import Figures
from kv_cache.results.storage_info import kind_of, storage_facts, storage_label

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%}}img{{max-width:100%}}
.headline td{{font-size:120%;font-weight:bold}}</style>
</head><body><h1>{heading}</h1>
<p class="storage">Storage: {storage}</p>
<h2>Headline</h2>
<table class="headline">{headline}</table>
<p>{summary}</p>
<h2>Storage measured</h2>
<table class="storage-facts">{facts}</table>
<h2>Plots</h2>
{figures}
<h2>Parameters</h2>
<table>{params}</table>
</body></html>
"""

FACT_LABELS = (("cache_dir", "cache directory"), ("mount_point", "mount point"), ("filesystem", "filesystem"),
               ("filesystem_kind", "filesystem kind"), ("block_device", "block device"), ("io_mode", "I/O mode"),
               ("tiers", "tier configuration"))


def _parameters(results: dict[str, Any]) -> dict[str, Any]:
    ranks = results.get("rank_parameters") or [{}]
    return results.get("run_parameters") or results.get("parameters") or ranks[0] or {}


def _summary_line(results: dict[str, Any]) -> str:
    s = results.get("summary") or {}
    if "total_requests" in s:
        return (f"{s['total_requests']} requests in {s.get('elapsed_time', 0):.1f} s, "
                f"{s.get('avg_throughput_tokens_per_sec', 0):.1f} tok/s; schema {results.get('schema_version')}")
    if results.get("rungs"):
        return f"{len(results['rungs'])} rungs; schema {results.get('schema_version')}"
    return f"schema {results.get('schema_version')}"


def _fmt(value: Any, unit: str) -> str:
    return f"{value:.3f} {unit}" if isinstance(value, (int, float)) else "-"


def headline(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs of the page's headline (see the module docstring)."""
    if kind_of(results) == "sessions":
        configs = ((results.get("summary") or {}).get("configs") or {})
        rows = []
        for cfg, c in configs.items():
            peak = (c.get("peak_throughput_tokens_per_s_per_gpu") or {}).get("estimate")
            rows.append((f"{cfg}: peak tokens/s per GPU", f"{_fmt(peak, 'tok/s')} at "
                         f"{c.get('peak_throughput_sessions', '-')} sessions"))
        return rows or [("sessions", "no completed ladder")]
    f = Figures.from_json(results.get("summary"))
    storage = f.cache.storage
    block = results.get("integrity") if isinstance(results.get("integrity"), dict) else {}
    verdict = results.get("verdict") or ("PASS" if results.get("overall_passed") else "FAIL")
    integ = str(block.get("verdict", "not recorded")).upper()
    return [("verdict", str(verdict)),
            ("integrity", integ + (f": {'; '.join(block['reasons'])}" if block.get("reasons") else "")),
            ("storage read", _fmt(storage.read.bandwidth_gbps, "GiB/s")),
            ("storage write", _fmt(storage.write.bandwidth_gbps, "GiB/s")),
            ("storage read device P95", _fmt(storage.read.ms("p95", "device"), "ms")),
            ("storage write device P95", _fmt(storage.write.ms("p95", "device"), "ms")),
            ("end-to-end P95", _fmt(f.e2e.p95, "ms"))]


def _cell(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else json.dumps(value))


def _rows(pairs) -> str:
    return "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in pairs)


def figures_html(pngs: list[Path], caption: str) -> str:
    """`<figure>`s embedding `pngs`, each captioned with its file name and `caption`."""
    return "\n".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode("ascii")}"><figcaption>{html.escape(p.name)}: '
        f'{html.escape(caption)}</figcaption></figure>'
        for p in pngs) or "<p>No plots: the results hold no time series, histograms or rungs.</p>"


def write_html(results: dict[str, Any], pngs: list[Path], out_dir: str | Path, title: str = "kv-cache run") -> Path:
    """index.html in `out_dir`, embedding `pngs`, naming the storage and listing the run's parameters."""
    label = storage_label(results)
    facts = storage_facts(results)
    page = PAGE.format(
        title=html.escape(f"{title}: {label}"), heading=html.escape(title), storage=html.escape(label),
        headline=_rows(headline(results)), summary=html.escape(_summary_line(results)),
        facts=_rows((text, facts.get(key) if facts.get(key) is not None else "unknown") for key, text in FACT_LABELS),
        figures=figures_html(pngs, f"Storage: {label}"), params=_rows(_parameters(results).items()))
    path = Path(out_dir) / "index.html"
    keep_existing(path)  # an earlier page stays as index.html.1 (it embeds its own PNGs)
    with atomic_target(path) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return path
