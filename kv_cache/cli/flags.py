"""The flags of each sub-command, generated from the settings tree: every flag is declared once, on its
setting's dataclass field (`setting(default, flag=Flag(...))` in settings/run.py and settings/sessions.py), with
its name, type, choices, help and default; this module only flattens the tree into argparse calls.
"""

from __future__ import annotations

import argparse
from datetime import datetime

from kv_cache import __version__
from kv_cache.cli.sessions import timestamped
from kv_cache.core import shapes
from kv_cache.settings.fields import flags_of
from kv_cache.settings.run import RUN_FLAG_TREE, RemoteTierSettings
from kv_cache.settings.sessions import SessionsFlags
from kv_cache.specs import gpu_specs
from kv_cache.storage import backends
from kv_cache.workload.traces import formats as trace_formats

__all__ = ["add_run_flags", "add_sessions_flags", "flags_of", "run_flag_defaults", "sessions_flag_defaults"]

RUN_TREE = RUN_FLAG_TREE  # the settings classes whose flagged fields make the `run` command, in --help order
SESSIONS_TREE = (SessionsFlags, RemoteTierSettings)  # `sessions`: its own flags and the remote tiers' (settings)
_TIMESTAMPED = "output"  # the `--output` default gets the start time in its name


def _flags(classes: tuple[type, ...]):
    """flags_of(classes), each storage backend's own options' after RemoteTierSettings' (its registry entry
    declares them, storage/backends `Option`)."""
    for cls in classes:
        yield from flags_of((cls,))
        if cls is RemoteTierSettings:
            yield from backends.option_flags()


def _defaults(classes: tuple[type, ...], now: datetime | None) -> dict[str, object]:
    out = {flag.dest: flag.default_for(default) for flag, default in _flags(classes)}
    out[_TIMESTAMPED] = timestamped(str(out[_TIMESTAMPED]), now or datetime.now())
    return out


def run_flag_defaults(now: datetime | None = None) -> dict[str, object]:
    """Default of every `run` flag (by argparse dest), from the settings' defaults."""
    return _defaults(RUN_TREE, now)


def sessions_flag_defaults(now: datetime | None = None) -> dict[str, object]:
    """Default of every `sessions` flag (by argparse dest), from SessionsFlags."""
    return _defaults(SESSIONS_TREE, now)


def _load_shapes(kw: dict[str, object]) -> dict[str, object]:
    listed = "; ".join(f"{s.name}: {s.summary}" for s in shapes.all_shapes() if s.autoscaling)
    return {**kw, "choices": shapes.autoscaler_modes(), "help": f"{kw.get('help', '')} {listed}.".strip()}


def _trace_formats(kw: dict[str, object]) -> dict[str, object]:
    listed = "; ".join(f"{f.name}: {f.summary}" for f in trace_formats.all_formats())
    return {**kw, "choices": ("auto", *trace_formats.names()), "help": f"{kw.get('help', '')} {listed}.".strip()}


def _gpu_specs(kw: dict[str, object]) -> dict[str, object]:
    """No choices: a config's `gpus:` section may add keys; the help lists the built-in ones."""
    keys = ", ".join(gpu_specs())
    return {**kw, "help": f"{kw.get('help', '')} Built in: {keys}; a config's gpus section may add more.".strip()}


def _storage_backends(kw: dict[str, object]) -> dict[str, object]:
    chosen = backends.storage_choices()
    listed = ", ".join(f"{b.name} ({b.choice})" for b in chosen)
    return {**kw, "choices": tuple(b.name for b in chosen), "help": f"{kw.get('help', '')} {listed}.".strip()}


# Flags whose choices and help come from a registry (Flag.registry): a new entry is listed with no edit here.
_REGISTRIES = {"load_shapes": _load_shapes, "trace_formats": _trace_formats, "gpu_specs": _gpu_specs,
               "storage_backends": _storage_backends}


def _add(p: argparse.ArgumentParser, classes: tuple[type, ...]) -> None:
    """One `add_argument` per flag of `classes`; a flag with a group goes under that --help heading."""
    defaults = _defaults(classes, None)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag, _ in _flags(classes):
        target = p if flag.group is None else groups.get(flag.group)
        if target is None:
            target = groups[flag.group] = p.add_argument_group(flag.group)
        kwargs = flag.argparse_kwargs()
        if flag.registry is not None:
            kwargs = _REGISTRIES[flag.registry](kwargs)
        target.add_argument(flag.name, default=defaults[flag.dest], **kwargs)


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Every MLPerf kv-cache flag with its name, type and choices (drop-in compatible), plus ours."""
    p.add_argument("--version", action="version", version=f"kv-cache {__version__}")
    _add(p, RUN_TREE)


def add_sessions_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `kv-cache sessions`."""
    _add(p, SESSIONS_TREE)
