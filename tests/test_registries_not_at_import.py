"""Importing the farm discovers nothing: no package is walked (``pkgutil``), no device type or inventory file is
read and no registry is filled until the registries are built (``registries``) — and building them does
all of it, in one place. The library's precision vocabulary (``edgellm.types``' ``Precision``, an enum made at import
from the quantization methods) imports the method modules by name (``edgellm.quant.base.discover``): no walk either."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("vocabulary", "devices", "artifacts", "results", "stages", "toolchains", "tasks", "flows", "test_lists")
SKIP = {"edgefarm.devices.agent"}  # the board agent: a stdlib script pushed to devices, run there as __main__

PROBE = r"""
import importlib, json, pkgutil, sys
from pathlib import Path

walked, read = [], []
real_walk = pkgutil.iter_modules
pkgutil.iter_modules = lambda *a, **k: (walked.append(str(a[0] if a else "")), real_walk(*a, **k))[1]
import edgefarm.devices._yaml as yaml_files
real_read = yaml_files.read_yaml_mapping
yaml_files.read_yaml_mapping = lambda path, *a, **k: (read.append(str(path)), real_read(path, *a, **k))[1]

modules = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
from edgefarm import registries
from edgefarm.devices import toolchain_names, types
from edgefarm.toolchains import base
found = {"walked": walked, "read": read, "discovered": base._discovered,
         "built": bool(registries._built),
         "globals": sorted(n for n in ("DEVICE_TYPES", "Platform") if hasattr(types, n))
                    + sorted(n for n in ("_answers",) if hasattr(toolchain_names, n))}
if "--build" in sys.argv:
    registries.current()
    found["after_build"] = {"walked": len(walked), "read": len(read), "discovered": base._discovered}
print(json.dumps(found))
"""


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(["edgefarm", *(parts[:-1] if parts[-1] == "__init__" else parts)])
            if "migrations" not in parts and parts[-1] != "__main__" and name not in SKIP:
                found.append(name)
    return found


def _probe(*extra: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(_modules()), *extra], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_importing_every_farm_module_discovers_nothing() -> None:
    found = _probe()
    assert found["walked"] == [], f"packages walked at import: {found['walked']}"
    assert found["read"] == [], f"files read at import: {found['read']}"
    assert found["discovered"] is False and found["built"] is False
    assert found["globals"] == [], f"registries held in module globals: {found['globals']}"


def test_building_the_registries_walks_the_toolchains_and_reads_the_device_types() -> None:
    after = _probe("--build")["after_build"]
    assert isinstance(after, dict)
    assert after["discovered"] is True and after["walked"] >= 1
    assert after["read"] == len(list((ROOT / "devices" / "types").glob("*.yaml")))
