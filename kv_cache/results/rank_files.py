"""The rank files of one run: finding them (the harness layout, `*_rank<r>.json`), reading them as rank
documents, and checking that they are one run's, complete, before a merge adds anything up (MergeError,
one line, naming the files)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import Any

from kv_cache.errors import DocumentError
from kv_cache.results.documents import RunDocument, load

__all__ = ["MergeError", "check_one_run", "find_rank_files", "load_documents", "rank_doc", "rank_of"]

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
    not_mergeable = [str(d.source) for d in docs if not d.mergeable]
    if not_mergeable:
        raise MergeError(f"{', '.join(not_mergeable)}: no `recorder` block (written by a kv-cache older than the "
                         "merge of recorders): re-run with this kv-cache to merge")
    return missing
