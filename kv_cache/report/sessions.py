"""`kv-cache sessions` console table: per-GPU throughput and TTFT by configuration and concurrency."""

from __future__ import annotations

from typing import Any, TextIO

__all__ = ["print_table"]


def _fmt_ci(ci: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not ci:
        return "-"
    est, lo, hi = ci["estimate"] * scale, ci.get("low"), ci.get("high")
    if lo is None or hi is None or lo == hi:
        return f"{est:.{digits}f}"
    return f"{est:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


def print_table(results: dict[str, Any], out: TextIO) -> None:
    line = "=" * 118
    out.write(
        f"\n{line}\nSESSIONS HELD - per-GPU throughput and TTFT by configuration and concurrency "
        "(95 % CI in brackets)\n{line}\n".replace("{line}", line)
    )
    out.write(
        f"{'config':<13} {'sessions':>8}  {'tokens/s per GPU':<28} {'turns':>6}  "
        f"{'TTFT p90 return (s)':<26} {'n':>4}  {'TTFT p90 start (s)':<22} {'work':<6}\n"
    )
    for r in results["rungs"]:
        ret, start = r["ttft"]["return"], r["ttft"]["start"]
        out.write(
            f"{r['tiers']:<13} {r['sessions']:>8}  {_fmt_ci(r['throughput_tokens_per_s_per_gpu']):<28} "
            f"{r['completed_turns']:>6}  {_fmt_ci(ret['p90_s'], digits=2):<26} {ret['n']:>4}  "
            f"{_fmt_ci(start['p90_s'], digits=2):<22} {'FLAG' if r['work']['flagged'] else 'ok':<6}\n"
        )
    s = results["summary"]
    out.write("\nEffective capacity (sessions at peak per-GPU throughput):\n")
    for cfg, c in s["configs"].items():
        out.write(
            f"  {cfg:<13} {c['effective_capacity_sessions']:>6} sessions, peak "
            f"{_fmt_ci(c['peak_throughput_tokens_per_s_per_gpu'])} tok/s/GPU\n"
        )
    for r in s["ratios"]:
        out.write(
            f"  {r['config']} vs {r['baseline']}: capacity x{r['effective_capacity_ratio']:.2f}, "
            f"peak throughput x{_fmt_ci(r['peak_throughput_ratio'], digits=2)}\n"
        )
    for r in s.get("ratios_by_rung", []):
        turns = r["completed_turns_ratio"]
        turns_text = f"x{turns:.2f}" if turns is not None else "-"
        out.write(f"  at {r['sessions']:>4} sessions, {r['config']} vs {r['baseline']}: throughput "
                  f"x{_fmt_ci(r['throughput_ratio'], digits=2)}, completed turns {turns_text}\n")
    flagged = [r for r in results["rungs"] if r["work"]["flagged"]]
    for r in flagged:
        out.write(f"  WORK FLAG {r['tiers']} @ {r['sessions']}: {'; '.join(r['work']['flag_reasons'])}\n")
    out.write(f"\nMethod: {results['method']}\n")
