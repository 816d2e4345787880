"""What a toolchain finds on a device: the files its driver requires (``DeviceStages.device_requirements``,
checked by the agent), what contradicts the inventory (``device_facts_problem``) and what its own probe prints
(``probe_step``). The stages (once per device, toolchain and run) and the health check both ask here; a device set up
wrong for the toolchain raises ``DeviceConfigurationError`` naming every problem (the stages quarantine it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from edgefarm.devices import agent_client
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import Transport
from edgefarm.toolchains.base import DeviceRequirements, ToolchainDriver
from edgellm.errors import DeviceConfigurationError, InfrastructureError


def requirement_args(needs: DeviceRequirements) -> list[str]:
    """``agent check`` arguments for a driver's requirements."""
    args = ["check"]
    for name, path in sorted(needs.tools.items()):
        args += ["--tool", f"{name}={path}"]
    for lib in needs.lib_dirs:
        args += ["--lib", lib]
    for pattern in needs.libs:
        args += ["--needs-lib", pattern]
    for path in needs.files:
        args += ["--file", path]
    for build in needs.build_dirs:
        args += ["--build-dir", build]
    return args


def stage_file(transport: Transport, path: Path) -> str:
    """A file of ours in the device's cache as ``cache/<its sha256>`` (kept when already there intact)."""
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    remote = f"cache/{digest}"
    found = transport.run(["sha256sum", "--", remote], timeout=60)
    if not (found.ok and found.stdout[:64] == digest):
        transport.run(["mkdir", "-p", "cache"], timeout=60)
        transport.put(Path(path), remote)
    return remote


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else "(no output)"


def probe_toolchain(device: Device, transport: Transport, driver: ToolchainDriver) -> dict[str, Any]:
    """The toolchain's facts on ``device`` (the agent's check JSON, the packages it names, what its probe printed);
    DeviceConfigurationError when something it needs is missing or contradicts the inventory."""
    where = f"{device.id}: toolchain {driver.name}"
    facts: dict[str, Any] = {}
    needs = driver.device().device_requirements(device)
    if needs is not None:
        found = agent_client.run(device, transport, *requirement_args(needs), no_ok=True)
        # a library dir that does not exist is fine while another holds each library: only the libraries count
        listed = found.get("problems") or []
        if not isinstance(listed, list):
            raise DeviceConfigurationError(f"{where}: the agent's check answered problems = {repr(listed)[:80]}; "
                                           f"valid: a list of strings")
        problems = [str(p) for p in listed if not str(p).startswith("lib dir ")]
        if problems:
            raise DeviceConfigurationError(f"{where} is not installed as the inventory says: " + "; ".join(problems))
        facts = found
        if needs.dpkg:
            packaged = agent_client.run(device, transport, "env", "--work-dir", ".",
                                        *[a for glob in needs.dpkg for a in ("--dpkg", glob)])
            facts["packages"] = packaged.get("packages") or {}
        problem = driver.device().device_facts_problem(device, facts)
        if problem is not None:
            raise DeviceConfigurationError(f"{device.id}: {problem}")
    for path in driver.device().device_files():
        stage_file(transport, path)
    probe = driver.device().probe_step(device)
    if probe is not None:
        res = transport.run(probe.argv, timeout=120, env={**device.env, **probe.env} or None)
        if res.exit_code != 0:
            failed = driver.device().classify_exit(res)
            if isinstance(failed, InfrastructureError) and not isinstance(failed, DeviceConfigurationError):
                raise InfrastructureError(f"{where}: its probe failed: {failed}")
            # the toolchain's own probe does not run: what it needs on the device is missing or broken
            raise DeviceConfigurationError(f"{where}: its probe ({' '.join(probe.argv[:4])}) failed with exit "
                                           f"{res.exit_code}: {_last(res.stderr)}")
        printed = agent_client.device_json(f"{where}: its probe", res.stdout)
        if isinstance(printed, dict):
            facts = {**facts, **printed}
    return facts
