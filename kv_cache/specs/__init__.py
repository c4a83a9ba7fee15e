"""Hardware specs shipped as data: ``gpus.yaml`` is the one table of GPU datasheet figures. A config
file's ``gpus:`` section overlays it (settings/loader.py); the flags' help lists its keys."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

__all__ = ["GIB", "GPUSpec", "gpu_specs", "load_gpu_specs"]

GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet numbers.

    - ``hbm_gb``: device memory in GiB (2**30 bytes). Datasheet "GB" of HBM are binary: an "80GB" A100 or
      H100 reports 81,920 MiB;
    - ``hbm_bandwidth_gbs``: peak memory bandwidth, GB/s (10**9 bytes/s, as datasheets give it);
    - ``peak_dense_tflops``: peak BF16/FP16 tensor-core TFLOP/s, DENSE (datasheets often headline the 2:4
      sparsity figure, twice this);
    - ``source``: where the numbers come from;
    - ``host_link`` / ``host_link_gbs``: the GPU's link to host memory and its peak bandwidth PER DIRECTION,
      GB/s (datasheets give PCIe as the bidirectional sum: "PCIe Gen5 128GB/s" = 64 GB/s each way); the
      simulated GPU tier models host<->HBM copies with it (0 = unknown: no simulated tier for that GPU);
    - ``host_link_source``: where the link figure comes from.
    """

    name: str
    hbm_gb: float
    hbm_bandwidth_gbs: float
    peak_dense_tflops: float
    source: str = ""
    host_link: str = ""
    host_link_gbs: float = 0.0
    host_link_source: str = ""

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * GIB


_NUMBERS = {"hbm_gb", "hbm_bandwidth_gbs", "peak_dense_tflops", "host_link_gbs"}


def load_gpu_specs(text: str, source: str = "gpus.yaml") -> Mapping[str, GPUSpec]:
    """The GPU table of a YAML document ({key: {field: value}}); ValueError naming the entry and field for
    anything that is not a GPUSpec (an unknown or missing field, a number that is not one)."""
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of GPU keys to their fields")
    fields = {f.name for f in dataclasses.fields(GPUSpec)}
    specs = {}
    for key, values in data.items():
        if not isinstance(values, dict):
            raise ValueError(f"{source}: {key}: expected a mapping of fields")
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"{source}: {key}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(sorted(fields))})")
        for name in _NUMBERS & set(values):
            if isinstance(values[name], bool) or not isinstance(values[name], (int, float)):
                raise ValueError(f"{source}: {key}.{name}: expected a number, got {values[name]!r}")
        try:
            spec = GPUSpec(**{k: float(v) if k in _NUMBERS else v for k, v in values.items()})
        except TypeError as exc:
            raise ValueError(f"{source}: {key}: {exc}") from None
        specs[str(key)] = spec
    return types.MappingProxyType(specs)


@cache
def gpu_specs() -> Mapping[str, GPUSpec]:
    """The built-in GPUs of the shipped ``gpus.yaml`` (read once, when first asked for)."""
    return load_gpu_specs(resources.files(__package__).joinpath("gpus.yaml").read_text(encoding="utf-8"))
