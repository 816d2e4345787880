"""What a result's number depends on, recorded with it (``results.environment``).

A device stage's record is its device's environment as the agent read it at the run's first contact (the stable
part: L4T/JetPack, CUDA, the GPU driver, the board, Python, power mode and whether clocks are locked) with what the
job's toolchain's checks read there (its build's release and source revision, its runtime libraries and packages).
A benchmark adds the volatile part (clocks, temperatures, free memory, power mode) just before and just after each of
its commands. Everything else (host stages, rows the plan decided) records the orchestrator's environment, read the
same way in this process. Paths are left out (records reach pages and reports).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from typing import Any

from edgefarm.devices import agent as agent_module
from edgefarm.devices.types import DeviceType

# the agent's env keys that stay put while a run lasts (the others are read around a benchmark)
STABLE = ("schema", "python", "python_implementation", "system", "machine", "kernel", "libc", "cpu_model",
          "board_model", "memory_total_bytes", "l4t", "jetpack", "cuda", "gpu_driver", "power_mode",
          "clocks_locked", "packages")
VOLATILE = ("power_mode", "clocks_locked", "gpu_clock", "emc_clock", "thermal", "memory_available_bytes")
_GPU_KEYS = ("name", "compute_cap", "driver_version", "memory_total_mib", "power_limit_w")


def _stable(env: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: env.get(k) for k in STABLE if env.get(k) is not None}
    gpus = env.get("gpus")
    if isinstance(gpus, list) and gpus:
        out["gpus"] = [{k: g.get(k) for k in _GPU_KEYS} for g in gpus if isinstance(g, Mapping)]
    return out


def _without_paths(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_paths(v) for k, v in value.items() if k not in ("source_dir", "source")}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return value.rsplit("/", 1)[-1]  # a resolved file (e.g. a library): its name says its release
    return value


def toolchain_record(name: str, version: str | None, facts: Mapping[str, Any]) -> dict[str, Any]:
    """What a toolchain's probe read on the device, without paths: builds by release and revision, libraries,
    packages, and whatever its own probe printed."""
    record: dict[str, Any] = {"name": name, "version": version}
    builds = facts.get("builds")
    if isinstance(builds, Mapping):
        record["builds"] = [_without_paths(b) for b in builds.values()]
    libs = facts.get("libs")
    if isinstance(libs, Mapping):
        record["libs"] = {k: _without_paths(v) for k, v in sorted(libs.items())}
    if facts.get("packages"):
        record["packages"] = facts["packages"]
    extra = {k: v for k, v in facts.items() if k not in ("builds", "libs", "packages", "tools", "problems", "ok")}
    if extra:
        record["probe"] = _without_paths(extra)
    return record


def device_record(device_id: str, platform: str, env: Mapping[str, Any], toolchain: str | None,
                  version: str | None) -> dict[str, Any]:
    """A device stage's environment record (``env``: the device's, with ``toolchains`` as toolchain_env made it)."""
    record: dict[str, Any] = {"where": "device", "device": device_id, "platform": platform, **_stable(env)}
    facts = (env.get("toolchains") or {}).get(toolchain) if toolchain else None
    if toolchain is not None:
        record["toolchain"] = toolchain_record(toolchain, version, facts or {})
    return record


def snapshot(env: Mapping[str, Any]) -> dict[str, Any]:
    """The volatile part of an environment (around a benchmark): clocks, temperatures, free memory, power mode."""
    return _without_paths({k: env.get(k) for k in VOLATILE})


@functools.cache
def host_record() -> dict[str, Any]:
    """The orchestrator's environment (read once per process by the agent's own code)."""
    data, _, _ = agent_module.cmd_env(argparse.Namespace(root=None, work_dir=None, dpkg=None))
    return {"where": "orchestrator", **_stable(data)}


def bench_conditions(dtype: DeviceType, before: Mapping[str, Any]) -> str | None:
    """How the board differed from its device type's declared benchmark conditions just before a benchmark (None:
    as declared, or the type declares none). Such a benchmark is recorded as such and never compared with runs in
    the declared conditions."""
    problems = []
    mode = (before.get("power_mode") or {}).get("name") if isinstance(before.get("power_mode"), Mapping) else None
    if dtype.bench_power_mode is not None and mode != dtype.bench_power_mode:
        problems.append(f"power mode {mode or 'unknown'} (type {dtype.name} benchmarks at {dtype.bench_power_mode})")
    locked = before.get("clocks_locked")
    if dtype.bench_clocks_locked and locked is not True:
        problems.append("clocks not locked (jetson_clocks)" if locked is False else "clock lock state unknown")
    return "; ".join(problems) or None
