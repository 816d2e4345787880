"""Device types: one YAML file each in ``devices/types/`` and a site directory's ``device_types/``, read when the
farm's registries are built (``registries``), never at import.

A new device type is exactly one YAML file (its ``name`` equals the file stem). ``DeviceType.supports()``
answers like LAVA's ``accepts()``: ``(ok, reason)``, the reason naming the device, its SM and what is missing.
``toolchains`` names what turns a checkpoint into evidence there, in order of preference: registered toolchain names,
checked (and whether each needs a GPU) by the toolchains' registry the loader is handed (``devices.toolchain_names``;
this package asks no toolchain). What a platform can run with a toolchain at a variant is one function,
``test_lists.capability``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from edgefarm.devices._yaml import read_yaml_mapping, validation_problems
from edgefarm.devices.site import overlay
from edgefarm.devices.toolchain_names import ToolchainNames
from edgellm.errors import ConfigurationError
from edgellm.types import ChoiceEnum, KVCachePrecision, LMHeadPrecision, Precision

DEVICE_TYPES_DIR = Path(__file__).resolve().parent / "types"

# Smallest SM with hardware support, used to explain a refusal ("needs SM89+") and to check type files; by name, so
# it covers the weights', the LM head's and the KV cache's formats alike.
MIN_SM: dict[str, int] = {"bf16": 80, "fp8": 89, "nvfp4": 100, "mxfp8": 100}


class Arch(ChoiceEnum):
    X86_64 = "x86_64"
    AARCH64 = "aarch64"


def _parse_list(enum_cls: type[ChoiceEnum], what: str, value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a list of {what} names, got {value!r}")
    try:
        return [enum_cls.parse(item, what=what) for item in value]
    except ConfigurationError as err:
        raise ValueError(str(err)) from None


class DeviceType(BaseModel):
    """What a kind of device can run: architecture, SM, memory, toolchains and precisions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str
    arch: Arch
    sm: int | None = Field(ge=10, le=999)  # CUDA compute capability x10 (87 = 8.7); None = no GPU
    memory_gb: float = Field(gt=0)
    # what the OS and the board's services keep of memory_gb (Jetson: CPU and GPU share it); an engine fits when its
    # estimate (edgellm.memory) is at most usable_memory_gb
    os_reserve_gb: float = Field(default=0.0, ge=0)
    memory_bandwidth_gbps: float | None = Field(default=None, gt=0)  # the vendor's published peak, GB/s
    toolchains: tuple[str, ...] = Field(min_length=1)  # registered toolchain names, in order of preference
    precisions: tuple[Precision, ...] = Field(min_length=1)
    kv_cache_precisions: tuple[KVCachePrecision, ...] = Field(min_length=1)
    lm_head_precisions: tuple[LMHeadPrecision, ...] = Field(min_length=1)
    # precisions a toolchain of this type could make but that would not count as evidence here, with the reason
    refuses: dict[Precision, str] = Field(default_factory=dict)
    # the conditions its benchmarks are meant to run in: the power mode's name (nvpmodel -q) and locked clocks
    # (jetson_clocks); a benchmark run otherwise is recorded as such and never compared with these in regressions
    bench_power_mode: str | None = Field(default=None, min_length=1, max_length=64)
    bench_clocks_locked: bool = False

    @field_validator("arch", mode="before")
    @classmethod
    def _arch(cls, value: Any) -> Arch:
        try:
            return Arch.parse(value, what="arch")
        except ConfigurationError as err:
            raise ValueError(str(err)) from None

    @field_validator("toolchains", mode="before")
    @classmethod
    def _toolchains(cls, value: Any, info: ValidationInfo) -> list[str]:
        if not isinstance(value, list | tuple):
            raise ValueError(f"expected a list of toolchain names, got {value!r}")
        registry = _registry(info)
        if registry is None:
            return [str(item).strip().lower() for item in value]
        try:
            return [registry.parse(item) for item in value]
        except ConfigurationError as err:
            raise ValueError(str(err)) from None

    @field_validator("precisions", mode="before")
    @classmethod
    def _precisions(cls, value: Any) -> list[Precision]:
        return _parse_list(Precision, "precision", value)

    @field_validator("refuses", mode="before")
    @classmethod
    def _refuses(cls, value: Any) -> dict[Precision, str]:
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of precision to the reason it does not count, got {value!r}")
        parsed = dict(zip(_parse_list(Precision, "precision", list(value)), value.values(), strict=True))
        empty = [p.value for p, why in parsed.items() if not isinstance(why, str) or not why.strip()]
        if empty:
            raise ValueError(f"refuses: give a reason for {', '.join(empty)}")
        return parsed

    @field_validator("kv_cache_precisions", mode="before")
    @classmethod
    def _kv(cls, value: Any) -> list[KVCachePrecision]:
        return _parse_list(KVCachePrecision, "kv cache precision", value)

    @field_validator("lm_head_precisions", mode="before")
    @classmethod
    def _lm_head(cls, value: Any) -> list[LMHeadPrecision]:
        return _parse_list(LMHeadPrecision, "LM-head precision", value)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> DeviceType:
        problems = []
        registry = _registry(info)
        for name in self.toolchains:
            if self.sm is None and registry is not None and registry.needs_gpu(name):
                problems.append(f"toolchain {name} needs a GPU: set sm")
        both = [p.value for p in self.precisions if p in self.refuses]
        if both:
            problems.append(f"precision(s) {', '.join(both)} both listed in precisions and refused")
        for what, listed in (("precision", self.precisions), ("KV-cache precision", self.kv_cache_precisions),
                             ("LM-head precision", self.lm_head_precisions)):
            for precision in listed:
                need = MIN_SM.get(precision.value)
                if need is not None and self.sm is not None and self.sm < need:
                    problems.append(f"{what} {precision} needs SM{need}+ but sm is {self.sm}")
        if self.os_reserve_gb >= self.memory_gb:
            problems.append(f"os_reserve_gb {self.os_reserve_gb} must be below memory_gb {self.memory_gb}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def usable_memory_gb(self) -> float:
        return round(self.memory_gb - self.os_reserve_gb, 3)

    @property
    def label(self) -> str:
        return f"{self.name} (SM{self.sm})" if self.sm is not None else f"{self.name} (CPU)"

    def supports(self, precision: Precision | str) -> tuple[bool, str]:
        """``(True, why)`` if this type's hardware runs weights at ``precision``, else ``(False, reason)``. What a
        toolchain makes of it, and the LM head and KV cache, are ``test_lists.capability``'s to add."""
        wanted = Precision.parse(precision, what="precision")
        if wanted in self.refuses:
            return False, self.refuses[wanted]
        if wanted not in self.precisions:
            return False, f"{self.label} does not support {wanted} ({self._why_not(wanted.value, self.precisions)})"
        return True, f"{self.label} supports {wanted}"

    def _why_not(self, name: str, listed: tuple[ChoiceEnum, ...]) -> str:
        need = MIN_SM.get(name)
        if need is not None and self.sm is not None and self.sm < need:
            return f"needs SM{need}+"
        return "supported: " + ", ".join(listed)

    def supports_kv_cache(self, kv_cache: KVCachePrecision) -> tuple[bool, str]:
        if kv_cache in self.kv_cache_precisions:
            return True, ""
        return False, (f"{self.label} does not support a {kv_cache} KV cache "
                       f"({self._why_not(kv_cache.value, self.kv_cache_precisions)})")

    def supports_lm_head(self, lm_head: LMHeadPrecision) -> tuple[bool, str]:
        if lm_head in self.lm_head_precisions:
            return True, ""
        return False, (f"{self.label} does not support a {lm_head} LM head "
                       f"({self._why_not(lm_head.value, self.lm_head_precisions)})")


def _registry(info: ValidationInfo) -> ToolchainNames | None:
    """The toolchain registry a load checks names with (``load_device_types``; None: names unchecked)."""
    return (info.context or {}).get("toolchains") if isinstance(info.context, dict) else None


_TYPE_KEYS = list(DeviceType.model_fields)


def load_device_types(directory: Path = DEVICE_TYPES_DIR, *, site_dir: Path | None = None,
                      toolchains: ToolchainNames | None = None) -> dict[str, DeviceType]:
    """Every ``*.yaml`` in ``directory``, with a site directory's ``device_types/`` over them (``devices.site``: a
    site file adds a type or replaces the packaged one of its name), validated; every problem of every file in one
    ConfigurationError. Where each came from: ``device_type_files``. Toolchain names are checked by ``toolchains``
    (None: read as lower-case names, unchecked)."""
    problems: list[str] = []
    types: dict[str, DeviceType] = {}
    if not directory.is_dir():
        raise ConfigurationError(f"device type directory {directory} does not exist")
    site_types = None if site_dir is None else site_dir / "device_types"
    for folder in (directory, site_types):
        if folder is not None and folder.is_dir():
            problems += [f"{stray}: device type files end in .yaml" for stray in sorted(folder.glob("*.yml"))]
    for path in device_type_files(directory, site_dir=site_dir).values():
        try:
            data = read_yaml_mapping(path)
            device_type = DeviceType.model_validate(data, context={"toolchains": toolchains})
        except ConfigurationError as err:
            problems.append(str(err))
            continue
        except pydantic.ValidationError as err:
            problems.extend(validation_problems(path, err, valid_keys=_TYPE_KEYS))
            continue
        if device_type.name != path.stem:
            problems.append(f"{path}: name: {device_type.name!r} must equal the file name {path.stem!r}")
            continue
        types[device_type.name] = device_type
    if problems:
        raise ConfigurationError("invalid device types:\n" + "\n".join(problems))
    if not types:
        raise ConfigurationError(f"no device types (*.yaml) in {directory}")
    return types


def device_type_files(directory: Path = DEVICE_TYPES_DIR, *, site_dir: Path | None = None) -> dict[str, Path]:
    """Device type name -> the file it is read from (a site file over the packaged one of its name)."""
    return overlay(directory, "device_types", site_dir)
