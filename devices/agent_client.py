"""Running the farm's agent (``devices/agent.py``) on a device: pushed into the device's cache as
``cache/<sha256 of the file>`` (checked by ``sha256sum`` once per device and process, staged again when missing or
damaged), run with the device's own interpreter isolated (``python3 -I -S``: standard library only), never
installed. Used by the stages (``tasks/``) and by the health check alike; it needs a transport, nothing else.

The agent's exit codes (its module doc): 0 yes, 1 no (its JSON still comes), 2 bad input (the farm asked wrong: a
bug), 3 the device failed (infrastructure), 4 a bug in the agent. 126/127 mean the interpreter did not start: a
device without the ``python3`` its inventory names (``python:``) is set up wrong for every toolchain.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from edgefarm.devices import agent as agent_module
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import Transport
from edgellm.errors import BugError, DeviceConfigurationError, InfrastructureError

AGENT_FILE = Path(agent_module.__file__).resolve()
AGENT_SHA256 = hashlib.sha256(AGENT_FILE.read_bytes()).hexdigest()
AGENT_PATH = f"cache/{AGENT_SHA256}"  # relative to the device's work dir
TIMEOUT_S = 120.0
_staged: set[tuple[str, str]] = set()  # (device id, work dir) where this process checked or staged the agent
_lock = threading.Lock()


def argv(device: Device, *args: str) -> list[str]:
    """How the agent runs on ``device``: its own interpreter, isolated (no site-packages, no user site)."""
    return [device.interpreter, "-I", "-S", AGENT_PATH, *args]


def ensure(device: Device, transport: Transport) -> str:
    """The agent in the device's cache (verified once per device and process); its path there."""
    key = (device.id, device.work_dir)
    with _lock:
        if key in _staged:
            return AGENT_PATH
    found = transport.run(["sha256sum", "--", AGENT_PATH], timeout=60)
    if not (found.ok and found.stdout[:64] == AGENT_SHA256):
        transport.run(["mkdir", "-p", "cache"], timeout=60)
        transport.put(AGENT_FILE, AGENT_PATH)
    with _lock:
        _staged.add(key)
    return AGENT_PATH


def forget(device: Device) -> None:
    with _lock:
        _staged.discard((device.id, device.work_dir))


def device_json(what: str, stdout: str) -> Any:
    """The JSON a device command printed (its size is bounded by the transport); anything else, JSON nested past
    what the parser can follow included, is the device's fault: an infrastructure error naming ``what``."""
    try:
        return json.loads(stdout)
    except ValueError:
        raise InfrastructureError(f"{what} printed no JSON: {stdout[:200]!r}") from None
    except RecursionError:
        raise InfrastructureError(f"{what} printed JSON nested too deeply to read ({len(stdout)} characters, "
                                  f"starting {stdout[:40]!r})") from None


def json_object(what: str, stdout: str) -> dict[str, Any]:
    """The one JSON object a device command printed; an infrastructure error naming ``what`` otherwise."""
    data = device_json(what, stdout)
    if not isinstance(data, dict):
        raise InfrastructureError(f"{what} printed {type(data).__name__}, not a JSON object")
    return data


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def run(device: Device, transport: Transport, *args: str, timeout: float = TIMEOUT_S,
        no_ok: bool = False) -> dict[str, Any]:
    """Run an agent subcommand on ``device``; its JSON. ``no_ok``: a "no" (exit 1) is an answer, not an error."""
    for attempt in (1, 2):
        ensure(device, transport)
        result = transport.run(argv(device, *args), timeout=timeout)
        if result.exit_code == 2 and "can't open file" in result.stderr and attempt == 1:
            forget(device)  # its cache entry went (evicted, wiped): stage it again
            continue
        break
    what = f"{device.id}: agent {args[0]}"
    if result.exit_code == 0 or (result.exit_code == 1 and no_ok):
        return json_object(what, result.stdout)
    message = _last(result.stderr) or _last(result.stdout) or f"exit code {result.exit_code}"
    if result.exit_code in (126, 127):
        raise DeviceConfigurationError(f"{device.id}: its python3 ({device.interpreter}) does not run "
                                       f"(exit {result.exit_code}: {message}); set python: in its inventory file "
                                       f"to a Python 3.8+ interpreter")
    if "SyntaxError" in message or "invalid syntax" in message:
        raise DeviceConfigurationError(f"{device.id}: its python3 ({device.interpreter}) is too old for the agent "
                                       f"(it needs Python 3.8+): {message}")
    if result.exit_code in (2, 4):
        raise BugError(f"{what}: {message}")
    forget(device)
    raise InfrastructureError(f"{what} failed (exit {result.exit_code}): {message}")
