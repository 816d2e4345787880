"""TensorRT Edge-LLM's own documentation layout (its 0.11.0 pages, docs/source/user_guide/getting_started/
supported-models.md and support-matrix.md, read in the public fork guswns531/TensorRT-Edge-LLM at 83f5f76), which
``edgefarm docs`` fills from the farm's evidence (``pages/docs_layout.py``), and how the TensorRT version of a board
is read from its recorded environment for the platform table."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from edgefarm.toolchains.base import DocsLayout
from edgefarm.toolchains.tensorrt_edgellm import TOOLCHAIN


def tensorrt_version(data: Mapping[str, Any]) -> str | None:
    """TensorRT's version in a device environment: its dpkg packages (JetPack's tensorrt / libnvinfer*), else the
    versioned libnvinfer the toolchain's probe found."""
    found = data.get("toolchain")
    toolchain: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    for packages in (data.get("packages"), toolchain.get("packages")):
        if isinstance(packages, Mapping):
            for name in sorted(packages, key=lambda n: (n != "tensorrt", n)):
                if (name == "tensorrt" or name.startswith("libnvinfer")) and packages[name]:
                    return re.split(r"[-+~]", str(packages[name]))[0]
    libs = toolchain.get("libs")
    if isinstance(libs, Mapping):
        for lib in libs.values():
            version = re.search(r"libnvinfer\.so\.(\d+(?:\.\d+)+)", str(lib))
            if version:
                return version.group(1)
    return None


LAYOUT = DocsLayout(
    toolchain=TOOLCHAIN,
    directory="edge-llm",
    product="TensorRT Edge-LLM",
    sdk_column="TensorRT",
    sdk_version=tensorrt_version,
    official="a Jetson device type (aarch64 with an integrated GPU), the deployment target TensorRT Edge-LLM is "
             "released for",
    source="TensorRT Edge-LLM 0.11.0's docs (docs/source/user_guide/getting_started/)",
)
