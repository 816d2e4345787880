"""Where a test's data dir gets its tensorrt-edgellm environment from."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from edgefarm.toolchains.tensorrt_edgellm.driver import PINNED_VERSION, pinned_env, version_env
from edgefarm.toolchains.tensorrt_edgellm.env import CONSOLE_SCRIPTS, script


def stand_in_toolchain_env(data_dir: Path) -> Path:
    """STAND-IN for planning only: the files the driver's availability reads of the pinned environment (its
    version's metadata, its console scripts); nothing in it runs, so it never produces evidence."""
    env = pinned_env(data_dir)
    info = env / "lib" / "python3.12" / "site-packages" / f"tensorrt_edgellm-{PINNED_VERSION}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Name: tensorrt-edgellm\nVersion: {PINNED_VERSION}\n")
    (env / "bin").mkdir()
    for name in CONSOLE_SCRIPTS:
        (env / "bin" / name).write_text("#!/bin/false\n")
    return env


def link_real_toolchain(data_dir: Path, trt_env: Path) -> Path:
    """The real, session-installed environment (the ``trt_env`` fixture) seen from ``data_dir``'s toolchains dir."""
    root = pinned_env(data_dir).parent
    root.parent.mkdir(parents=True, exist_ok=True)
    root.symlink_to(trt_env.parent, target_is_directory=True)
    return pinned_env(data_dir)


RELABEL = "relabel"  # the local version label of the stand-in second version


def relabelled_toolchain_env(data_dir: Path, trt_env: Path, label: str = RELABEL) -> tuple[str, Path]:
    """STAND-IN for a second tensorrt-edgellm release (the registry has one): the real ``trt_env`` release under the
    version ``<pinned>+<label>``, as ``<data dir>/toolchains/tensorrt-edgellm-<pinned>+<label>``. A thin venv of the
    same base interpreter whose site-packages reach ``trt_env``'s through a ``.pth`` file, with the release's
    dist-info copied ahead of it under the new version and the console scripts re-pointed at its interpreter: the
    tools that run are the real 0.11.0 code, only the version they report differs. Seconds, no download."""
    version = f"{PINNED_VERSION}+{label}"
    env = version_env(data_dir, version)
    base = next(line.split("=", 1)[1].strip() for line in (trt_env / "pyvenv.cfg").read_text().splitlines()
                if line.startswith("executable"))
    subprocess.run([base, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    (real_site,) = sorted(trt_env.resolve().glob("lib/python3*/site-packages"))
    site = env / "lib" / real_site.parent.name / "site-packages"
    (site / "_release.pth").write_text(f"{real_site}\n")
    real_info = real_site / f"tensorrt_edgellm-{PINNED_VERSION}.dist-info"
    info = site / f"tensorrt_edgellm-{version}.dist-info"
    shutil.copytree(real_info, info)
    metadata = (info / "METADATA").read_text()
    (info / "METADATA").write_text(metadata.replace(f"\nVersion: {PINNED_VERSION}\n", f"\nVersion: {version}\n", 1))
    for name in CONSOLE_SCRIPTS:
        body = script(trt_env, name).read_text().split("\n", 1)[1]
        path = script(env, name)
        path.write_text(f"#!{env / 'bin' / 'python'}\n{body}")
        path.chmod(0o755)
    return version, env


def link_release(data_dir: Path, trt_env: Path) -> Path:
    """The real, session-installed pinned environment linked into ``data_dir``'s own toolchains dir (which stays
    the farm's: other versions may be added beside it)."""
    env = pinned_env(data_dir)
    env.parent.mkdir(parents=True, exist_ok=True)
    env.symlink_to(trt_env, target_is_directory=True)
    return env
