"""`kv-cache catalogue [SECTION ...] [--json] [--config FILE]`: what the registries hold, read from them.

Storage backends (name, tier, summary; with --json their capabilities and the settings they read), trace
formats (name, summary, block size, sessions), GPU specs (key, name, datasheet figures; a --config file's
`gpus:` overlay included, as a run reads the table), output metrics (key, unit, summary, merge rule) and
load shapes (name, summary, whether --autoscaler-mode offers it). Nothing here lists an entry: a module
added to a registry shows up on its own. One line per entry in the text form, so `| grep` finds a name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

SCHEMA = "kv-cache-catalogue/1"


def _backends(config: str | None) -> list[dict[str, Any]]:
    from kv_cache.storage import backends  # noqa: PLC0415  (loads every backend module: not for --help)

    return [{"name": b.name, "tier": b.tier.value if b.tier is not None else "any", "summary": b.summary,
             "capabilities": dataclasses.asdict(b.capabilities),
             "options": [{"name": o.name, "help": o.help} for o in b.options]} for b in backends.all_backends()]


def _traces(config: str | None) -> list[dict[str, Any]]:
    from kv_cache.workload.traces import formats  # noqa: PLC0415

    return [{"name": f.name, "summary": f.summary, "block_tokens": f.block_tokens, "sessions": f.sessions,
             "directory": f.directory, "options": list(f.options)} for f in formats.all_formats()]


def _gpus(config: str | None) -> list[dict[str, Any]]:
    from kv_cache.settings.loader import load_config  # noqa: PLC0415

    return [{"key": key, **dataclasses.asdict(spec)} for key, spec in load_config(config).gpus.items()]


def _metrics(config: str | None) -> list[dict[str, Any]]:
    from kv_cache.metrics import catalogue  # noqa: PLC0415

    return [{"key": m.key, "unit": m.unit, "label": m.label, "summary": m.summary, "merge": m.merge}
            for m in catalogue.all_metrics()]


def _shapes(config: str | None) -> list[dict[str, Any]]:
    from kv_cache.core import shapes  # noqa: PLC0415

    return [{"name": s.name, "summary": s.summary, "autoscaling": s.autoscaling, "options": list(s.options)}
            for s in shapes.all_shapes()]


def _yes(flag: bool, word: str) -> str:
    return word if flag else ""


def _gpu_line(g: dict[str, Any]) -> list[str]:
    link = f"{g['host_link']} {g['host_link_gbs']:g} GB/s each way" if g["host_link_gbs"] else "host link unknown"
    return [g["key"], g["name"], f"{g['hbm_gb']:g} GiB, {g['hbm_bandwidth_gbs']:g} GB/s, "
            f"{g['peak_dense_tflops']:g} TFLOPS dense, {link}"]


@dataclasses.dataclass(frozen=True)
class Section:
    """One registry: its JSON key, title, entries and each entry's text columns."""

    key: str
    title: str
    entries: Callable[[str | None], list[dict[str, Any]]]
    columns: Callable[[dict[str, Any]], list[str]]


SECTIONS: dict[str, Section] = {s.key: s for s in (
    Section("storage_backends", "Storage backends (chosen per tier by the flags)", _backends,
            lambda b: [b["name"], b["tier"], b["summary"]]),
    Section("trace_formats", "Trace formats (--trace-format; auto detects them)", _traces,
            lambda f: [f["name"], f["summary"], ", ".join(w for w in (
                _yes(f["sessions"], "sessions"), _yes(f["directory"], "directories"),
                f"hash ids of {f['block_tokens']} tokens" if f["block_tokens"] else "") if w)]),
    Section("gpus", "GPU specs (--gpu-type, sessions --gpu)", _gpus, _gpu_line),
    Section("metrics", "Output metrics (summary.metrics of the results)", _metrics,
            lambda m: [m["key"], m["unit"] or "-", m["summary"]]),
    Section("load_shapes", "Load shapes", _shapes,
            lambda s: [s["name"], s["summary"], _yes(s["autoscaling"], "--autoscaler-mode")]),
)}
ALIASES = {"backends": "storage_backends", "traces": "trace_formats", "gpus": "gpus", "metrics": "metrics",
           "shapes": "load_shapes"}


def add_catalogue_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("sections", metavar="SECTION", nargs="*", default=[],
                   help=f"Only these registries, of {', '.join(ALIASES)} (default: all).")
    p.add_argument("--json", action="store_true", help="Print one JSON document instead of the text.")
    p.add_argument("--config", default=None, help="A YAML config whose gpus: section overlays the GPU table.")


def catalogue(sections: list[str], config: str | None = None) -> dict[str, Any]:
    """The registries' entries, by section key, in the order of SECTIONS (all of them when `sections` is
    empty); UsageError for a section name it does not know."""
    from kv_cache import __version__  # noqa: PLC0415
    from kv_cache.errors import UsageError  # noqa: PLC0415

    unknown = [s for s in sections if s not in ALIASES and s not in SECTIONS]  # (a JSON key names its section)
    if unknown:
        raise UsageError(f"unknown section {unknown[0]!r} (choose from {', '.join(ALIASES)})")
    wanted = {ALIASES.get(s, s) for s in sections} or set(SECTIONS)
    doc: dict[str, Any] = {"schema_version": SCHEMA, "version": __version__}
    for key, section in SECTIONS.items():
        if key in wanted:
            doc[key] = section.entries(config)
    return doc


def format_text(doc: dict[str, Any]) -> list[str]:
    """One block per section: its title, then one line per entry, its columns aligned."""
    lines: list[str] = []
    for key, section in SECTIONS.items():
        if key not in doc:
            continue
        rows = [section.columns(e) for e in doc[key]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)] if rows else []
        if lines:
            lines.append("")
        lines.append(f"{section.title}: {len(rows)}")
        lines += ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip() for r in rows]
    return lines


def catalogue_command(args: argparse.Namespace, argv: list[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    doc = catalogue(args.sections, args.config)
    if args.json:
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write("\n".join(format_text(doc)) + "\n")
    return 0
