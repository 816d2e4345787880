"""The farm's registries as one object, built from the settings: the device types (the packaged files with the site
directory's over them) checked by the registered toolchains, the toolchains themselves, and the site directory, whose
files of every kind (test lists, matrices, catalog, inventory: ``devices.site.KINDS``) every loader takes from here
(:meth:`Registries.files`, :meth:`Registries.origin`, ``load_inventory(registries=...)``), never from the process.

Nothing is discovered when a module is imported: :func:`build` walks the toolchain package and reads the device type
files when it is called, and :func:`current` builds the process's registries once, on first use, from the site
directory the settings or the command line configured (``devices.site``). The farm's context and the commands ask
:func:`current`; a test builds its own (``tests/helpers/registries.py``) and installs it with :func:`using`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefarm.devices import site
from edgefarm.devices.toolchain_names import ToolchainNames
from edgefarm.devices.types import DEVICE_TYPES_DIR, DeviceType, load_device_types
from edgefarm.toolchains import base
from edgellm.errors import ConfigurationError


class RegisteredToolchains:
    """The registered toolchain drivers' answers to what device types and inventories ask of them
    (``devices.toolchain_names.ToolchainNames``)."""

    def parse(self, value: str) -> str:
        return base.parse(value)

    def names(self) -> list[str]:
        return base.names()

    def needs_gpu(self, name: str) -> bool:
        return base.needs_gpu(name)

    def device_config(self, name: str, block: Any, device_id: str) -> Any:
        return base.device_config(name, block, device_id)


@dataclass(frozen=True)
class Registries:
    site_dir: Path | None  # the lab's files over the packaged ones (devices.site); None: the packaged alone
    toolchains: ToolchainNames
    device_types: Mapping[str, DeviceType]  # by name (= platform), sorted

    def platform(self, value: str) -> str:
        """A platform (device type name) someone gave, case as they like; unknown: a ConfigurationError naming it
        and every valid one."""
        name = str(value).strip().lower()
        if name not in self.device_types:
            raise ConfigurationError(f"unknown platform {value!r}; valid: {', '.join(self.device_types)}")
        return name

    def device_type(self, value: str) -> DeviceType:
        """The device type called ``value``; unknown: a ConfigurationError listing the valid ones."""
        name = str(value).strip().lower()
        if name not in self.device_types:
            raise ConfigurationError(f"unknown device type {value!r}; valid: {', '.join(self.device_types)}")
        return self.device_types[name]

    def files(self, kind: str, packaged: Path | None) -> dict[str, Path]:
        """File stem -> file of one kind (``devices.site.KINDS``): those of ``packaged`` (the package's own
        directory of that kind; None: none), with this site directory's ``kind/`` files over them (one adds a file
        or replaces the packaged one of its stem). Sorted by stem; read when asked."""
        return site.overlay(packaged, kind, self.site_dir)

    def origin(self, path: Path) -> str:
        """Where one of :meth:`files` came from, as listings show it: ``site`` or ``packaged``."""
        return site.origin(path, self.site_dir)

    def with_device_types(self, *added: DeviceType) -> Registries:
        """These registries with ``added`` device types (one of an existing name replaces it)."""
        types = {**self.device_types, **{t.name: t for t in added}}
        return Registries(self.site_dir, self.toolchains, dict(sorted(types.items())))


def build(site_dir: Path | None = None, *, device_types_dir: Path = DEVICE_TYPES_DIR) -> Registries:
    """Discover the toolchains (``toolchains.base``: the package walked once) and read the device types of
    ``device_types_dir`` with ``site_dir``'s over them, checked by those toolchains; every problem in one
    ConfigurationError."""
    toolchains = RegisteredToolchains()
    toolchains.names()  # the discovery, now rather than on first use
    types = load_device_types(device_types_dir, site_dir=site_dir, toolchains=toolchains)
    return Registries(site_dir=site_dir, toolchains=toolchains, device_types=types)


_lock = threading.Lock()
_built: list[Registries] = []  # the process's, once built
_installed: list[Registries] = []  # installed over it by using() (innermost last)


def current() -> Registries:
    """The registries of this process: those :func:`using` installed, else built once from the configured site
    directory (``devices.site.current()``, which cannot change after this)."""
    if _installed:
        return _installed[-1]
    with _lock:
        if not _built:
            _built.append(build(site.current()))
        return _built[0]


@contextmanager
def using(registries: Registries) -> Iterator[Registries]:
    """Answer :func:`current` with ``registries`` inside the block (every thread: stage work runs in threads)."""
    _installed.append(registries)
    try:
        yield registries
    finally:
        _installed.remove(registries)
