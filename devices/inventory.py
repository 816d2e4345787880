"""The device inventory: one short YAML file per device, its id the file stem.

The farm's settings choose the directory (``--inventory DIR``, else ``$EDGEFARM_INVENTORY``, else the packaged
``devices/inventory/``) and the data dir. Loading validates every file and reports every problem at once (one
ConfigurationError, one line each), before anything connects to a device.

What a device holds of a toolchain is its block in ``toolchains: {name: {...}}``, validated by that toolchain's
driver when the file loads (``DeviceStages.device_config``, asked through the registries' toolchain answers
:func:`load_inventory` is handed, ``devices.toolchain_names``: this package asks no toolchain; e.g. where a vendor's
tools are installed on the device). A toolchain whose driver needs such a block runs only on devices that have it.

Paths: ``key_file`` and ``known_hosts`` relative to the inventory directory; ``work_dir`` of a local device
relative to the farm's data dir (given to :func:`load_inventory`); ``work_dir`` of an ssh device absolute or
relative to the login directory. A work dir is the farm's own (it keeps and evicts a cache there): never ``/`` or
the base it is relative to, never through ``..``. A host or user is a name, never something an ssh command line
could take for an option (``-oProxyCommand=...``).
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import paramiko
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from edgefarm.devices._yaml import read_yaml_mapping, validation_problems
from edgefarm.devices.site import PATTERNS
from edgefarm.devices.toolchain_names import ToolchainNames
from edgefarm.devices.types import DeviceType, load_device_types
from edgellm.errors import ConfigurationError

PACKAGED_INVENTORY_DIR = Path(__file__).resolve().parent / "inventory"
INVENTORY_ENV = "EDGEFARM_INVENTORY"  # read by the farm's settings; named in messages
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# a host name, IPv4 or IPv6 address (an IPv6 zone after %); a user name as useradd takes it
_HOST = re.compile(r"[A-Za-z0-9_:\[](?:[A-Za-z0-9._:%\[\]-]{0,252}[A-Za-z0-9\]])?", re.ASCII)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}", re.ASCII)
DEFAULT_CACHE_MAX_GB = 20.0  # a few quantized small-model engines; a 64 GB Orin holds a handful of 8B ones


class TransportKind(enum.StrEnum):
    LOCAL = "local"  # this machine, a subprocess
    SSH = "ssh"  # a remote machine over SSH (paramiko), host key pinned


_SSH_ONLY = ("host", "user", "key_file", "host_key", "known_hosts")


class Device(BaseModel):
    """One device of the farm. ``id`` is the file stem; ``type`` names a device type (= the platform)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    type: str
    transport: TransportKind = TransportKind.SSH
    host: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    key_file: Path | None = None
    host_key: str | None = None  # pinned "ssh-ed25519 AAAA..."
    known_hosts: Path | None = None
    work_dir: str = Field(min_length=1)
    labels: tuple[str, ...] = ()
    max_jobs: int = Field(default=1, ge=1, le=256)
    # the device's Python 3.8+ (runs the farm's stdlib-only agent; the edgellm toolchains also need edgellm importable
    # by it); default python3 (ssh) / this one (local)
    python: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # set for every command on the device (PATH, PYTHONPATH...)
    connect_timeout: float = Field(default=10.0, gt=0, le=300)
    toolchains: dict[str, Any] = Field(default_factory=dict)  # toolchain name -> its block (see module doc)
    # the bound of its artifact cache (staged inputs, engines it built): least recently used entries go first
    cache_max_gb: float = Field(default=DEFAULT_CACHE_MAX_GB, gt=0, le=100_000)

    @property
    def cache_max_bytes(self) -> int:
        return int(self.cache_max_gb * 2**30)

    @property
    def platform(self) -> str:
        """The device type's name (= the platform)."""
        return self.type

    @property
    def interpreter(self) -> str:
        """The Python the farm runs on the device (its agent; edgellm's own toolchains' commands)."""
        if self.python is not None:
            return self.python
        return sys.executable if self.transport is TransportKind.LOCAL else "python3"

    @property
    def address(self) -> str:
        return "local" if self.transport is TransportKind.LOCAL else f"{self.host}:{self.port}"

    def has_labels(self, labels: set[str] | frozenset[str]) -> bool:
        return labels <= set(self.labels)


_DEVICE_KEYS = list(Device.model_fields)


def parse_host_key(text: str) -> paramiko.PKey:
    """A pinned ``"<type> <base64>"`` host key as a paramiko key; ValueError names what is wrong."""
    parts = text.split()
    if len(parts) < 2:
        raise ValueError(f"host_key must be '<type> <base64 key>' as in known_hosts, got {text!r}")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1], validate=True))
    except (binascii.Error, paramiko.SSHException, ValueError) as err:
        raise ValueError(f"host_key {text[:40]!r}... is not a valid {parts[0]} public key ({err})") from None


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _check_device(device: Device, path: Path, registry: ToolchainNames | None) -> list[str]:
    problems: list[str] = []
    bad_env = [k for k in device.env if not (k.isidentifier() and k.isascii())]
    if bad_env:
        problems.append(f"{path}: env: invalid variable names {bad_env}; use letters, digits and _")
    for name, block in device.toolchains.items():
        try:
            if registry is not None:
                registry.device_config(name, block, device.id)
        except ConfigurationError as err:
            problems.append(f"{path}: toolchains.{name}: {err}")
    if device.transport is TransportKind.LOCAL:
        for key in _SSH_ONLY:
            if getattr(device, key) is not None:
                problems.append(f"{path}: {key}: only for transport ssh (this device is local)")
        return problems
    for key in ("host", "user", "key_file"):
        if getattr(device, key) is None:
            problems.append(f"{path}: {key}: required for transport ssh")
    if device.key_file is not None and not device.key_file.is_file():
        problems.append(f"{path}: key_file: {device.key_file} does not exist")
    if device.host_key is None and device.known_hosts is None:
        problems.append(f"{path}: host_key: pin the host key (host_key: 'ssh-ed25519 AAAA...') or set known_hosts")
    if device.host_key is not None and device.known_hosts is not None:
        problems.append(f"{path}: set one of host_key or known_hosts, not both")
    if device.host_key is not None:
        try:
            parse_host_key(device.host_key)
        except ValueError as err:
            problems.append(f"{path}: host_key: {err}")
    if device.known_hosts is not None and device.host is not None:
        if not device.known_hosts.is_file():
            problems.append(f"{path}: known_hosts: {device.known_hosts} does not exist")
        else:
            name = known_hosts_name(device.host, device.port)
            if paramiko.HostKeys(str(device.known_hosts)).lookup(name) is None:
                problems.append(f"{path}: known_hosts: {device.known_hosts} has no key for {name}")
    if device.work_dir.startswith("~"):
        problems.append(f"{path}: work_dir: {device.work_dir!r}: use an absolute path or one relative to the home")
    if device.host is not None and not _HOST.fullmatch(device.host):
        problems.append(f"{path}: host: {device.host!r} is not a host name or IP address (letters, digits, '.', "
                        f"'-', ':'; never starting with '-', which ssh would take for an option)")
    if device.user is not None and not _USER.fullmatch(device.user):
        problems.append(f"{path}: user: {device.user!r} is not a user name (letters, digits, '.', '_', '-', at "
                        f"most 32; never starting with '-', which ssh would take for an option)")
    return problems


def _work_dir_problem(value: str, local: bool) -> str | None:
    """Why ``value`` cannot be a device's work dir (checked as written, before it is made absolute), or None."""
    base = "the farm's data dir" if local else "the login directory"
    if not value:
        return None  # the field's own check says it is required
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"{value!r} has control characters; use a plain path"
    parts = PurePosixPath(value).parts
    if ".." in parts:
        return (f"{value!r} goes up through '..' (out of {base} or up to /); use an absolute path or one relative "
                f"to {base}, without '..'")
    if all(p in ("/", "//", ".") for p in parts):
        return (f"{value!r} is {'/' if value.startswith('/') else base} itself: the farm keeps and evicts a cache "
                f"in its work dir, so give it a directory of its own (e.g. devices/<id> or /var/lib/edgefarm)")
    return None


def _resolve_paths(data: dict[str, Any], directory: Path, data_dir: Path) -> dict[str, Any]:
    data = dict(data)
    for key in ("key_file", "known_hosts"):
        if isinstance(data.get(key), str):
            data[key] = directory / Path(data[key]).expanduser()
    if data.get("transport") == TransportKind.LOCAL and isinstance(data.get("work_dir"), str):
        data["work_dir"] = str((data_dir / Path(data["work_dir"]).expanduser()).absolute())
    return data


def _validate(data: dict[str, Any], root: Path, path: Path, data_dir: Path,
              registry: ToolchainNames | None) -> tuple[Device | None, list[str]]:
    """The device and every problem of its file (cross-field checks too, on the fields that did parse)."""
    raw = data.get("work_dir")
    work_dir = _work_dir_problem(raw, data.get("transport") == TransportKind.LOCAL) if isinstance(raw, str) else None
    device, problems = _validate_fields(data, root, path, data_dir, registry)
    if work_dir is not None:
        return None, [f"{path}: work_dir: {work_dir}", *problems]
    return device, problems


def _validate_fields(data: dict[str, Any], root: Path, path: Path, data_dir: Path,
                     registry: ToolchainNames | None) -> tuple[Device | None, list[str]]:
    resolved = _resolve_paths(data, root, data_dir)
    try:
        device = Device.model_validate(resolved)
    except pydantic.ValidationError as err:
        problems = validation_problems(path, err, valid_keys=_DEVICE_KEYS)
        bad = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
        try:
            partial = Device.model_validate({k: v for k, v in resolved.items() if k not in bad})
        except pydantic.ValidationError:
            return None, problems
        more = [p for p in _check_device(partial, path, registry)
                if p.removeprefix(f"{path}: ").split(":")[0] not in bad]
        return None, problems + more
    return device, _check_device(device, path, registry)


class DeviceRegistries(Protocol):
    """What an inventory is checked against (``registries.Registries``)."""

    @property
    def site_dir(self) -> Path | None: ...

    @property
    def toolchains(self) -> ToolchainNames: ...

    @property
    def device_types(self) -> Mapping[str, DeviceType]: ...


@dataclass(frozen=True)
class Inventory:
    directory: Path
    devices: dict[str, Device]  # by id, sorted
    platforms: tuple[str, ...] = ()  # the device types it was checked against (empty: any name)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices.values())

    def __len__(self) -> int:
        return len(self.devices)

    def get(self, device_id: str) -> Device:
        try:
            return self.devices[device_id]
        except KeyError:
            valid = ", ".join(self.devices) or "(none)"
            raise ConfigurationError(f"unknown device {device_id!r} in {self.directory}; valid: {valid}") from None

    def select(self, *, platform: str | None = None, labels: set[str] | None = None) -> list[Device]:
        wanted = None if platform is None else str(platform).strip().lower()
        if wanted is not None and self.platforms and wanted not in self.platforms:
            raise ConfigurationError(f"unknown platform {platform!r}; valid: {', '.join(self.platforms)}")
        return [
            d for d in self if (wanted is None or d.type == wanted) and (labels is None or d.has_labels(labels))
        ]


def _device_files(root: Path, site_dir: Path | None) -> list[Path]:
    """The device files of ``root``; for the packaged inventory, with the site directory's ``inventory/`` files
    (``devices.site``) added, a site file replacing the packaged one of its device id."""
    files = sorted(p for pattern in PATTERNS["inventory"] for p in root.glob(pattern))
    site = None if site_dir is None or root.resolve() != PACKAGED_INVENTORY_DIR else site_dir / "inventory"
    if site is None or not site.is_dir():
        return files
    added = sorted(p for pattern in PATTERNS["inventory"] for p in site.glob(pattern))
    replaced = {p.stem.lower() for p in added}
    return [p for p in files if p.stem.lower() not in replaced] + added


def load_inventory(directory: Path | str = PACKAGED_INVENTORY_DIR, *, data_dir: Path | str,
                   registries: DeviceRegistries | None = None) -> Inventory:
    """Every device file in ``directory``, validated against ``registries`` (the farm's: its device types, its
    toolchains' checks of their blocks, its site directory); all problems in one error. None: the packaged device
    types and devices alone (no site directory), toolchain blocks kept as written. A local device's relative
    ``work_dir`` is under ``data_dir``."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigurationError(f"inventory directory {root} does not exist (set --inventory or ${INVENTORY_ENV})")
    if registries is None:
        site_dir, registry = None, None
        types: Mapping[str, DeviceType] = load_device_types()
    else:
        site_dir, registry, types = registries.site_dir, registries.toolchains, registries.device_types
    problems: list[str] = []
    devices: dict[str, Device] = {}
    seen: dict[str, Path] = {}
    for path in _device_files(root, site_dir):
        device_id = path.stem
        if not _ID.match(device_id):
            problems.append(f"{path}: device id {device_id!r} (the file name) must match {_ID.pattern}")
            continue
        if device_id.lower() in seen:
            problems.append(f"{path}: duplicate device id {device_id!r} (also {seen[device_id.lower()]})")
            continue
        seen[device_id.lower()] = path
        try:
            data = read_yaml_mapping(path)
        except ConfigurationError as err:
            problems.append(str(err))
            continue
        if "id" in data and data["id"] != device_id:
            problems.append(f"{path}: id: {data['id']!r} must equal the file name {device_id!r}")
            continue
        data["id"] = device_id
        misplaced = [k for k in data if registry is not None and k.replace("_", "-") in registry.names()]
        if misplaced:
            problems += [f"{path}: {k}: a toolchain's block goes under toolchains: "
                         f"{{{k.replace('_', '-')}: {{...}}}}" for k in misplaced]
            continue
        type_problem = isinstance(data.get("type"), str) and data["type"] not in types
        if type_problem:
            problems.append(f"{path}: type: unknown device type {data['type']!r}; valid: {', '.join(types)}")
        device, found = _validate(data, root, path, Path(data_dir), registry)
        problems.extend(found)
        if device is not None and not found and not type_problem:
            devices[device_id] = device
    if problems:
        raise ConfigurationError(f"invalid inventory {root}:\n" + "\n".join(problems))
    if not devices:
        raise ConfigurationError(f"no devices (*.yaml) in inventory directory {root}")
    return Inventory(directory=root, devices=dict(sorted(devices.items())), platforms=tuple(types))
