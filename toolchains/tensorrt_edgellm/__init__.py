"""NVIDIA's TensorRT Edge-LLM toolchain (``tensorrt-edgellm`` on PyPI), driven by the farm.

Host side (runs here, CPU or CUDA): an isolated environment per version (env), the shipped calibration text
(calibration), quantize with a per-linear quantization report (quantize), ONNX export (export) and its structural
check (onnx_check); the bring-up checks of a checkpoint against its model registry and its own model, run inside
its environment, and a few-layer export (bringup, model_probe, layouts). Device side (TensorRT devices only):
argument lists and environments for the C++ tools ``llm_build`` / ``llm_inference`` / ``llm_bench`` and the direct
builder ``tensorrt-edgellm-build`` (device).
Everything is a plain function so the farm's stage table can call it.
"""

from __future__ import annotations

TOOLCHAIN = "tensorrt-edgellm"  # the toolchain name (contract: also the PyPI distribution name)
DEFAULT_VERSION = "0.11.0"

from edgefarm.toolchains.tensorrt_edgellm import driver as driver  # noqa: E402  (registers the farm's driver)
