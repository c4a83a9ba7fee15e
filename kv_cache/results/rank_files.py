"""The rank files of one run: finding them (the harness layout, `*_rank<r>.json`), reading them as rank
documents, and checking that they are one run's, complete, before a merge adds anything up (MergeError,
one line, naming the files)."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from kv_cache.errors import DocumentError
from kv_cache.results.documents import RunDocument, load

__all__ = ["MergeError", "check_one_run", "check_without_run_id", "find_rank_files", "load_documents", "rank_doc", "rank_of"]

_RANK_DIR = re.compile(r"rank_?(\d+)")


class MergeError(DocumentError):
    """Nothing to merge, a file that is not a rank's results document, or ranks that are not one run's."""


def find_rank_files(paths: Sequence[str]) -> list[str]:
    """The per-rank documents named by `paths`: files as given; a directory is searched for the harness
    layout (`rank_<N>/kvcache_results_*.json`, the newest per rank) and for `*_rank<r>.json` files."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            ranks = sorted(glob.glob(os.path.join(path, "rank_*")), key=_rank_key)
            for rank_dir in ranks:
                files = sorted(glob.glob(os.path.join(rank_dir, "kvcache_results_*.json")))
                if files:
                    found.append(files[-1])
            found += sorted(glob.glob(os.path.join(path, "*_rank[0-9]*.json")), key=_rank_key)
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise MergeError(f"{path}: no such file or directory")
    if not found:
        raise MergeError(f"no per-rank results in {', '.join(paths)} (rank_<N>/kvcache_results_*.json or "
                         "*_rank<r>.json)")
    return found


def _rank_key(path: str) -> tuple[int, str]:
    m = _RANK_DIR.findall(os.path.basename(path.rstrip("/")))
    return (int(m[-1]) if m else 1 << 30, path)


def rank_doc(source: str | dict[str, Any]) -> RunDocument:
    try:
        doc = load(source)
    except DocumentError as exc:
        raise MergeError(str(exc)) from None
    name = doc.source or (doc.data.get("_source") if isinstance(source, dict) else None) or "a document"
    if not isinstance(doc, RunDocument):
        raise MergeError(f"{name}: a {doc.kind} document ({doc.schema_version}), not a rank's run results")
    if doc.source is None:
        doc.source = name
    return doc


def load_documents(files: Sequence[str]) -> list[RunDocument]:
    """The rank documents of `files` (MergeError, one line, for one that is not)."""
    return [rank_doc(path) for path in files]


def rank_of(doc: RunDocument, index: int) -> int:
    if doc.rank is not None:
        return doc.rank
    m = _RANK_DIR.findall(str(doc.source or ""))
    return int(m[-1]) if m else index


# run_parameters every rank of one run shares (the seed is offset per rank, the shares may differ by one)
_SHARED = ("command", "config_path", "model", "duration", "mpi_world_size")


def _identity(doc: RunDocument) -> str:
    """What the ranks of one run agree on, when they carry no run id: the shared parameters and the
    totals the run was given (its settings_split, the seed left out), as one comparable string."""
    p = doc.parameters
    totals = dict((p.get("settings_split") or {}).get("totals") or {})
    totals.pop("seed", None)
    return json.dumps({**{k: p.get(k) for k in _SHARED}, "world_size": doc.world_size, "totals": totals},
                      sort_keys=True, default=str)


def check_without_run_id(docs: Sequence[RunDocument]) -> None:
    """Rank files without a run id (written before kv-cache recorded one, or with it stripped) are one
    run's only if they say so otherwise: the same command, model, duration, world size and totals given,
    and measured windows that overlap in time. MergeError naming the files when they do not."""
    groups: dict[str, list[str]] = {}
    for d in docs:
        groups.setdefault(_identity(d), []).append(str(d.source))
    if len(groups) > 1:
        sets = "; ".join(f"{', '.join(files)}" for files in groups.values())
        raise MergeError(f"files without a run id that are not one run's (their command, model, duration, world "
                         f"size or totals differ): {sets}; merge one run's rank files at a time")
    spans = [(d.window.get("start_unix"), d.window.get("end_unix"), str(d.source)) for d in docs]
    spans = [(float(a), float(b), f) for a, b, f in spans if a is not None and b is not None]
    if len(spans) > 1:
        late = max(spans, key=lambda x: x[0])
        early = min(spans, key=lambda x: x[1])
        if late[0] >= early[1]:
            raise MergeError(f"files without a run id whose windows do not overlap, so not one run's: {early[2]} "
                             f"ended (unix {early[1]:.0f}) before {late[2]} began (unix {late[0]:.0f}); merge one "
                             "run's rank files at a time")


def check_one_run(docs: Sequence[RunDocument], allow_missing: bool = False) -> list[int]:
    """Refuse (MergeError) ranks that are not one run's, or one run's with a rank twice or missing; returns
    the missing ranks (empty unless `allow_missing`)."""
    if not docs:
        raise MergeError("no per-rank results to merge")
    ids: dict[str | None, list[RunDocument]] = {}
    for d in docs:
        ids.setdefault(d.run_id, []).append(d)
    if len(ids) > 1:
        runs = "; ".join(f"run {rid or '(no run id)'}: {', '.join(str(d.source) for d in ds)}"
                         for rid, ds in ids.items())
        raise MergeError(f"the files are of {len(ids)} different runs ({runs}); merge one run's rank files at a time")
    legacy = None in ids
    if legacy and len(docs) > 1:
        check_without_run_id(docs)
    ranks: dict[int, list[RunDocument]] = {}
    for i, d in enumerate(docs):
        ranks.setdefault(rank_of(d, i), []).append(d)
    twice = {r: ds for r, ds in ranks.items() if len(ds) > 1}
    if twice:
        why = ("files without a run id (written before kv-cache recorded one) from several runs, which cannot be "
               "told apart; " if legacy else "")
        raise MergeError(f"{why}rank " + "; rank ".join(f"{r} twice: {', '.join(str(d.source) for d in ds)}"
                                                           for r, ds in sorted(twice.items())))
    sizes = {d.world_size for d in docs}
    if len(sizes) > 1:
        raise MergeError(f"the ranks disagree on the run's world size ({', '.join(map(str, sorted(sizes)))})")
    size = max(sizes.pop(), max(ranks) + 1)
    missing = sorted(set(range(size)) - set(ranks))
    if missing and not allow_missing:
        raise MergeError(f"rank(s) {', '.join(map(str, missing))} of {size} missing (run "
                         f"{docs[0].run_id or 'without a run id'}); give every rank's file")
    # a rank stopped before its measured window (interrupted, a storage error while preconditioning) writes
    # its document without a recorder: it measured nothing, and the kv-cache that wrote it is this one
    early = [d for d in docs if not d.mergeable and d.data.get("rank_status")]
    if early:
        raise MergeError("; ".join(f"{d.source}: rank {rank_of(d, 0)} stopped before its measured window "
                                   f"({d.data.get('rank_status')}: {d.data.get('rank_status_reason') or 'no reason given'})"
                                   for d in early)
                         + ": it measured nothing to merge; merge the other ranks' files without it "
                           "(--allow-missing-ranks)")
    not_mergeable = [str(d.source) for d in docs if not d.mergeable]
    if not_mergeable:
        raise MergeError(f"{', '.join(not_mergeable)}: no `recorder` block (written by a kv-cache older than the "
                         "merge of recorders): re-run with this kv-cache to merge")
    return missing
