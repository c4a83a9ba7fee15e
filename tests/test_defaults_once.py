"""Each default is written once: on its setting's field. The parsers, the partial-namespace defaults of
the validation, the resolved settings of both commands and the config file's storage section all agree
with it, and the sessions tree (SessionsSettings > LadderSettings > StorageSettings) repeats none."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from kv_cache.cli import build_parser, parse_sessions_settings, parse_settings
from kv_cache.cli.sessions import SessionsFlags, SessionsSettings
from kv_cache.settings import validation
from kv_cache.settings.fields import field_default, flag_defaults, flags_of
from kv_cache.settings.run import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    GENERATION_MODES,
    RUN_FLAG_TREE,
    StorageSettings,
    TierSettings,
)
from kv_cache.settings.schema import GenerationTiming, StorageConfig
from kv_cache.specs.models import GPU_SPECS

SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "config.yaml"
TIMESTAMPED = "output"  # its parser default is the setting's with the start time in the name

# The sessions tree below SessionsSettings (found through the annotations, wherever the module lives).
LADDER_SETTINGS = typing.get_type_hints(SessionsSettings)["ladder_settings"]


def _stem(name: str) -> str:
    return name.rpartition(".")[0] + "_"


@pytest.mark.parametrize(("command", "tree"), [("run", RUN_FLAG_TREE), ("sessions", (SessionsFlags,))])
def test_every_parser_default_is_its_fields(command, tree):
    parsed = vars(build_parser(command).parse_args([]))
    flags = list(flags_of(tree))
    assert len({flag.dest for flag, _ in flags}) == len(flags)  # no flag declared twice in a tree
    for flag, default in flags:
        if flag.dest == TIMESTAMPED:
            assert parsed[flag.dest].startswith(_stem(default)), command
        else:
            assert parsed[flag.dest] == flag.default_for(default), (command, flag.name)


def test_validation_defaults_are_the_parsers():
    parsed = vars(build_parser("run").parse_args([]))
    for dest, default in flag_defaults(RUN_FLAG_TREE).items():
        assert validation._DEFAULTS[dest] == default, dest
        if dest != TIMESTAMPED:
            assert parsed[dest] == default, dest


def test_storage_settings_default_to_the_config_storage_section():
    yaml, tree = StorageConfig(), StorageSettings()
    assert tree.chunk_bytes == yaml.chunk_size_mb << 20
    for name in ("io_workers", "io_mode", "fsync", "io_retries", "max_storage_errors"):
        assert getattr(tree, name) == getattr(yaml, name), name
    # The shipped config.yaml with no flag resolves to exactly the tree's defaults.
    assert parse_settings(["--config", str(SHIPPED_CONFIG)]).storage == StorageSettings()


def test_generation_modes_are_the_config_generation_timing_keys():
    assert GENERATION_MODES == tuple(f.name for f in dataclasses.fields(GenerationTiming))


def test_the_default_model_and_gpu_are_one_constant_for_both_commands():
    run, sessions = vars(build_parser("run").parse_args([])), vars(build_parser("sessions").parse_args([]))
    assert run["model"] == sessions["model"] == DEFAULT_MODEL
    assert run["gpu_type"] == sessions["gpu"] == DEFAULT_GPU
    assert TierSettings().gpu_spec == GPU_SPECS[DEFAULT_GPU]


def test_the_sessions_tree_writes_no_default_and_repeats_no_field():
    for cls in (SessionsSettings, LADDER_SETTINGS):
        with_default = [f.name for f in dataclasses.fields(cls)
                        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
        assert with_default == [], cls.__name__
    outer = {f.name for f in dataclasses.fields(SessionsSettings)}
    inner = {f.name for f in dataclasses.fields(LADDER_SETTINGS)}
    storage = {f.name for f in dataclasses.fields(StorageSettings)}
    assert not outer & inner and not inner & storage and not outer & storage


def test_resolved_sessions_defaults_come_from_the_flags_and_the_config():
    s = parse_sessions_settings([])
    ls, flags, yaml = s.ladder_settings, SessionsFlags(), StorageConfig()
    assert (s.replications, s.slo_ttft_p90_s, s.output.startswith(_stem(flags.output))) == (
        1 if flags.replications is None else flags.replications, flags.slo_ttft_p90, True)  # None: 3 with an SLO
    assert (ls.load_policy, ls.steady_state, ls.seed, ls.window_s) == (
        flags.load_policy, flags.steady_state, flags.seed, flags.window)
    assert ls.storage == StorageSettings(
        chunk_bytes=yaml.chunk_size_mb << 20, io_workers=flags.io_workers, io_mode=yaml.io_mode, fsync=yaml.fsync,
        io_retries=yaml.io_retries, max_storage_errors=yaml.max_storage_errors, verify=flags.verify)
    # The only storage default of its own the sessions command writes: --io-workers (at least one).
    own = {f.name: field_default(f) for f in dataclasses.fields(SessionsFlags)}
    assert own["io_workers"] >= 1 and StorageSettings().io_workers == 0
