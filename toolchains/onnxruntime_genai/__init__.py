"""Microsoft's onnxruntime-genai toolchain (its model builder and its ``generate()`` runtime), as plain parts.

Host side: the model builder run offline in a subprocess, what it can and cannot build (export), what it produced
read back with the precision actually found (check), the accuracy report of the device's logits file against the
farm's float reference, scored by edgellm's own comparison code and thresholds (accuracy), the runner's benchmark
JSON as farm metrics (bench), the runner's argument lists and exit-code kinds (device). Device side: one
self-contained script (``runner.py``: stdlib + numpy + onnxruntime_genai, Python 3.8+) the farm pushes and runs
with the device's Python. Nothing here registers a driver; the farm's driver class composes these parts.
"""

from __future__ import annotations

TOOLCHAIN = "onnxruntime-genai"  # the toolchain name
DISTRIBUTION = "onnxruntime-genai"  # the PyPI distribution whose version is the toolchain's (builder and runtime)

from edgefarm.toolchains.onnxruntime_genai import driver as driver  # noqa: E402  (registers the farm's driver)
