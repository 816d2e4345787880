"""Which platforms exist and what they can run: the device types of the devices package (one YAML file each).

Only the few fields a test list is checked against are kept (name, ``sm``, ``precisions``, ``kv_cache_precisions``);
tests may pass plain names instead.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class PlatformType:
    name: str
    sm: int | None = None
    # None: capabilities unknown (a bare name), so nothing is checked against them.
    precisions: tuple[str, ...] | None = None
    kv_cache_precisions: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        return f"{self.name} (SM{self.sm})" if self.sm is not None else self.name


@dataclass(frozen=True)
class PlatformCatalog:
    types: dict[str, PlatformType] = field(default_factory=dict)

    @classmethod
    def from_dir(cls, types_dir: Path | None = None) -> PlatformCatalog:
        """The device types of ``types_dir`` (default: devices/types), validated by the devices package."""
        from devices.types import DEVICE_TYPES, DEVICE_TYPES_DIR, load_device_types

        types = DEVICE_TYPES if types_dir is None or Path(types_dir) == DEVICE_TYPES_DIR else \
            load_device_types(Path(types_dir))
        return cls({name: PlatformType(name=name, sm=t.sm, precisions=tuple(p.value for p in t.precisions),
                                       kv_cache_precisions=tuple(k.value for k in t.kv_cache_precisions))
                    for name, t in types.items()})

    @classmethod
    def from_names(cls, names: Iterable[str]) -> PlatformCatalog:
        return cls({n: PlatformType(n) for n in names})

    @classmethod
    def coerce(cls, platforms: PlatformCatalog | Iterable[str] | None) -> PlatformCatalog:
        if platforms is None:
            return cls.from_dir()
        if isinstance(platforms, PlatformCatalog):
            return platforms
        return cls.from_names(platforms)

    @property
    def names(self) -> list[str]:
        return sorted(self.types)

    def matching(self, glob: str) -> list[str]:
        return [n for n in self.names if fnmatch.fnmatchcase(n, glob)]


def known_platforms(types_dir: Path | None = None) -> set[str]:
    """Platform names: the stems of ``devices/types/*.yaml``."""
    return set(PlatformCatalog.from_dir(types_dir).types)
