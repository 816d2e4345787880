"""Which platforms a test list may name: the device types of the devices package (one YAML file each), or, in tests,
plain names. What a platform can run is not kept here: ``test_lists.capability`` answers it for the plan and for list
validation alike (a plain name is checked against nothing).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class PlatformCatalog:
    names_: frozenset[str] = field(default_factory=frozenset)
    device_types: bool = False  # the names are the device types (their capabilities are checked)

    @classmethod
    def from_dir(cls, types_dir: Path | None = None) -> PlatformCatalog:
        """The device types of ``types_dir`` (default: devices/types), validated by the devices package; only the
        packaged types' capabilities can be checked (another directory gives names)."""
        from edgefarm.devices.types import DEVICE_TYPES_DIR, load_device_types
        from edgefarm.registries import current

        if types_dir is None or Path(types_dir) == DEVICE_TYPES_DIR:
            return cls(frozenset(current().device_types), device_types=True)
        return cls(frozenset(load_device_types(Path(types_dir))))

    @classmethod
    def from_names(cls, names: Iterable[str]) -> PlatformCatalog:
        return cls(frozenset(names))

    @classmethod
    def coerce(cls, platforms: PlatformCatalog | Iterable[str] | None) -> PlatformCatalog:
        if platforms is None:
            return cls.from_dir()
        if isinstance(platforms, PlatformCatalog):
            return platforms
        return cls.from_names(platforms)

    @property
    def names(self) -> list[str]:
        return sorted(self.names_)

    def __contains__(self, name: object) -> bool:
        return name in self.names_

    def matching(self, glob: str) -> list[str]:
        return [n for n in self.names if fnmatch.fnmatchcase(n, glob)]


def known_platforms(types_dir: Path | None = None) -> set[str]:
    """Platform names: the stems of ``devices/types/*.yaml``."""
    return set(PlatformCatalog.from_dir(types_dir).names_)
