"""`kv-cache compare A.json B.json ...`: key metrics side by side, ratios to the first file, 95 % CIs.

First the workloads must match (same model, users, duration, flags that change what is asked for): a
comparison of different workloads compares workloads, not storage. `workload_differences` says what
differs; the CLI refuses, or warns when told to go on.

Where a result has windows, intervals come from them (kv_cache/metrics/stats.py):
- standard runs: the 1-second `time_series` is cut into k equal sub-windows (batch means, k = 10 or fewer
  for short runs); a rate's CI is the Student t interval of the k sub-window rates, and a ratio's CI the
  delta-method interval of `ratio_ci` on the two sets of sub-window rates;
- sessions runs: each rung's per-sub-window throughput samples (the same batch means its own CI uses).
Percentiles, hit rates and whole-run averages are shown without an interval. The footer that explains the
brackets is printed only when at least one interval was computed (a merged document has no time series).

Merged documents (`kv-cache-merged/1`) compare like standard runs. Their `run_parameters` hold the run's
totals (each setting that divides across ranks as given for the whole run, the base seed: results/merge.py
run_totals), so a one-process run and a `--processes 2` (or `mpirun -n 2`) run of the same flags are the same
workload: how many processes ran it is not a workload setting, and `layout_notes` says it beside the
table. A merged document written before the totals were carried (no `settings_split.totals`) is read from
`rank_parameters` (each rank's share; a setting that differs between ranks, such as the offset seeds,
compares as the list of its per-rank values) and its `split_as` says so, so it never matches totals; one
without either has an unknown workload, which is refused like a different one. A rank's own document
(world size > 1) holds its share: `split_as` "shares of N ranks".

Each side's storage (results/storage_info.py) is named in the table's legend, in `--json` (`to_json`) and in
the overlaid plots (render/compare_plots.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kv_cache.metrics.stats import CI, mean_ci, ratio_ci, subwindow_rates
from kv_cache.results.figures import Figures
from kv_cache.results.storage_info import kind_of, storage_facts, storage_label

GIB = float(1 << 30)
MAX_SUBWINDOWS = 10
COMPARE_SCHEMA_VERSION = "kv-cache-compare/1"
INTERVALS_NOTE = ("Brackets: 95 % confidence intervals from sub-windows of each run's measured window (batch means,"
                  " Student t; ratios: delta method on the log ratio). No brackets: a single figure per run.")
NO_INTERVALS_NOTE = ("No confidence intervals: no result here has the per-second time series (or rung sub-window"
                     " samples) they are computed from; each figure is a single value per run.")
UNKNOWN_WORKLOAD = "unknown (a merged document without its ranks' parameters: merge the rank files again)"

# Settings that change the workload (what is asked for), per kind of result; everything else (cache dir,
# tier sizes, I/O engine) is what a comparison is for.
STANDARD_WORKLOAD = ("model", "num_users", "duration", "generation_mode", "multi_turn", "prefix_caching", "seed",
                     "request_rate", "max_requests", "autoscaling", "autoscaler_mode", "rag_enabled",
                     "rag_num_docs", "prefill_only", "decode_only")
TOTALS = "totals of the whole run"
SESSIONS_WORKLOAD = ("model", "gpu", "num_gpus", "tensor_parallel", "block_tokens", "ladder", "window_s",
                     "warmup_s", "subwindows", "pace", "seed", "trace")

# (label, the figure of a document's summary (results/figures.py), time-series column giving its per-second
#  rate or None, scale)
STANDARD_METRICS: tuple[tuple[str, Callable[[Figures], Any], str | None, float], ...] = (
    ("requests/s", lambda f: f.requests_per_second, "requests", 1.0),
    ("tokens/s", lambda f: f.tokens_per_sec, None, 1.0),
    ("storage read GiB/s", lambda f: f.cache.storage.read.bandwidth_gbps, "storage_read_bytes", 1 / GIB),
    ("storage write GiB/s", lambda f: f.cache.storage.write.bandwidth_gbps, "storage_write_bytes", 1 / GIB),
    ("storage read p95 ms", lambda f: f.cache.storage.read.ms("p95"), None, 1.0),
    ("storage write p95 ms", lambda f: f.cache.storage.write.ms("p95"), None, 1.0),
    ("storage read device p95 ms", lambda f: f.cache.storage.read.ms("p95", "device"), None, 1.0),
    ("storage write device p95 ms", lambda f: f.cache.storage.write.ms("p95", "device"), None, 1.0),
    ("end-to-end p50 ms", lambda f: f.e2e.p50, None, 1.0),
    ("end-to-end p95 ms", lambda f: f.e2e.p95, None, 1.0),
    ("cache hit rate", lambda f: f.cache.hit_rate, None, 1.0),
)


class CompareError(ValueError):
    """The results cannot be compared (different kinds, or nothing measured)."""


def kind(doc: dict[str, Any]) -> str:
    return "sessions" if "rungs" in doc else "standard"


def workload_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The settings that make the workload; None when the document does not say (older merged documents)."""
    if kind(doc) == "sessions":
        params = doc.get("parameters") or {}
        return {k: params.get(k) for k in SESSIONS_WORKLOAD}
    params = doc.get("run_parameters") or {}
    if kind_of(doc) == "merged":
        if (doc.get("settings_split") or {}).get("totals") is None:
            return merged_workload(doc)
        out = {k: params.get(k) for k in STANDARD_WORKLOAD}
        traces = list(doc.get("rank_trace_paths") or [None])
        out["trace"] = traces[0] if all(t == traces[0] for t in traces) else traces
        out["split_as"] = TOTALS
        return out
    out = {k: params.get(k) for k in STANDARD_WORKLOAD}
    out["trace"] = (doc.get("trace_replay") or {}).get("paths")
    out["split_as"] = _split_as(int(params.get("mpi_world_size") or 1))
    return out


def _split_as(ranks: int) -> str:
    return TOTALS if ranks <= 1 else f"one rank's share of {ranks} ranks"


def processes_of(doc: dict[str, Any]) -> int | None:
    """How many processes (ranks) ran a standard or merged run; None for sessions results."""
    if kind(doc) == "sessions":
        return None
    if kind_of(doc) == "merged":
        return int(doc.get("ranks_expected") or doc.get("world_size") or doc.get("ranks") or 1)
    return 1


def layout_notes(docs: list[dict[str, Any]]) -> list[str]:
    """'A: 1 process, B: 2 processes (...)' when the runs ran on different numbers of processes: not a
    workload difference (the totals are what is asked for), but a reader should know."""
    return _process_notes(docs) + offered_load_notes(docs)


def _process_notes(docs: list[dict[str, Any]]) -> list[str]:
    counts = [processes_of(d) for d in docs]
    if any(c is None for c in counts) or len(set(counts)) < 2:
        return []
    return ["processes: " + ", ".join(f"{_letter(i)}={c} process{'es' if c != 1 else ''}"
                                       for i, c in enumerate(counts))
            + " (not a workload difference: each offered the totals given)"]


def offered_load_notes(docs: list[dict[str, Any]]) -> list[str]:
    """'offered load: A=3.35e+04/s of 1e+12 asked (generator saturated), B=...' when an open loop's generator
    saturated in any of the runs: the same --request-rate then offered different loads, which the
    workload check (the flags given) cannot see."""
    cells, saturated = [], False
    for i, d in enumerate(docs):
        m = d.get("measurement") or {}
        asked, offered = m.get("requested_request_rate"), m.get("offered_request_rate")
        if not asked or offered is None:
            cells.append(f"{_letter(i)}=closed loop or not recorded")
            continue
        saturated = saturated or bool(m.get("generator_saturated"))
        cells.append(f"{_letter(i)}={offered:.4g}/s of {asked:.4g} asked"
                     + (" (generator saturated)" if m.get("generator_saturated") else ""))
    if not saturated:
        return []
    return ["offered load: " + ", ".join(cells) + " (an open-loop generator saturated: the runs were not offered "
            "the load asked, so the comparison is of the loads really offered)"]


def merged_workload(doc: dict[str, Any]) -> dict[str, Any] | None:
    """A merged document's workload from its ranks' parameters: a setting's value when every rank had the
    same, else the list of the per-rank values (rank order)."""
    ranks = doc.get("rank_parameters")
    if not ranks:
        return None

    def one(values: list[Any]) -> Any:
        return values[0] if all(v == values[0] for v in values) else values

    out = {k: one([r.get(k) for r in ranks]) for k in STANDARD_WORKLOAD}
    out["trace"] = one(list(doc.get("rank_trace_paths") or [None] * len(ranks)))
    out["split_as"] = f"each rank's share of {len(ranks)} ranks (a merge without the run's totals)"
    return out


def workload_differences(docs: list[dict[str, Any]]) -> list[str]:
    """'setting: A=..., B=...' for every workload setting that is not the same in all documents; a document
    whose workload is unknown is a difference of its own ('workload: A=unknown ...')."""
    kinds = {kind(d) for d in docs}
    if len(kinds) > 1:
        raise CompareError("cannot compare a sessions result with a standard run's result")
    loads = [workload_of(d) for d in docs]
    unknown = [i for i, w in enumerate(loads) if w is None]
    if unknown:
        return ["workload: " + ", ".join(f"{_letter(i)}={UNKNOWN_WORKLOAD}" for i in unknown)]
    known = [w for w in loads if w is not None]
    keys = list(dict.fromkeys(k for w in known for k in w))
    return [f"{key}: " + ", ".join(f"{_letter(i)}={_shown(w.get(key), d, w)}"
                                   for i, (w, d) in enumerate(zip(known, docs, strict=True)))
            for key in keys if any(w.get(key) != known[0].get(key) for w in known[1:])]


def _shown(value: Any, doc: dict[str, Any], workload: dict[str, Any] | None = None) -> str:
    """A workload value as the message shows it; the value of a merged document read from its ranks'
    parameters is each rank's."""
    per_rank = kind_of(doc) == "merged" and (workload or {}).get("split_as") != TOTALS
    if per_rank and not isinstance(value, list) and not str(value).startswith("each rank's share"):
        return f"{value!r} (each of {len(doc.get('rank_parameters') or [])} ranks)"
    return repr(value)


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"#{i + 1}"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def window_rates(doc: dict[str, Any], column: str, scale: float = 1.0) -> list[float]:
    """Per-second rates of `column` in each sub-window of the time series (batch means); [] without one."""
    rows = (doc.get("time_series") or {}).get("rows") or []
    k = min(MAX_SUBWINDOWS, len(rows) // 2)
    if k < 2:
        return []
    end = rows[-1]["t_s"]
    if end <= 0:
        return []
    # a bucket's t_s is its end: place it at its middle, so it falls in the sub-window it belongs to
    return subwindow_rates([(r["t_s"] - r.get("seconds", 1.0) / 2, r.get(column, 0) * scale) for r in rows],
                           (0.0, end), k)


@dataclass
class Cell:
    value: float | None
    ci: CI | None = None

    def has_interval(self) -> bool:
        """A figure with an interval worth showing (two or more sub-windows that did not all agree)."""
        return (self.value is not None and self.ci is not None and self.ci.n >= 2
                and self.ci.low != self.ci.high)

    def text(self) -> str:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return "-"
        out = number(self.value)
        if self.has_interval():
            assert self.ci is not None
            out += f" [{number(self.ci.low)}, {number(self.ci.high)}]"
        return out

    def to_json(self) -> dict[str, Any]:
        finite = self.value is not None and not (isinstance(self.value, float) and math.isnan(self.value))
        return {"value": self.value if finite else None,
                "ci95": [self.ci.low, self.ci.high] if self.has_interval() and self.ci is not None else None}


def number(v: float) -> str:
    """Three significant digits, without exponents for the magnitudes a benchmark shows."""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if v == 0 or abs(v) >= 0.001:
        return f"{v:.3g}"
    return f"{v:.2e}"


@dataclass
class Row:
    label: str
    cells: list[Cell]  # one per document
    ratios: list[Cell]  # one per document after the first: document / first


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a not in (None, 0) and b is not None else None


def standard_rows(docs: list[dict[str, Any]]) -> list[Row]:
    rows = []
    figures = [Figures.from_json(d.get("summary")) for d in docs]
    for label, figure, column, scale in STANDARD_METRICS:
        samples = [window_rates(d, column, scale) if column else [] for d in docs]
        cells = [Cell(_number(figure(f)), mean_ci(s) if len(s) >= 2 else None)
                 for f, s in zip(figures, samples, strict=True)]
        ratios = []
        for d_s, cell in zip(samples[1:], cells[1:], strict=True):
            if len(d_s) >= 2 and len(samples[0]) >= 2:
                ci = ratio_ci(d_s, samples[0])
                ratios.append(Cell(_ratio(cells[0].value, cell.value), ci))
            else:
                ratios.append(Cell(_ratio(cells[0].value, cell.value)))
        rows.append(Row(label, cells, ratios))
    return rows


def _rungs(doc: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["tiers"], r["sessions"]): r for r in doc.get("rungs") or []}


def sessions_rows(docs: list[dict[str, Any]]) -> list[Row]:
    """Per-GPU throughput per (configuration, sessions) rung present in every document."""
    by_doc = [_rungs(d) for d in docs]
    keys = [k for k in by_doc[0] if all(k in b for b in by_doc[1:])]
    rows = []
    for cfg, n in keys:
        rungs = [b[(cfg, n)] for b in by_doc]
        cells = [Cell(r["throughput_tokens_per_s_per_gpu"]["estimate"],
                      CI(**r["throughput_tokens_per_s_per_gpu"]) if r["throughput_tokens_per_s_per_gpu"].get("low")
                      is not None else None) for r in rungs]
        base = rungs[0].get("throughput_subwindow_tokens_per_s_per_gpu") or []
        ratios = []
        for r, cell in zip(rungs[1:], cells[1:], strict=True):
            mine = r.get("throughput_subwindow_tokens_per_s_per_gpu") or []
            ci = ratio_ci(mine, base) if len(mine) >= 2 and len(base) >= 2 else None
            ratios.append(Cell(_ratio(cells[0].value, cell.value), ci))
        rows.append(Row(f"{cfg} @ {n} sessions tok/s/GPU", cells, ratios))
    return rows


def no_rows_reason(docs: list[dict[str, Any]]) -> str:
    """Why the table has no row: for sessions results, no (configuration, sessions) rung is in every file,
    each file's rungs named."""
    if kind(docs[0]) != "sessions":
        return "No common metric: none of the metrics is in every file."
    sides = "; ".join(f"{_letter(i)} has {', '.join(f'{c} @ {n}' for c, n in _rungs(d)) or 'no rung'}"
                      for i, d in enumerate(docs))
    return f"No common rung: no (configuration, sessions) rung is in every file ({sides}), so nothing is compared."


def compare_rows(docs: list[dict[str, Any]]) -> list[Row]:
    if len(docs) < 2:
        raise CompareError("compare needs at least two results files")
    return sessions_rows(docs) if kind(docs[0]) == "sessions" else standard_rows(docs)


def has_intervals(rows: list[Row]) -> bool:
    return any(c.has_interval() for r in rows for c in (*r.cells, *r.ratios))


def format_table(names: list[str], rows: list[Row], storages: list[str] | None = None) -> list[str]:
    """The side-by-side table: one column per file, then one ratio column per file after the first; with
    `storages`, each file's storage under its name. The intervals' footer only when there are intervals."""
    head = ["metric", *(f"{_letter(i)}" for i in range(len(names))),
            *(f"{_letter(i)}/A" for i in range(1, len(names)))]
    body = [[r.label, *(c.text() for c in r.cells), *(c.text() for c in r.ratios)] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = []
    for i, name in enumerate(names):
        lines.append(f"  {_letter(i)} = {name}")
        if storages is not None:
            lines.append(f"      storage: {storages[i]}")
    lines.append("")
    for line in [head, *body]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    lines += ["", INTERVALS_NOTE if has_intervals(rows) else NO_INTERVALS_NOTE]
    return lines


def to_json(names: list[str], docs: list[dict[str, Any]], rows: list[Row], differences: list[str]) -> dict[str, Any]:
    """The comparison for scripts: each side (file, kind, schema, storage), the workload differences, and per
    metric each side's value and 95 % interval, and each ratio to A with its interval (None: not computed)."""
    return {
        "schema_version": COMPARE_SCHEMA_VERSION,
        "baseline": _letter(0),
        "runs": [{"label": _letter(i), "path": name, "kind": kind_of(doc), "schema_version": doc.get("schema_version"),
                  "storage": storage_facts(doc), "storage_label": storage_label(doc)}
                 for i, (name, doc) in enumerate(zip(names, docs, strict=True))],
        "workload_differences": differences,
        "layout_notes": layout_notes(docs),
        "intervals": INTERVALS_NOTE if has_intervals(rows) else None,
        "metrics": [{"metric": r.label, "values": [c.to_json() for c in r.cells],
                     "ratios_to_baseline": [{"label": f"{_letter(i + 1)}/{_letter(0)}", **c.to_json()}
                                            for i, c in enumerate(r.ratios)]} for r in rows],
    }
