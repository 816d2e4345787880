"""What the device types and the inventory ask of the toolchain registry, without importing a toolchain.

A device type names its toolchains and an inventory file holds a block per toolchain (``toolchains: {name: {...}}``):
both are checked by the toolchains' own registry, which answers here (``toolchains.base`` gives its answers with
:func:`answer_with` when it loads). ``devices`` imports nothing of ``toolchains``; until the registry has answered,
names are read as plain lower-case strings and blocks are kept as written.
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


_answers: list[ToolchainNames] = []


def answer_with(registry: ToolchainNames) -> None:
    """The toolchain registry that answers from now on (device types read before it are read again)."""
    _answers[:] = [registry]


def current() -> ToolchainNames | None:
    """The toolchain registry's answers (None: no toolchain registry loaded in this process)."""
    return _answers[0] if _answers else None
