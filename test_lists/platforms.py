"""Which platforms exist and what they can run, read straight from ``devices/types/*.yaml``.

Only the few fields a test list is checked against are read (name = file stem, ``sm``, ``precisions``,
``kv_cache_precisions``); the devices package owns the full schema. Tests may pass plain names instead.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from edgellm.errors import ConfigurationError

DEFAULT_TYPES_DIR = Path(__file__).resolve().parent.parent / "devices" / "types"


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
        types_dir = Path(types_dir) if types_dir is not None else DEFAULT_TYPES_DIR
        files = sorted(types_dir.glob("*.yaml"))
        if not files:
            raise ConfigurationError(f"no device types (*.yaml) in {types_dir}; the platform names come from there")
        types: dict[str, PlatformType] = {}
        for path in files:
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError as exc:
                raise ConfigurationError(f"{path}: device type is not valid YAML: {exc}") from None
            if not isinstance(data, dict):
                raise ConfigurationError(f"{path}: device type must be a mapping, got {type(data).__name__}")
            types[path.stem] = PlatformType(
                name=path.stem,
                sm=data.get("sm") if isinstance(data.get("sm"), int) else None,
                precisions=_str_set(data.get("precisions")),
                kv_cache_precisions=_str_set(data.get("kv_cache_precisions")),
            )
        return cls(types)

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


def _str_set(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return None


def known_platforms(types_dir: Path | None = None) -> set[str]:
    """Platform names: the stems of ``devices/types/*.yaml``."""
    return set(PlatformCatalog.from_dir(types_dir).types)
