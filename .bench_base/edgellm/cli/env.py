"""``edgellm env``: what this machine offers the library (versions, backends and capabilities), as JSON.

The farm runs it on each device for health checks and to key engine caches by the backend version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path

from edgellm import __version__
from edgellm.build_id import build_id
from edgellm.files import write_text_atomic

NAME = "env"
HELP = "print versions of edgellm, Python and the inference backends on this machine, as JSON"

# The packages a machine's results depend on (the one list: the farm records these, plus its own, for every run).
PACKAGES = ("onnxruntime", "onnx", "torch", "transformers", "tokenizers", "tensorrt")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """The installed version of each distribution in ``names`` (None: not installed)."""
    versions: dict[str, str | None] = {}
    for pkg in names:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="also write the JSON to this file")


def collect() -> dict[str, object]:
    from edgellm.capabilities import capabilities

    versions = package_versions()
    caps = capabilities()
    backends = [name for name, b in caps["backends"].items() if b["available"]]
    gpu, gpu_reason = None, "torch is not installed"
    if versions["torch"]:
        from edgellm.backends.torch_cuda import cuda_unavailable_reason, gpu_info

        gpu, gpu_reason = gpu_info(), cuda_unavailable_reason()
    return {
        "edgellm": __version__,
        "edgellm_build": build_id(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
        "backends": backends,
        "capabilities": caps,
        "gpu": gpu,  # name, SM (compute capability), memory of the GPU torch-cuda runs on; null without one
        "gpu_unavailable_reason": gpu_reason,
    }


def run(args: argparse.Namespace) -> int:
    text = json.dumps(collect(), indent=2, sort_keys=True)
    if args.output:  # first: a refused output path prints nothing
        write_text_atomic(Path(args.output), text + "\n")
    print(text)
    return 0
