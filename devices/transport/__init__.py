"""How the farm reaches a device: ``open_transport(device)`` gives a local or SSH transport."""

from __future__ import annotations

from pathlib import Path

from edgefarm.devices.inventory import Device, TransportKind
from edgefarm.devices.transport.base import TIMEOUT_EXIT_CODE, CommandResult, HostKeyError, RemoteNameError, Transport
from edgefarm.devices.transport.local import LocalTransport

__all__ = ["TIMEOUT_EXIT_CODE", "CommandResult", "HostKeyError", "RemoteNameError", "Transport", "open_transport"]


def open_transport(device: Device) -> Transport:
    """A transport for ``device``; SSH connects lazily on first use and reconnects after a lost connection."""
    if device.transport is TransportKind.LOCAL:
        return LocalTransport(device.id, Path(device.work_dir), env=device.env)
    from edgefarm.devices.transport.ssh import SSHTransport

    return SSHTransport(device)
