"""Strict loading of config.yaml: a (possibly partial) YAML file merged over the section defaults key by
key; anything unknown or out of range is a one-line ConfigError naming the file and the dotted key."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from kv_cache.errors import ConfigError
from kv_cache.settings.fields import FrozenMap, _Check
from kv_cache.settings.sections import (
    _DEFAULT_QOS_PROFILES,
    _DEFAULT_USER_TEMPLATES,
    BenchConfig,
    _builtin_gpus,
)
from kv_cache.specs.models import ATTENTION_TYPES, DTYPE_BYTES, MODEL_CONFIGS, NEW_MODEL_DEFAULTS, ModelConfig

__all__ = ["config_from_mapping", "load_config"]

_NAMED_SECTIONS = {"user_templates": _DEFAULT_USER_TEMPLATES, "qos_profiles": _DEFAULT_QOS_PROFILES}
_MODEL_FIELD_CHECKS = {
    "name": _Check("str"),
    "num_layers": _Check("int", minimum=1),
    "hidden_dim": _Check("int", minimum=1),
    "num_heads": _Check("int", minimum=1),
    "kv_heads": _Check("int", minimum=1),
    "dtype": _Check("choice", choices=tuple(DTYPE_BYTES)),
    "kv_dim_per_head": _Check("int", minimum=0),
    "attention_type": _Check("choice", choices=ATTENTION_TYPES),
    "kv_lora_rank": _Check("int", minimum=0),
    "qk_rope_head_dim": _Check("int", minimum=0),
    "total_params_b": _Check("float", minimum=0.0),
    "active_params_b": _Check("float", minimum=0.0),
}
_GPU_FIELD_CHECKS = {
    "name": _Check("str"),
    "hbm_gb": _Check("float", minimum=0.0, exclusive_min=True),
    "hbm_bandwidth_gbs": _Check("float", minimum=0.0, exclusive_min=True),
    "peak_dense_tflops": _Check("float", minimum=0.0, exclusive_min=True),
    "source": _Check("str"),
    "host_link": _Check("str"),
    "host_link_gbs": _Check("float", minimum=0.0, exclusive_min=True),
    "host_link_source": _Check("str"),
}
_NEW_GPU_REQUIRED = ("hbm_gb", "hbm_bandwidth_gbs", "peak_dense_tflops")
# (min key, max key) pairs that must be ordered, per section.
_ORDERED_PAIRS = {
    "rag": (
        ("large_model_doc_tokens_min", "large_model_doc_tokens_max"),
        ("small_model_doc_tokens_min", "small_model_doc_tokens_max"),
    ),
    "autoscaler": (("min_users", "max_users"),),
    "sessions": (
        ("new_tokens_median", "new_tokens_mean"),
        ("output_tokens_median", "output_tokens_mean"),
        ("agentic_pause_median_s", "agentic_pause_mean_s"),
        ("human_pause_median_s", "human_pause_mean_s"),
        ("shared_prefix_tokens", "first_turn_tokens_mean"),
        ("first_turn_tokens_mean", "max_context_tokens"),
    ),
}


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str] | None) -> BenchConfig:
    """Built-in defaults (None) or a YAML file merged over them; any problem -> one-line ConfigError."""
    if path is None:
        return BenchConfig()
    source = os.fspath(path)
    return config_from_mapping(_read_yaml(source), source)


def config_from_mapping(data: Any, source: str = "<config>") -> BenchConfig:
    """Validate an already-parsed document (None = empty) and merge it over the defaults."""
    if data is None:
        return BenchConfig()
    if not isinstance(data, Mapping):
        _fail(source, f"the top-level document must be a mapping of sections, got {_type_name(data)}")
    defaults = BenchConfig()
    section_fields = [f.name for f in dataclasses.fields(BenchConfig)]
    updates: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in section_fields:
            _unknown(source, str(key), section_fields)
        if key == "model_configs":
            updates[key] = _build_models(value, source)
        elif key == "gpus":
            updates[key] = _build_gpus(value, source)
        elif key in _NAMED_SECTIONS:
            updates[key] = _build_named(getattr(defaults, key), value, key, source)
        else:
            updates[key] = _build_section(getattr(defaults, key), value, key, source)
    return dataclasses.replace(defaults, **updates)


def _read_yaml(source: str) -> Any:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a hard dependency
        _fail(source, "PyYAML is required to read a config file (pip install pyyaml)")
    try:
        with open(source, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        _fail(source, "config file not found (check the path; without a config file the built-in defaults apply)")
    except IsADirectoryError:
        _fail(source, "is a directory, not a config file (give the path of a YAML file in it)")
    except UnicodeDecodeError:
        _fail(source, "config file is not UTF-8 text")
    except OSError as exc:
        _fail(source, f"cannot read config file: {exc.strerror or exc}")
    try:
        return yaml.load(text, Loader=_strict_loader())
    except yaml.YAMLError as exc:
        _fail(source, f"invalid YAML: {_yaml_message(exc)}")


@functools.cache
def _strict_loader() -> Any:
    """A SafeLoader that also rejects duplicate keys (plain safe_load keeps the last one silently)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        loader.flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: construct_mapping reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def _yaml_message(exc: Exception) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if problem:
        context = getattr(exc, "context", None)
        text = f"{context}, {problem}" if context else problem
    else:
        text = str(exc)
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------------
# Section builders
# --------------------------------------------------------------------------------------------------

T = TypeVar("T")


def _build_section(default: T, data: Any, key: str, source: str) -> T:
    if data is None:  # an empty section (every key commented out) keeps the defaults
        return default
    if not isinstance(data, Mapping):
        _fail(source, f"'{key}' must be a mapping, got {_type_name(data)}")
    fields = {f.name: f for f in dataclasses.fields(default)}
    updates: dict[str, Any] = {}
    for name, value in data.items():
        dotted = f"{key}.{name}"
        if not isinstance(name, str) or name not in fields:
            _unknown(source, dotted, fields)
        updates[name] = _check(fields[name].metadata["check"], value, dotted, source)
    result = dataclasses.replace(default, **updates)
    for low, high in _ORDERED_PAIRS.get(key, ()):
        lo_value, hi_value = getattr(result, low), getattr(result, high)
        if lo_value > hi_value:
            _fail(source, f"'{key}.{low}' ({lo_value}) must be <= '{key}.{high}' ({hi_value})")
    return result


def _build_named(defaults: Mapping[str, Any], data: Any, key: str, source: str) -> FrozenMap:
    if data is None:
        return FrozenMap(defaults)
    if not isinstance(data, Mapping):
        _fail(source, f"'{key}' must be a mapping, got {_type_name(data)}")
    merged = dict(defaults)
    for name, value in data.items():
        if not isinstance(name, str) or name not in defaults:
            _unknown(source, f"{key}.{name}", defaults)
        merged[name] = _build_section(defaults[name], value, f"{key}.{name}", source)
    return FrozenMap(merged)


def _named_entries(data: Any, source: str, section: str, what: str, builtins: Mapping[str, Any],
                   new_defaults: Mapping[str, Any], checks: Mapping[str, _Check]) -> Iterator[tuple[str, str, dict]]:
    """(name, dotted key, checked field values) of each entry of a named section (`model_configs`, `gpus`):
    a built-in entry's fields overlaid with the YAML ones, a new entry's defaults with them."""
    if data is None:
        return
    if not isinstance(data, Mapping):
        _fail(source, f"'{section}' must be a mapping, got {_type_name(data)}")
    for name, entry in data.items():
        if not isinstance(name, str) or not name.strip():
            _fail(source, f"'{section}' keys must be non-empty {what} names, got {_show(name)}")
        dotted = f"{section}.{name}"
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            _fail(source, f"'{dotted}' must be a mapping, got {_type_name(entry)}")
        base = builtins.get(name)
        values = dataclasses.asdict(base) if base is not None else {"name": name, **new_defaults}
        for field_name, value in entry.items():
            if not isinstance(field_name, str) or field_name not in checks:
                _unknown(source, f"{dotted}.{field_name}", checks)
            values[field_name] = _check(checks[field_name], value, f"{dotted}.{field_name}", source)
        yield name, dotted, values


def _build_models(data: Any, source: str) -> FrozenMap:
    """Built-in models merged with the YAML ones, field by field."""
    models = dict(MODEL_CONFIGS)
    for name, dotted, values in _named_entries(data, source, "model_configs", "model", models,
                                               NEW_MODEL_DEFAULTS, _MODEL_FIELD_CHECKS):
        model = ModelConfig(**values)
        if 0 < model.total_params_b < model.active_params_b:
            _fail(
                source,
                f"'{dotted}.active_params_b' ({_fmt(model.active_params_b)}) must be <= "
                f"'{dotted}.total_params_b' ({_fmt(model.total_params_b)})",
            )
        if model.bytes_per_token <= 0:
            if model.attention_type == "mla":
                why = "attention_type 'mla' needs kv_lora_rank + qk_rope_head_dim > 0"
            else:
                why = "head_dim (hidden_dim // num_heads) is 0; set kv_dim_per_head"
            _fail(source, f"'{dotted}' gives 0 bytes per token: {why}")
        models[name] = model
    return FrozenMap(models)


def _build_gpus(data: Any, source: str) -> FrozenMap:
    """Built-in GPUs merged with the YAML ones, field by field; a new GPU must give its three numbers."""
    from kv_cache.specs.models import GPUSpec

    gpus = dict(_builtin_gpus())
    for name, dotted, values in _named_entries(data, source, "gpus", "GPU", gpus, {"source": ""},
                                               _GPU_FIELD_CHECKS):
        missing = [k for k in _NEW_GPU_REQUIRED if k not in values]
        if missing:
            _fail(source, f"'{dotted}' is a new GPU and needs {', '.join(missing)}")
        gpus[name] = GPUSpec(**values)
    return FrozenMap(gpus)


# --------------------------------------------------------------------------------------------------
# Leaf checks
# --------------------------------------------------------------------------------------------------


def _check(check: _Check, value: Any, key: str, source: str) -> Any:
    kind = check.kind
    if kind == "int":
        return _check_int(check, value, key, source)
    if kind in ("float", "prob"):
        return _check_float(check, value, key, source)
    if kind in ("range_int", "range_float"):
        return _check_range(check, value, key, source)
    if kind == "choice":
        if not isinstance(value, str) or value not in check.choices:
            _fail(source, f"'{key}' must be one of {', '.join(check.choices)}; got {_show(value)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            _fail(source, f"'{key}' must be true or false, got {_type_name(value)} ({_show(value)})")
        return value
    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            _fail(source, f"'{key}' must be a non-empty string, got {_type_name(value)} ({_show(value)})")
        return value
    raise AssertionError(f"unknown check kind {kind}")  # pragma: no cover


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float))) and not isinstance(value, bool)


def _check_int(check: _Check, value: Any, key: str, source: str) -> int:
    if not _is_int(value):
        _fail(source, f"'{key}' must be an integer, got {_type_name(value)} ({_show(value)})")
    if check.minimum is not None and value < check.minimum:
        _fail(source, f"'{key}' must be >= {_fmt(check.minimum)}, got {value}")
    return int(value)


def _check_float(check: _Check, value: Any, key: str, source: str) -> float:
    if not _is_number(value):
        _fail(source, f"'{key}' must be a number, got {_type_name(value)} ({_show(value)})")
    number = float(value)
    if not math.isfinite(number):
        _fail(source, f"'{key}' must be a finite number, got {value}")
    if check.kind == "prob":
        if check.exclusive_min and not 0.0 < number <= 1.0:
            _fail(source, f"'{key}' must be > 0 and <= 1, got {value}")
        if not 0.0 <= number <= 1.0:
            _fail(source, f"'{key}' must be between 0 and 1, got {value}")
    elif check.minimum is not None:
        if check.exclusive_min and number <= check.minimum:
            _fail(source, f"'{key}' must be > {_fmt(check.minimum)}, got {value}")
        if number < check.minimum:
            _fail(source, f"'{key}' must be >= {_fmt(check.minimum)}, got {value}")
    return number


def _check_range(check: _Check, value: Any, key: str, source: str) -> tuple:
    integers = check.kind == "range_int"
    what = "integers" if integers else "numbers"
    is_elem = _is_int if integers else _is_number
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(is_elem(v) for v in value):
        _fail(
            source, f"'{key}' must be a [min, max] list of 2 {what}, got {_type_name(value)} ({_show(value)})"
        )
    low, high = (int(v) for v in value) if integers else (float(v) for v in value)
    if not integers and not (math.isfinite(low) and math.isfinite(high)):
        _fail(source, f"'{key}' must hold finite numbers, got {_show(list(value))}")
    if check.minimum is not None and low < check.minimum:
        _fail(source, f"'{key}' values must be >= {_fmt(check.minimum)}, got {_show(list(value))}")
    if low > high:
        _fail(source, f"'{key}' must be [min, max] with min <= max, got {_show(list(value))}")
    return (low, high)


# --------------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------------


def _fail(source: str, message: str) -> Any:
    text = f"{source}: {message}".replace("\r", "\\r").replace("\n", "\\n")
    raise ConfigError(text)


def _unknown(source: str, dotted: str, valid: Any) -> Any:
    _fail(source, f"unknown key '{dotted}' (valid keys: {', '.join(valid)})")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "mapping"
    return type(value).__name__


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)
