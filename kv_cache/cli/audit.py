"""`kv-cache audit PATH...`: the integrity verdict (ok / suspect / invalid) of results, with reasons and numbers.

PATH is a results file of ours (run or merged), a rank file of the MLPerf tool (kv-cache.py's
`kvcache_results_*.json`), or a directory, searched at any depth for both (the mlpstorage harness's
`option_<O>/trial_<T>/rank_<N>/` layout included). For the MLPerf tool's files the run's `*_metadata.json`
(in a directory above the file) gives LD_PRELOAD and `--num-users`, and `.fs_probe/*__rank<N>__<host>.ok`
the host of each rank. The checks are results/integrity.py's. Exit status 0 when no file is invalid, 1 when
one is; 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from kv_cache.errors import DocumentError, UsageError
from kv_cache.host.files import is_atomic_temp
from kv_cache.results import integrity as integ
from kv_cache.results.documents import load
from kv_cache.results.mlperf_tool import is_mlperf_tool_file
from kv_cache.results.partial import not_finished

__all__ = ["add_audit_flags", "audit_command", "audit_path"]

_RANK_DIR = re.compile(r"^rank_?(\d+)$")
_OPT_TRIAL = re.compile(r"option_(\d+)/trial_(\d+)")


def add_audit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a kv-cache result, a rank file of the MLPerf tool, or a run directory (searched at any depth)")
    p.add_argument("--ceiling-gbs", type=float, default=integ.DEFAULT_CEILING / 1e9, metavar="GB/s",
                   help="fastest a single operation can move bytes; a device time implying more is impossible "
                        "(default 128: twice a PCIe Gen5 x16 link)")
    p.add_argument("--device-limit-gbs", type=float, default=None, metavar="GB/s",
                   help="the storage device's (or its link's) rated bandwidth, decimal GB/s: a storage bandwidth "
                        "above it is invalid, with the excess stated (default: a run's own measurement.device_limit)")
    p.add_argument("--devices", default=None, metavar="YAML",
                   help="a host's drives and links (host/devices.py): the limit of the host each result names")
    p.add_argument("--json", action="store_true", help="print one JSON object (per-file integrity blocks, overall "
                                                       "verdict) instead of the text")


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise DocumentError(f"{path}: cannot read it as JSON ({exc})") from None


def _is_mlperf_rank(raw: Any) -> bool:
    """The one recogniser of the MLPerf tool's rank files (results/mlperf_tool.py), so a file that report and
    merge read (one with no `summary`: no request completed) is audited too, not skipped as foreign."""
    return is_mlperf_tool_file(raw)


def _metadata_above(path: Path) -> tuple[Path, dict[str, Any]] | None:
    for folder in path.parents:
        found = sorted(folder.glob("*_metadata.json"))
        if found:
            data = _read_json(found[0])
            if isinstance(data, dict):
                return folder, data
    return None


def _rank_of(path: Path) -> int | None:
    for part in reversed(path.parent.parts):
        m = _RANK_DIR.match(part)
        if m:
            return int(m.group(1))
    return None


def _host_of(run_dir: Path, rank: int | None) -> str | None:
    if rank is None:
        return None
    for probe in (run_dir / ".fs_probe").glob(f"*__rank{rank}__*"):
        return probe.name.split("__", 2)[2].removesuffix(".ok")
    return None


def mlperf_params(path: Path) -> dict[str, Any]:
    """The run's recorded parameters for one MLPerf-tool rank file: LD_PRELOAD, --num-users, host."""
    found = _metadata_above(path)
    if found is None:
        return {}
    run_dir, meta = found
    m = _OPT_TRIAL.search(path.as_posix())
    params = integ.mlperf_run_params(meta, *(int(g) for g in m.groups())) if m else integ.mlperf_run_params(meta)
    host = _host_of(run_dir, _rank_of(path))
    return {**params, **({"host": host} if host else {})}


def audit_file(path: Path, ceiling: float, limit: tuple[float, str] | None = None) -> dict[str, Any] | None:
    """The integrity block of one file (None: neither tool's results). `limit`: (GB/s, its source)."""
    raw = _read_json(path)
    if _is_mlperf_rank(raw):
        params = mlperf_params(path)
        facts = integ.facts_from_mlperf_tool(raw, params, _limit_for(limit, params.get("host")))
        return integ.audit_facts(_with_write_limit(facts, limit, params.get("host")), ceiling)
    if isinstance(raw, dict) and "schema_version" in raw:
        typed = load(raw)
        if typed.kind == "mlperf-harness-summary":
            raise DocumentError(f"{path}: the harness's summary.json holds sums, not the rank files' figures: "
                                "audit its run directory")
        doc = typed.to_json()
        if typed.kind == "sessions" and isinstance(doc.get("integrity"), dict) and "checks" in doc["integrity"]:
            # the interposer check (it keeps no per-run device counters), recomputed from the libraries its block
            # records, never its stored verdict
            return _sessions_recomputed(doc["integrity"])
        if not typed.has_figures:
            raise DocumentError(f"{path}: a {typed.kind} document holds no per-run storage figures to audit "
                                "(audit a run's or a merge's results)")
        host = (doc.get("run_parameters") or {}).get("host")
        document = not_finished(doc)
        block = integ.audit_facts(_with_write_limit(integ.facts_from_ours(doc, _limit_for(limit, host)), limit, host),
                                  ceiling)
        carried = doc.get("integrity") if isinstance(doc.get("integrity"), dict) else {}
        if block.get("source") == "kv-cache merge":
            # its ranks' checks (interposers, page cache) count too: recomputed from the rank files where they
            # are still beside it, the merge's recorded rank verdicts only where they are not
            stored = carried.get("per_rank") if isinstance(carried.get("per_rank"), dict) else {}
            per_rank = {int(r): v for r, v in stored.items() if str(r).isdigit()}
            for r, fresh in _ranks_recomputed(path, doc, ceiling, limit).items():
                # the worse of the two: a recorded verdict can only add a doubt the rank file no longer shows
                old = per_rank.get(r) if isinstance(per_rank.get(r), dict) else {}
                if integ.worst_verdict([fresh["verdict"], old.get("verdict", integ.OK)]) != fresh["verdict"]:
                    fresh = {**fresh, "verdict": old["verdict"],
                             "reasons": list(fresh.get("reasons") or []) + list(old.get("reasons") or [])}
                per_rank[r] = fresh
            if not per_rank:
                block = {**block, "verdict": integ.worst_verdict([block["verdict"], integ.UNVERIFIABLE]),
                         "reasons": list(block.get("reasons") or []) + [
                             "per_rank: no rank's verdict recorded and no rank file found (merged_from): the "
                             "ranks' interposer and page-cache checks are unknown"]}
            block = integ.merged_integrity(per_rank, block)
        return {**block, "document": document} if document else block
    return None


def _sessions_recomputed(carried: dict[str, Any]) -> dict[str, Any]:
    """A sessions document's integrity block from the mapped libraries its interposer check recorded."""
    checks = carried.get("checks") if isinstance(carried.get("checks"), list) else []
    nums = next((c.get("numbers") for c in checks if isinstance(c, dict) and c.get("check") == "interposers"
                 and isinstance(c.get("numbers"), dict)), None)
    if not nums or "mapped_libraries_checked" not in nums:
        return {"verdict": integ.UNVERIFIABLE, "source": "kv-cache sessions", "checks": checks,
                "reasons": ["interposers: the block records no mapped libraries to judge"]}
    libs = {"ld_preload": [p for p in nums.get("ld_preload") or [] if isinstance(p, str)],
            "interposers": [i for i in nums.get("interposers") or [] if isinstance(i, dict) and "path" in i],
            "recorded": bool(nums.get("mapped_libraries_checked"))}
    return integ.sessions_integrity(libs)


def _ranks_recomputed(path: Path, doc: dict[str, Any], ceiling: float,
                      limit: tuple[float, str] | None) -> dict[int, dict[str, Any]]:
    """The integrity block of each rank file a merge names (merged_from) that is still there (as written, or
    beside the merge), audited afresh; keyed by its rank (its run_parameters.mpi_rank, else its position)."""
    out: dict[int, dict[str, Any]] = {}
    names = doc.get("merged_from") if isinstance(doc.get("merged_from"), list) else []
    for i, name in enumerate(n for n in names if isinstance(n, str)):
        for cand in (Path(name), path.parent / Path(name).name):
            if cand.is_file() and cand.resolve() != path.resolve():
                try:
                    raw = _read_json(cand)
                    block = audit_file(cand, ceiling, limit)
                except (DocumentError, OSError, ValueError):
                    break
                if block is None:
                    break
                rank = (raw.get("run_parameters") or {}).get("mpi_rank") if isinstance(raw, dict) else None
                out[rank if isinstance(rank, int) and not isinstance(rank, bool) else i] = block
                break
    return out


_DEVICES: dict[str, Any] = {}


def _limit_for(limit: tuple[float, str] | None, host: str | None, op: str = "read") -> tuple[float, str] | None:
    """--device-limit-gbs, else the --devices YAML's `op` limit for `host` (its only host when it names one)."""
    if limit is not None:
        return limit
    table = _DEVICES.get("table")
    if table is None:
        return None
    from kv_cache.host.devices import limit_of_host
    return limit_of_host(table, host, op)


def _with_write_limit(facts: integ.IntegrityFacts, limit: tuple[float, str] | None,
                      host: str | None) -> integ.IntegrityFacts:
    """The facts with the host YAML's write limit (a drive rates its writes apart from its reads); one
    --device-limit-gbs figure bounds both directions."""
    write = _limit_for(limit, host, "write") if limit is None else None
    if write is None:
        return facts
    return dataclasses.replace(facts, device_write_limit_gbs=write[0],
                               device_limit_source=facts.device_limit_source or write[1])


def audit_path(path: str, ceiling: float = integ.DEFAULT_CEILING, limit: tuple[float, str] | None = None,
               skipped: list[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(file, integrity block) for PATH: the file itself, or every result under a directory. In a directory
    the temporary file of a write that was killed before its rename (host/files.py is_atomic_temp: a run's
    SIGKILL while it rewrote its periodic document or wrote its final one) is no result: it is left out,
    and named in `skipped` (a list the caller gives)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file or directory")
    if p.is_file():
        block = audit_file(p, ceiling, limit)
        if block is None:
            raise DocumentError(f"{path}: neither a kv-cache result nor a rank file of the MLPerf tool")
        return [(str(p), block)]
    rows = []
    for f in sorted(p.rglob("*.json"), key=lambda x: x.as_posix()):
        if f.name.endswith("_metadata.json") or f.name.endswith("cluster_info.json"):
            continue
        if is_atomic_temp(f.name):
            if skipped is not None:
                skipped.append(str(f.relative_to(p)))
            continue
        try:
            block = audit_file(f, ceiling, limit)
        except DocumentError:
            continue
        if block is not None:
            rows.append((str(f.relative_to(p)), block))
    if not rows:
        raise DocumentError(f"{path}: no kv-cache result and no MLPerf-tool rank file in it")
    return rows


def _text(rows: list[tuple[str, dict[str, Any]]], overall: str, out: TextIO) -> None:
    for name, block in rows:
        corr, rep = block.get("corrected_read_gib_per_s"), block.get("reported_read_gib_per_s")
        bw = f"; read {rep:.2f} GiB/s reported, at most {corr:.2f} corrected" if corr is not None and rep else ""
        host = next((c["numbers"].get("host") for c in block["checks"] if c["check"] == "io_setup"), None)
        where = f", host {host}" if host else ""
        out.write(f"{name}: {block['verdict'].upper()} ({block['source']}{where}){bw}\n")
        if block.get("document"):
            out.write(f"  [incomplete] document: {block['document']}\n")
        for c in block["checks"]:
            out.write(f"  [{c['status']}] {c['check']}: {c['reason']}\n")
            if c["check"] == "page_cache" and "counted_read_bytes" in c["numbers"]:
                out.write("      " + _side_by_side(c["numbers"]) + "\n")
        for rank, v in (block.get("per_rank") or {}).items():
            out.write(f"  rank {rank}: {v['verdict']}" + "".join(f"; {r}" for r in v["reasons"]) + "\n")
    kinds = (integ.OK, integ.SUSPECT, integ.UNVERIFIABLE, integ.INVALID)
    counts = {v: sum(1 for _, b in rows if b["verdict"] == v) for v in kinds}
    out.write(f"Overall: {overall.upper()} ({len(rows)} file(s): "
              + ", ".join(f"{counts[k]} {k}" for k in kinds) + ")\n")


def _side_by_side(n: dict[str, Any]) -> str:
    """The page-cache check's three figures: counted, process, device (GiB read / written), and its source."""
    def gib(v: Any) -> str:
        return f"{v / 2**30:.3f}" if isinstance(v, (int, float)) else "-"
    return (f"read GiB: counted {gib(n.get('counted_read_bytes'))}, process {gib(n.get('process_read_bytes'))}, "
            f"device {gib(n.get('device_read_bytes'))}; written GiB: counted {gib(n.get('counted_write_bytes'))}, "
            f"process {gib(n.get('process_write_bytes'))}, device {gib(n.get('device_write_bytes'))}; "
            f"source: {n.get('source')}" + (f"; other I/O on the device {gib(n['other_io_bytes'])} GiB"
                                            if n.get("other_io_bytes") is not None else ""))


def audit_command(args: argparse.Namespace, argv: list[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.ceiling_gbs <= 0:
        raise UsageError(f"--ceiling-gbs {args.ceiling_gbs:g}: give a positive rate in GB/s, e.g. 128")
    limit = None
    if args.device_limit_gbs is not None:
        if args.device_limit_gbs <= 0:
            raise UsageError(f"--device-limit-gbs {args.device_limit_gbs:g}: give a positive rate in GB/s, e.g. 14.5")
        limit = (args.device_limit_gbs, f"--device-limit-gbs {args.device_limit_gbs:g}")
    _DEVICES.clear()
    if args.devices:
        from kv_cache.host.devices import load_devices
        _DEVICES["table"] = load_devices(args.devices)
    skipped: list[str] = []
    rows = [row for path in args.paths for row in audit_path(path, args.ceiling_gbs * 1e9, limit, skipped)]
    overall = integ.worst_verdict([b["verdict"] for _, b in rows])
    if args.json:
        out.write(json.dumps({"verdict": overall, "files": {n: b for n, b in rows},
                              **({"skipped_temporary_files": skipped} if skipped else {})}, indent=2) + "\n")
    else:
        _text(rows, overall, out)
        for name in skipped:
            out.write(f"skipped {name}: the temporary file of a write killed before its rename (not a result)\n")
    return 1 if overall == integ.INVALID else 0
