"""What this edgellm can produce and build, asked of the parts themselves (export and each backend class).

``edgellm capabilities`` prints it as JSON; the farm's plan (toolchains/edgellm/driver.py), ``edgefarm lists validate``
and ``edgellm env`` read it. The shape is a contract between the two halves::

    {"edgellm": "0.1.0",
     "export_precisions": ["fp32", "fp16", "bf16"],
     "export_variants": {"fp16": {"lm_head_precision": "fp16", "kv_cache_precision": "fp16"}, ...},
     "backends": {"ort": {"available": true, "reason": null, "precisions": ["fp32", "fp16", ...],
                          "refused": {"bf16": "ONNX Runtime's CPU execution provider has no bf16 kernels ..."}},
                  "torch-cuda": {"available": false, "reason": "needs an NVIDIA GPU; ...", ...}}}

``precisions`` and ``refused`` are the backend class's own declarations (``EngineBackend.precisions`` /
``.refused``), the same ones ``edgellm build`` checks an export against.
"""

from __future__ import annotations

from typing import Any

from edgellm import __version__
from edgellm.backends.base import backend_class, backend_names
from edgellm.compiler.export import EXPORT_PRECISIONS, export_variant
from edgellm.types import Precision


def backend_capabilities() -> dict[str, dict[str, Any]]:
    """Every backend: the precisions it builds, whether it runs here and if not why."""
    out: dict[str, dict[str, Any]] = {}
    for backend in backend_names():
        cls = backend_class(backend)
        ok, reason = cls.available()
        out[backend] = {"available": ok, "reason": reason, "precisions": [p.value for p in cls.precisions],
                              "refused": {p.value: why for p, why in cls.refused.items()}}
    return out


def buildable(backend: str) -> tuple[Precision, ...]:
    """Weight precisions this edgellm can export *and* ``backend`` can build (whether or not it runs here)."""
    built = set(backend_class(backend).precisions)
    return tuple(p for p in EXPORT_PRECISIONS if p in built)


def capabilities() -> dict[str, Any]:
    variants = {}
    for p in EXPORT_PRECISIONS:
        lm_head, kv_cache = export_variant(p)
        variants[p.value] = {"lm_head_precision": lm_head.value, "kv_cache_precision": kv_cache.value}
    return {
        "edgellm": __version__,
        "export_precisions": [p.value for p in EXPORT_PRECISIONS],
        "export_variants": variants,
        "backends": backend_capabilities(),
    }
