"""How one run's settings divide across its ranks (`--processes N`, or N ranks under mpirun).

Every run setting declares a rule on its dataclass field (fields.py `setting`): SPLIT settings are totals
that the ranks share (users, request rate, the tiers' capacities, max-requests, the precondition volume,
RAG documents), OFFSET settings are bases each rank adds its rank to (the seed), and everything else is
copied. `rank_share` is the one function that applies the rules, so N ranks given the flags of one
process offer the same total load as that one process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any

from kv_cache.errors import UsageError
from kv_cache.settings.fields import OFFSET, SPLIT, FrozenMap, split_rule
from kv_cache.settings.run import SECTIONS, RemoteTierSettings, RunSettings

__all__ = ["rank_share", "rules", "setting_value", "share_errors", "split_value", "split_values", "totals"]

REMOTE = "tiers.remote"  # the section of the storage backends' own options (RemoteTierSettings.options)
_FLAGS = {"num_users": "--num-users", "max_requests": "--max-requests", "rag_num_docs": "--rag-num-docs"}


def rules() -> dict[str, tuple[str | None, str]]:
    """Flat setting name -> (its sub-config, or None for a top-level field; its rule), for every setting."""
    out: dict[str, tuple[str | None, str]] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            out.setdefault(f.name, (section, split_rule(f)))
    for f in fields(RunSettings):
        if f.name not in SECTIONS:
            out.setdefault(f.name, (None, split_rule(f)))
    for name, rule in RemoteTierSettings.option_rules.items():
        out.setdefault(name, (REMOTE, rule))
    return out


def split_value(total: Any, rank: int, n: int) -> Any:
    """Rank `rank`'s share of `total` among `n` ranks: integers divide with the remainder going to the
    first ranks; floats divide evenly, the last rank taking what rounding left, so the shares sum to the
    total."""
    if isinstance(total, bool) or total is None:
        return total
    if isinstance(total, int):
        return total // n + (1 if rank < total % n else 0)
    share = total / n
    return total - share * (n - 1) if rank == n - 1 else share


def split_values(total: Any, n: int) -> list[Any]:
    """Every rank's share of `total`, in rank order."""
    return [split_value(total, r, n) for r in range(n)]


def _read(settings: RunSettings, section: str | None, name: str) -> Any:
    owner: Any = settings
    for part in section.split(".") if section else ():
        owner = getattr(owner, part)
    return getattr(owner, name)


def setting_value(settings: RunSettings, name: str) -> Any:
    """The value of the setting of flat name `name` (`num_users`, `seed`...), read through its section."""
    section, _ = rules()[name]
    return _read(settings, section, name)


def totals(settings: RunSettings) -> dict[str, Any]:
    """The SPLIT and OFFSET settings of `settings`, by flat name (what a share is taken of)."""
    out = {}
    for name, (section, rule) in rules().items():
        if rule in (SPLIT, OFFSET):
            out[name] = settings.effective_seed if name == "seed" else _read(settings, section, name)
    return out


def share_errors(settings: RunSettings, n: int) -> list[str]:
    """Totals too small to give each of `n` ranks a share (a zero share would mean something else)."""
    errors = []
    per = {"num_users": settings.workload.num_users, "max_requests": settings.driver.max_requests}
    if settings.workload.enable_rag:
        per["rag_num_docs"] = settings.workload.rag_num_docs
    for name, total in per.items():
        if (name != "num_users" and total == 0) or total >= n:
            continue
        errors.append(f"{_FLAGS[name]} {total} is a total divided between {n} ranks; give at least {n}")
    return errors


def rank_share(settings: RunSettings, rank: int, n: int, host_ranks: int = 1) -> RunSettings:
    """The settings of rank `rank` of `n`, from the settings given as totals: each SPLIT setting divided
    (`split_value`), each OFFSET setting plus `rank`, the rest as given; the totals are kept in
    `rank_totals`. `host_ranks`: how many of the ranks share this host's memory. Raises UsageError when a
    total is too small to divide (see `share_errors`)."""
    errors = share_errors(settings, n)
    if errors:
        raise UsageError("; ".join(errors))
    given = totals(settings)
    changes: dict[str | None, dict[str, Any]] = {}
    for name, (section, rule) in rules().items():
        if rule == SPLIT:
            changes.setdefault(section, {})[name] = split_value(given[name], rank, n)
        elif rule == OFFSET:
            changes.setdefault(section, {})[name] = given[name] + rank
    changes.setdefault("tiers", {})["host_ranks"] = max(1, host_ranks)
    own = changes.pop(REMOTE, None)
    if own:  # a backend's own options: its share in tiers.remote.options
        remote = settings.tiers.remote
        changes["tiers"]["remote"] = dataclasses.replace(remote, options=FrozenMap({**remote.options, **own}))
    top = changes.pop(None, {})
    parts = {section: dataclasses.replace(getattr(settings, section), **values) for section, values in changes.items()}
    return dataclasses.replace(settings, **top, **parts, mpi_rank=rank, mpi_world_size=n,
                               rank_totals=FrozenMap(given))
