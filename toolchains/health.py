"""A device's toolchains, as ``edgefarm devices check`` reports them: each toolchain of its type that it can drive,
once per build it lists, probed (``toolchains.probe``) and its version read back. The rest of a device's health
(reachable, its Python, disk, platform, power, cache) is the device's own (``devices.health``), which asks this
check for the toolchains' part.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgefarm.devices import health
from edgefarm.devices.health import Answers, HealthReport, ToolchainHealth
from edgefarm.devices.inventory import Device, Inventory
from edgefarm.devices.transport import Transport
from edgefarm.devices.types import DeviceType
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains.probe import probe_toolchain
from edgellm.errors import DeviceConfigurationError


def device_toolchains(device: Device, device_type: DeviceType, transport: Transport) -> list[ToolchainHealth]:
    """Each toolchain of the device's type that the device can drive, once per build it lists."""
    out = []
    for name in device_type.toolchains:
        found = toolchains.driver_class(name)()
        if found.device_problem() is not None:  # it takes part in no device stage: nothing of it on a device
            continue
        for build in found.device().device_builds(device):
            driver = toolchains.driver(name, pins={name: build} if build is not None else None)
            if not driver.device().drives(device):
                continue
            try:
                facts = probe_toolchain(device, transport, driver)
                env = {"toolchains": {name: facts}}
                try:
                    version = driver.device().device_version(device, env)
                except (AttributeError, TypeError, ValueError, KeyError) as exc:  # facts of the wrong shape
                    out.append(ToolchainHealth(name, build, None, False, (
                        f"its probe's answer has the wrong shape ({type(exc).__name__}: {exc}); valid: the JSON "
                        f"its probe prints on a working device",)))
                    continue
                problems: list[str] = []
                version = Answers("its probe", {}, problems).text("version", version)
                out.append(ToolchainHealth(name, build, version, not problems, tuple(problems)))
            except DeviceConfigurationError as exc:
                out.append(ToolchainHealth(name, build, None, False, (str(exc).removeprefix(f"{device.id}: "),)))
    return out


def check_device(device: Device, device_type: DeviceType, *, min_free_gb: float = 1.0, timeout: float = 60.0,
                 transport: Transport | None = None) -> HealthReport:
    """``devices.health.check_device`` (of a device of ``device_type``) with the toolchains' part checked here."""
    return health.check_device(device, device_type, toolchains=device_toolchains,
                               min_free_gb=min_free_gb, timeout=timeout, transport=transport)


def check_inventory(inventory: Inventory, device_types: Mapping[str, DeviceType], *, min_free_gb: float = 1.0,
                    timeout: float = 60.0, parallel: int = 8) -> list[HealthReport]:
    """``devices.health.check_inventory`` (its devices' types in ``device_types``) with the toolchains' part."""
    return health.check_inventory(inventory, device_types, toolchains=device_toolchains,
                                  min_free_gb=min_free_gb, timeout=timeout, parallel=parallel)
