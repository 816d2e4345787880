"""Device health: reachable, disk free in the work dir, Python and edgellm versions, architecture.

The checks run on the device through its transport, with the interpreter the farm will use there
(``Device.interpreter``), so a healthy report means the farm's commands can run.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from devices.inventory import Device, Inventory
from devices.transport import Transport, open_transport
from edgellm.errors import EdgeLLMError, ErrorKind

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 11)
_PROBE = (
    "import json, platform, shutil; "
    "print(json.dumps({'python': platform.python_version(), 'machine': platform.machine(), "
    "'free': shutil.disk_usage('.').free}))"
)
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class HealthReport:
    device_id: str
    platform: str
    transport: str
    address: str
    reachable: bool
    healthy: bool
    python_version: str | None = None
    edgellm_version: str | None = None
    disk_free_bytes: int | None = None
    arch: str | None = None
    problems: tuple[str, ...] = ()
    error_kind: ErrorKind | None = None  # kind of the failure that made the device unreachable
    checked_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    duration: float = 0.0

    @property
    def disk_free_gb(self) -> float | None:
        return None if self.disk_free_bytes is None else self.disk_free_bytes / 2**30

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["disk_free_gb"] = None if self.disk_free_gb is None else round(self.disk_free_gb, 2)
        data["problems"] = list(self.problems)
        data["checked_at"] = self.checked_at.isoformat()
        return data


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def check_device(
    device: Device, *, min_free_gb: float = 1.0, timeout: float = 60.0, transport: Transport | None = None
) -> HealthReport:
    """Probe one device. Never raises for a device problem: it is in the report (unreachable, problems)."""
    start = time.monotonic()
    base = {
        "device_id": device.id,
        "platform": str(device.platform),
        "transport": str(device.transport),
        "address": device.address,
    }
    own = transport is None
    link = transport if transport is not None else open_transport(device)
    python = device.interpreter
    problems: list[str] = []
    facts: dict[str, Any] = {}
    try:
        probe = link.run([python, "-c", _PROBE], timeout=timeout)
        if probe.ok:
            try:
                facts = json.loads(probe.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                problems.append(f"python probe printed no JSON: {_last_line(probe.stdout)}")
        else:
            problems.append(f"{python} does not run ({probe.exit_code}): {_last_line(probe.stderr)}")
        version = link.run([python, "-m", "edgellm", "--version"], timeout=timeout)
        edgellm_version = version.stdout.strip().removeprefix("edgellm ").strip() if version.ok else None
        if not version.ok:
            problems.append(f"{python} -m edgellm --version failed ({version.exit_code}): {_last_line(version.stderr)}")
    except EdgeLLMError as err:
        log.warning("%s: unreachable: %s", device.id, err)
        return HealthReport(
            **base,
            reachable=False,
            healthy=False,
            problems=(str(err),),
            error_kind=err.kind,
            duration=time.monotonic() - start,
        )
    finally:
        if own:
            link.close()
    python_version = facts.get("python")
    if python_version is not None:
        parts = tuple(int(p) for p in python_version.split(".")[:2] if p.isdigit())
        if parts < MIN_PYTHON:
            problems.append(f"Python {python_version} is too old (needs {'.'.join(map(str, MIN_PYTHON))}+)")
    free_bytes = int(facts["free"]) if "free" in facts else None
    free_gb = None if free_bytes is None else free_bytes / 2**30
    if free_gb is not None and free_gb < min_free_gb:
        problems.append(f"only {free_gb:.2f} GiB free in {device.work_dir} (needs {min_free_gb:g} GiB)")
    arch = facts.get("machine")
    if arch is not None:
        arch = _ARCH_ALIASES.get(arch, arch)
        if arch != device.device_type.arch:
            problems.append(f"reports architecture {arch} but type {device.type} is {device.device_type.arch}")
    return HealthReport(
        **base,
        reachable=True,
        healthy=not problems,
        python_version=python_version,
        edgellm_version=edgellm_version,
        disk_free_bytes=free_bytes,
        arch=arch,
        problems=tuple(problems),
        duration=time.monotonic() - start,
    )


def check_inventory(
    inventory: Inventory, *, min_free_gb: float = 1.0, timeout: float = 60.0, parallel: int = 8
) -> list[HealthReport]:
    """Every device's report, probed in parallel, in inventory order."""
    devices = list(inventory)
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(devices)))) as pool:
        return list(pool.map(lambda d: check_device(d, min_free_gb=min_free_gb, timeout=timeout), devices))
