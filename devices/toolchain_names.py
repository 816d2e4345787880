"""What the device types and the inventory ask of the toolchain registry, without importing a toolchain.

A device type names its toolchains and an inventory file holds a block per toolchain (``toolchains: {name: {...}}``):
both are checked by the toolchains' own registry, whose answers the loaders are handed (``registries``
builds them). ``devices`` imports nothing of ``toolchains``; a loader handed none reads names as plain lower-case
strings and keeps blocks as written.
"""

from __future__ import annotations

from typing import Any, Protocol


class ToolchainNames(Protocol):
    def parse(self, value: str) -> str:
        """A registered toolchain's name, else a ConfigurationError naming the value and the registered ones."""

    def names(self) -> list[str]:
        """Every registered toolchain's name."""

    def needs_gpu(self, name: str) -> bool:
        """Whether toolchain ``name`` runs only on a device type with a GPU (``sm`` set)."""

    def device_config(self, name: str, block: Any, device_id: str) -> Any:
        """What toolchain ``name`` reads of its block in device ``device_id``'s inventory file; ConfigurationError
        naming what is wrong."""
