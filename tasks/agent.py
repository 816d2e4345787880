"""The farm's agent on a device (``devices/agent.py``): pushed into the device cache like any input, run with the
device's own ``python3 -I -S`` (standard library only), never installed. What it answers: the device's environment
(``env``), whether a toolchain's files are there (``check``), an engine's tree digest and seal (``hash``), the
kernel's OOM-killer records (``oom``) and the cache's use and eviction (``cache``).

Its exit codes (its module doc): 0 yes, 1 no (its JSON still comes), 2 bad input (the farm asked wrong: a bug), 3 the
device failed (infrastructure), 4 a bug in the agent. Anything else means the interpreter did not run it: a device
without the ``python3`` the inventory names (``python:``) is set up wrong for every toolchain.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from artifacts.kinds import ArtifactKind
from artifacts.store import ArtifactRef
from devices import agent as agent_module
from devices.inventory import Device
from devices.transport import Transport
from edgellm.errors import BugError, DeviceConfigurationError, InfrastructureError
from stages.outcome import last_line
from tasks import device_cache
from tasks.farm import Farm

AGENT_FILE = Path(agent_module.__file__).resolve()
TIMEOUT_S = 120.0
_staged: dict[tuple[int, str], ArtifactRef] = {}  # (farm id, device id) -> the agent staged there in this process
_lock = threading.Lock()


def agent_ref(farm: Farm) -> ArtifactRef:
    """The agent file in the farm's store (staged into each device's cache like any input)."""
    return farm.store.put(AGENT_FILE, ArtifactKind.OTHER)


def argv(device: Device, ref: ArtifactRef, *args: str) -> list[str]:
    """How the agent runs on ``device``: its own interpreter, isolated (no site-packages, no user site)."""
    return [device.interpreter, "-I", "-S", device_cache.entry(ref.sha256), *args]


def stage(farm: Farm, device: Device, transport: Transport) -> ArtifactRef:
    """The agent in the device's cache (checked once per device and process, then trusted)."""
    from tasks.device_exec import ensure_on_device

    ref = agent_ref(farm)
    key = (id(farm), device.id)
    with _lock:
        if _staged.get(key) == ref:
            return ref
    ensure_on_device(farm, transport, ref)
    with _lock:
        _staged[key] = ref
    return ref


def forget(farm: Farm, device: Device) -> None:
    """Stage the agent again on the next call (its cache entry may have been removed)."""
    with _lock:
        _staged.pop((id(farm), device.id), None)


def run(farm: Farm, device: Device, transport: Transport, *args: str, timeout: float = TIMEOUT_S,
        no_ok: bool = False) -> dict[str, Any]:
    """Run an agent subcommand on ``device``; its JSON. ``no_ok``: a "no" (exit 1) is an answer, not an error."""
    ref = stage(farm, device, transport)
    result = transport.run(argv(device, ref, *args), timeout=timeout)
    what = f"{device.id}: agent {args[0]}"
    if result.exit_code in (0, 1) and (result.exit_code == 0 or no_ok):
        try:
            data = json.loads(result.stdout)
        except ValueError:
            raise InfrastructureError(f"{what} printed no JSON: {result.stdout[:200]!r}") from None
        if not isinstance(data, dict):
            raise InfrastructureError(f"{what} printed {type(data).__name__}, not a JSON object")
        return data
    message = last_line(result.stderr) or last_line(result.stdout) or f"exit code {result.exit_code}"
    if result.exit_code == 1:
        raise InfrastructureError(f"{what}: {message}")
    if result.exit_code in (2, 4):
        raise BugError(f"{what}: {message}")
    if result.exit_code == 3 or result.timed_out:
        raise InfrastructureError(f"{what}: {message}")
    if result.exit_code in (126, 127):
        raise DeviceConfigurationError(f"{device.id}: its python3 ({device.interpreter}) does not run "
                                       f"(exit {result.exit_code}: {message}); set python: in its inventory file "
                                       f"to a Python 3.8+ interpreter")
    forget(farm, device)
    raise InfrastructureError(f"{what} failed (exit {result.exit_code}): {message}")
