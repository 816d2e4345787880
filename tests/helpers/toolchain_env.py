"""Where a test's data dir gets its tensorrt-edgellm environment from."""

from __future__ import annotations

from pathlib import Path

from toolchains.tensorrt_edgellm.driver import PINNED_VERSION, pinned_env
from toolchains.tensorrt_edgellm.env import CONSOLE_SCRIPTS


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
