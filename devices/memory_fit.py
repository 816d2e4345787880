"""Does a row fit its platform: the engine's memory (``edgellm.memory``, from the model's config alone) against the
device type's usable memory (``memory_gb`` less its ``os_reserve_gb``). The plan and ``lists validate`` both ask it;
a row that cannot fit is not applicable there, with the figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from edgefarm.devices.types import DeviceType
from edgellm.config import ModelConfig
from edgellm.errors import ConfigurationError
from edgellm.memory import (
    GB,
    RESERVES_FILE,
    MemoryEstimate,
    Reserve,
    compute_dtype,
    estimate,
    load_copy,
    load_reserves,
    reserve_for,
)
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision


class Row(Protocol):
    """What sizing reads of a test row (a list's entry or its spec)."""

    model: str
    precision: Precision | None
    lm_head_precision: LMHeadPrecision | None
    kv_cache_precision: KVCachePrecision | None
    max_seq_len: int
    max_batch_size: int
    max_input_len: int


@dataclass
class Sizer:
    """Estimates for one plan: the reserve table read once, each (model, shapes, toolchain, platform) sized once."""

    reserves: dict[tuple[str, str], Reserve] = field(default_factory=load_reserves)
    _done: dict[tuple[Any, ...], MemoryEstimate | None] = field(default_factory=dict)

    def size(self, entry: Row, config: dict[str, Any] | None, toolchain: str, platform: str,
             group_size: int | None = None) -> MemoryEstimate | None:
        """The row's estimate on ``platform`` with ``toolchain`` from the model's ``config`` (the catalog's
        ``ModelSource.config()``); None when it cannot be read here (a path checkpoint absent on this host), or
        describes no decoder this library sizes."""
        key = (entry.model, entry.precision, entry.lm_head_precision, entry.kv_cache_precision, entry.max_seq_len,
               entry.max_batch_size, entry.max_input_len, toolchain, platform)
        if key not in self._done:
            self._done[key] = self._size(entry, config, toolchain, platform, group_size)
        return self._done[key]

    def _size(self, entry: Row, raw: dict[str, Any] | None, toolchain: str, platform: str,
              group: int | None) -> MemoryEstimate | None:
        if raw is None or entry.precision is None:
            return None
        try:
            cfg = ModelConfig.from_dict(raw, source=f"model {entry.model}")
            return estimate(cfg, entry.precision, max_seq_len=entry.max_seq_len, max_batch_size=entry.max_batch_size,
                            max_input_len=entry.max_input_len, lm_head_precision=entry.lm_head_precision,
                            kv_cache_precision=entry.kv_cache_precision, group_size=group,
                            float_dtype=compute_dtype(toolchain), load_copy=load_copy(toolchain),
                            reserve=reserve_for(toolchain, platform, self.reserves))
        except ConfigurationError:  # a config this library cannot size: the row's other checks speak for it
            return None


def memory_json(found: MemoryEstimate | None) -> dict[str, Any] | None:
    """What a job of the plan carries: ``{"estimate_gb", "parts": {part: GB}}``, and where the reserve came from."""
    if found is None:
        return None
    r = found.reserve
    return {"estimate_gb": found.estimate_gb, "parts": {k: round(v / GB, 4) for k, v in found.parts.items()},
            "reserve": f"measured for {r.toolchain} on {r.device_type} ({RESERVES_FILE.name})" if r is not None
            else "none measured for this toolchain and platform"}


def fit_problem(found: MemoryEstimate | None, device_type: DeviceType) -> str | None:
    """Why the row cannot fit ``device_type`` ("needs 9.8 GB; orin-nano-8gb has 6.9 GB usable"), or None."""
    if found is None or found.total_bytes <= device_type.usable_memory_gb * GB:
        return None
    return (f"needs {found.total_bytes / GB:.1f} GB; {device_type.name} has {device_type.usable_memory_gb:g} GB "
            f"usable ({device_type.memory_gb:g} GB less {device_type.os_reserve_gb:g} GB for the OS)")


def source_group(source: Any) -> int | None:
    """A catalog model's quantization group, where the catalog states it (a ``synth_quant`` entry's)."""
    return source.spec.get("group_size") if source.kind == "synth_quant" else None
