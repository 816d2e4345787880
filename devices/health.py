"""Device health: what ``edgefarm devices check`` reports of each device, read by the farm's agent.

A device needs nothing of ours installed: the agent (``devices/agent.py``, standard-library Python 3.8+) is pushed
into its cache and run with its own ``python3 -I -S``. The report: reachable; the interpreter and its version (3.8+);
the architecture against the device type's; free disk in the work dir; the platform (L4T / JetPack, CUDA, GPU
driver, board); power mode, whether clocks are locked and the hottest thermal zone, against the device type's
benchmark conditions (a difference is a note: tests run, benchmarks are recorded as off-conditions); per toolchain
the device type runs and the device can drive (each of its builds), whether its files are there and its version
(what the caller's ``toolchains`` check answers: ``toolchains.health``, since this package asks no toolchain); and
the device cache's use against its bound. Problems make a device unhealthy (and a passing
check releases a quarantine); notes do not.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from edgefarm.devices import agent_client
from edgefarm.devices.inventory import Device, Inventory
from edgefarm.devices.transport import Transport, open_transport
from edgefarm.devices.types import DeviceType
from edgellm.errors import DeviceConfigurationError, EdgeLLMError, ErrorKind

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 8)  # the agent's floor (JetPack 5); a toolchain that needs more says so in its own probe
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class ToolchainHealth:
    name: str
    build: str | None  # the build's release the check was for (toolchains with one build per release), else None
    version: str | None  # what the device has, read back
    ok: bool
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class HealthReport:
    device_id: str
    platform: str
    transport: str
    address: str
    reachable: bool
    healthy: bool
    python_version: str | None = None
    edgellm_version: str | None = None  # the edgellm package on the device, where a toolchain of it runs there
    disk_free_bytes: int | None = None
    arch: str | None = None
    l4t: str | None = None
    jetpack: str | None = None
    cuda: str | None = None
    gpu_driver: str | None = None
    power_mode: str | None = None
    clocks_locked: bool | None = None
    temp_max_c: float | None = None
    toolchains: tuple[ToolchainHealth, ...] = ()
    cache_bytes: int | None = None
    cache_max_bytes: int | None = None
    cache_entries: int | None = None
    cache_in_use: int | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # not problems: e.g. a power mode benchmarks would be recorded as off-conditions
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
        data["notes"] = list(self.notes)
        data["toolchains"] = [{**asdict(t), "problems": list(t.problems)} for t in self.toolchains]
        data["checked_at"] = self.checked_at.isoformat()
        return data


# what a device may report as a version, a name or a mode (its answers are hostile input like any other): no
# markup, quotes, control characters or path tricks, at most 100 characters
_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+:~()/,=-]{0,99}\Z")
_TEXT_RULE = "letters, digits, spaces and ._+:~()/,=- (at most 100, starting with a letter or digit)"
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?[A-Za-z0-9.+-]{0,40}\Z")


def _shown(value: Any) -> str:
    """A value a device sent, for a problem: its repr (quotes and escapes make control characters visible),
    at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Answers:
    """Reads a device's JSON answers field by field: a value of the wrong type or form becomes a problem that
    names the field, the value and what is valid (the device is unhealthy), never an exception."""

    def __init__(self, what: str, data: dict[str, Any], problems: list[str]) -> None:
        self.what, self.data, self.problems = what, data, problems

    def _bad(self, key: str, value: Any, valid: str) -> None:
        self.problems.append(f"{self.what} answered {key} = {_shown(value)}; valid: {valid}")

    def text(self, key: str, value: Any = None, *, pattern: re.Pattern[str] = _TEXT,
             rule: str = _TEXT_RULE) -> str | None:
        value = self.data.get(key) if value is None else value
        if value is None or (isinstance(value, str) and pattern.match(value)):
            return value
        self._bad(key, value, rule)
        return None

    def count(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        self._bad(key, value, "a whole number of bytes, 0 or more")
        return None

    def flag(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is None or isinstance(value, bool):
            return value
        self._bad(key, value, "true, false or null")
        return None

    def block(self, key: str, field: str) -> str | None:
        """``data[key][field]``: a text in an object (``{"version": "12.6"}``)."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self._bad(key, value, f'an object like {{"{field}": "..."}} or null')
            return None
        return self.text(f"{key}.{field}", value.get(field))

    def items(self, key: str) -> list[dict[str, Any]]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self._bad(key, value, "a list of objects or null")
            return []
        return value

    def temperatures(self) -> list[float]:
        temps = []
        for zone in self.items("thermal"):
            t = zone.get("temp_c")
            if t is None:
                continue
            if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and -100 <= t <= 300:
                temps.append(float(t))
            else:
                self._bad("thermal.temp_c", t, "degrees Celsius between -100 and 300, or null")
        return temps


# each toolchain of the device's type that the device can drive, once per build it lists, checked over the open
# transport (``toolchains.health.device_toolchains``)
ToolchainCheck = Callable[[Device, DeviceType, Transport], list[ToolchainHealth]]


def check_device(
    device: Device, device_type: DeviceType, *, toolchains: ToolchainCheck, min_free_gb: float = 1.0,
    timeout: float = 60.0, transport: Transport | None = None
) -> HealthReport:
    """Probe one device (of ``device_type``), its toolchains with ``toolchains``. Never raises for a device
    problem: it is in the report (unreachable, problems)."""
    start = time.monotonic()
    base = {
        "device_id": device.id,
        "platform": str(device.platform),
        "transport": str(device.transport),
        "address": device.address,
    }
    own = transport is None
    problems: list[str] = []
    notes: list[str] = []
    try:
        link = transport if transport is not None else open_transport(device)
    except EdgeLLMError as err:
        return HealthReport(**base, reachable=False, healthy=False, problems=(str(err),), error_kind=err.kind,
                            duration=time.monotonic() - start)
    try:
        try:
            env = agent_client.run(device, link, "env", "--work-dir", ".", timeout=timeout)
        except DeviceConfigurationError as err:  # the device answers, its python3 does not run the agent
            return HealthReport(**base, reachable=True, healthy=False, problems=(str(err),),
                                error_kind=err.kind, duration=time.monotonic() - start)
        health = toolchains(device, device_type, link)
        cache = agent_client.run(device, link, "cache", "usage", "--cache", "cache", timeout=timeout)
    except EdgeLLMError as err:
        log.warning("%s: unreachable: %s", device.id, err)
        return HealthReport(**base, reachable=False, healthy=False, problems=(str(err),), error_kind=err.kind,
                            duration=time.monotonic() - start)
    finally:
        if own:
            link.close()
    answers = Answers("its agent (env)", env, problems)
    python = answers.text("python", pattern=_VERSION, rule="a Python version like '3.10.12'")
    parts = tuple(int(p) for p in str(python or "").split(".")[:2] if p.isdigit())
    if python is not None and parts < MIN_PYTHON:
        problems.append(f"Python {python} is too old (the agent needs {'.'.join(map(str, MIN_PYTHON))}+)")
    free = answers.count("disk_free_bytes")
    if free is not None and free / 2**30 < min_free_gb:
        problems.append(f"only {free / 2**30:.2f} GiB free in {device.work_dir} (needs {min_free_gb:g} GiB)")
    arch = answers.text("machine")
    if arch is not None:
        arch = _ARCH_ALIASES.get(arch, arch)
        if arch != device_type.arch:
            problems.append(f"reports architecture {arch} but type {device.type} is {device_type.arch}")
    for t in health:
        problems.extend(f"{t.name}{f' {t.build}' if t.build else ''}: {p}" for p in t.problems)
    if not health:
        problems.append(f"no toolchain of type {device.type} ({', '.join(device_type.toolchains)}) can run "
                        f"on it: add the toolchain's block to its inventory file (toolchains: {{name: {{...}}}})")
    power_mode = answers.block("power_mode", "name")
    dtype = device_type
    if dtype.bench_power_mode is not None and power_mode != dtype.bench_power_mode:
        notes.append(f"power mode {power_mode or 'unknown'}: {dtype.name} benchmarks at "
                     f"{dtype.bench_power_mode} (benchmarks here are recorded as off-conditions)")
    clocks_locked = answers.flag("clocks_locked")
    if dtype.bench_clocks_locked and clocks_locked is not True:
        notes.append("clocks not locked (run jetson_clocks): benchmarks here are recorded as off-conditions")
    temps = answers.temperatures()
    l4t = answers.block("l4t", "release")
    jetpack, cuda, gpu_driver = (answers.block(key, "version") for key in ("jetpack", "cuda", "gpu_driver"))
    usage = Answers("its agent (cache usage)", cache, problems)
    used = usage.count("total_bytes")
    if used is not None and used > device.cache_max_bytes:
        notes.append(f"cache holds {used / 2**30:.2f} GiB, over its {device.cache_max_gb:g} GiB bound (the next "
                     f"stage evicts the least recently used entries)")
    entries = usage.items("entries")
    edgellm = next((t.version for t in health if t.name.startswith("edgellm") and t.version), None)
    return HealthReport(
        **base,
        reachable=True,
        healthy=not problems,
        python_version=python,
        edgellm_version=edgellm.split("+")[0] if edgellm else None,
        disk_free_bytes=free,
        arch=arch,
        l4t=l4t,
        jetpack=jetpack,
        cuda=cuda,
        gpu_driver=gpu_driver,
        power_mode=power_mode,
        clocks_locked=clocks_locked,
        temp_max_c=max(temps) if temps else None,
        toolchains=tuple(health),
        cache_bytes=used,
        cache_max_bytes=device.cache_max_bytes,
        cache_entries=len(entries),
        cache_in_use=sum(1 for e in entries if e.get("in_use") is True),
        problems=tuple(problems),
        notes=tuple(notes),
        duration=time.monotonic() - start,
    )


def check_inventory(
    inventory: Inventory, device_types: Mapping[str, DeviceType], *, toolchains: ToolchainCheck,
    min_free_gb: float = 1.0, timeout: float = 60.0, parallel: int = 8
) -> list[HealthReport]:
    """Every device's report (each of its type in ``device_types``), probed in parallel, in inventory order."""
    devices = list(inventory)
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(devices)))) as pool:
        return list(pool.map(lambda d: check_device(d, device_types[d.type], toolchains=toolchains,
                                                    min_free_gb=min_free_gb, timeout=timeout), devices))
