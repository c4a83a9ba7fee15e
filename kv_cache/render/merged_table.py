"""A merged document (results/merge.py) as text for the console: its figures and the per-rank table."""

from __future__ import annotations

from typing import Any

from kv_cache.results.merge import FROM_HISTOGRAMS, PRECISION

__all__ = ["integrity_sentence", "merged_table"]


def integrity_sentence(results: dict[str, Any]) -> str:
    """`Verdict PASS; integrity INVALID: <the first reason>` - the verdict and the integrity in one line,
    wherever PASS is printed (the reasons in full: kv-cache audit)."""
    verdict = results.get("verdict") or ("PASS" if results.get("overall_passed") else "FAIL")
    block = results.get("integrity") if isinstance(results.get("integrity"), dict) else {}
    integ = str(block.get("verdict", "not recorded")).upper()
    # a storage tier on RAM first (tmpfs, /dev/shm): whatever else the checks found, no storage was measured
    reasons = sorted(block.get("reasons") or [], key=lambda r: "which is RAM" not in r)
    why = f": {reasons[0]}" + (f" (+{len(reasons) - 1} more: kv-cache audit)" if len(reasons) > 1 else "") \
        if reasons else ""
    return f"Verdict {verdict}; integrity {integ}{why}"


def _timer_lines(meas: dict[str, Any]) -> list[str]:
    """The ranks that timed the device in Python (the fallback, storage/timedio.py: its figures include the
    wait for the GIL), said on the console of a --processes run; nothing when every rank used the C helper
    or the document records no timer."""
    ranks = [r for r in meas.get("per_rank") or [] if isinstance(r, dict)]
    timers = {r.get("rank"): (r.get("device_timer") or {}) for r in ranks if isinstance(r.get("device_timer"), dict)}
    slow = sorted((k for k, t in timers.items() if t.get("timer") not in (None, "c")), key=str)
    if not slow:
        return []
    first = timers[slow[0]]
    return [f"  device timer: {first.get('timer')} on rank(s) {', '.join(map(str, slow))} of {len(ranks)}: "
            f"{first.get('description')}"]


def merged_table(doc: dict[str, Any]) -> str:
    """The merged figures and the per-rank table, as text for the console."""
    w, bw, lat = doc["window"], doc["bandwidth_gibps"], doc["latency_ms"]
    spread = (f" (starts {w['start_spread_s']:.3f} s apart, ends {w['end_spread_s']:.3f} s)"
              if w.get("start_spread_s") is not None else "")
    lines = [f"Merged {doc['ranks']} rank(s): window {w['seconds']:.3f} s, {w['kind']}{spread}",
             f"  storage read {bw['storage_read']:.3f} GiB/s, write {bw['storage_write']:.3f} GiB/s "
             f"(sum of the ranks' rates: read {doc['sum_of_ranks']['tier_storage_read_bandwidth_gbps']:.3f}, "
             f"write {doc['sum_of_ranks']['tier_storage_write_bandwidth_gbps']:.3f})",
             f"  requests {doc['totals']['requests_completed']}, end-to-end P95 "
             f"{lat['end_to_end'].get('p95', 0.0):.2f} ms (merged), max of rank P95 "
             f"{doc['max_of_rank_p95_ms']['end_to_end_latency'] or 0.0:.2f} ms"]
    lines += _timer_lines(doc.get("measurement") or {})
    methods = sorted({m for m in (doc.get("percentile_method") or {}).values() if m})
    if FROM_HISTOGRAMS in methods:
        lines.append(f"  percentiles of some lists from the {FROM_HISTOGRAMS} ({PRECISION})")
    if doc.get("missing_ranks"):
        lines.append(f"  MISSING rank(s): {', '.join(map(str, doc['missing_ranks']))}")
    for x in doc.get("incomplete_ranks") or []:  # measured up to when: none of its figures is a full window
        periodic = x.get("sequence") is not None
        lines.append(f"  INCOMPLETE rank {x['rank']}: measured {float(x.get('measured_s') or 0.0):.1f} s of the window"
                     + (" (its last periodic document: it ended without its final one"
                        + (f", {x['ended']}" if x.get("ended") else "") + ")" if periodic else " (cut short)")
                     + "; its figures in the merge cover that part only")
    lines.append("  " + integrity_sentence(doc))
    per_rank = ((doc.get("integrity") or {}).get("per_rank") or {})
    lines.append(f"  {'rank':>4} {'window s':>9} {'requests':>8} {'read GiB/s':>10} {'write GiB/s':>11} "
                 f"{'e2e P95 ms':>10} {'integrity':>12}  host / file")
    for r in doc["per_rank"]:
        integ = str((per_rank.get(str(r["rank"])) or {}).get("verdict", "-"))
        lines.append(f"  {r['rank']:>4} {r['window_seconds'] or 0.0:>9.3f} {r['requests']:>8} "
                     f"{r['storage_read_gibps'] or 0.0:>10.3f} {r['storage_write_gibps'] or 0.0:>11.3f} "
                     f"{r['e2e_p95_ms'] or 0.0:>10.2f} {integ.upper():>12}  {r.get('host') or '-'}: {r['file']}")
    for x in doc.get("ranks_not_to_average") or []:  # whether each rank counts (rank_status), said with the table
        lines.append(f"  not to average: rank {x['rank']} {x['status']}: {x['reason']}")
    return "\n".join(lines) + "\n"
