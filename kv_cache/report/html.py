"""One self-contained HTML page: the run's parameters and its plots (PNGs embedded as data URIs)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%}}img{{max-width:100%}}</style>
</head><body><h1>{title}</h1>
<p>{summary}</p>
<h2>Plots</h2>
{figures}
<h2>Parameters</h2>
<table>{params}</table>
</body></html>
"""


def _parameters(results: dict[str, Any]) -> dict[str, Any]:
    return results.get("run_parameters") or results.get("parameters") or {}


def _summary_line(results: dict[str, Any]) -> str:
    s = results.get("summary") or {}
    if "total_requests" in s:
        return (f"{s['total_requests']} requests in {s.get('elapsed_time', 0):.1f} s, "
                f"{s.get('avg_throughput_tokens_per_sec', 0):.1f} tok/s; schema {results.get('schema_version')}")
    if results.get("rungs"):
        return f"{len(results['rungs'])} rungs; schema {results.get('schema_version')}"
    return f"schema {results.get('schema_version')}"


def _cell(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else json.dumps(value))


def write_html(results: dict[str, Any], pngs: list[Path], out_dir: str | Path, title: str = "kv-cache run") -> Path:
    """index.html in `out_dir`, embedding `pngs` and listing the run's parameters."""
    figures = "\n".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode("ascii")}"><figcaption>{html.escape(p.name)}</figcaption></figure>'
        for p in pngs) or "<p>No plots: the results hold no time series, histograms or rungs.</p>"
    params = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>"
                     for k, v in _parameters(results).items())
    page = PAGE.format(title=html.escape(title), summary=html.escape(_summary_line(results)), figures=figures,
                       params=params)
    path = Path(out_dir) / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
