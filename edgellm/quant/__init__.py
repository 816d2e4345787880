"""Quantization methods. Each is one module of this package: a ``QuantizationMethod`` subclass decorated by
``@register_method`` (``base.py`` says what it declares) owning all of the method: its names in ModelOpt's and
Hugging Face's configs, how ModelOpt stores its linear layers, its lowering to ONNX Runtime (or why export refuses
it), the kind of GEMM its engines run, and its accuracy thresholds.

Everything else asks this registry, none keeps a list of methods: ``edgellm.types`` (the ``Precision`` and
``QuantMethod`` vocabularies are built from it), ``edgellm.config`` (quant_algo names), ``edgellm.checkpoint``
(stored formats, scale tensor names), export (lowering, opset, refusals, the manifest's GEMM counts), the backends
(what ONNX Runtime builds and torch-cuda refuses), ``edgellm.thresholds`` (default limits).

Adding a method touches its module here and the one list of the modules, the import in ``base.discover`` (nothing
walks this package). Two more only when it brings a GEMM kind no method had before:
``GemmKind`` in ``base.py`` and how ONNX Runtime's read-back counts it (``quantized_gemms`` in
``edgellm/backends/ort.py``). tests/test_quant_methods.py proves it with a toy method registered from the test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from edgellm.errors import TestFailure, UnsupportedError
from edgellm.quant.base import (
    METHODS,
    GemmKind,
    QuantizationMethod,
    Scale,
    StoredFormat,
    discover,
    methods,
    register_method,
    scalar,
)

if TYPE_CHECKING:
    from edgellm.checkpoint.modelopt import QuantLayout

__all__ = ["GemmKind", "QuantizationMethod", "Scale", "StoredFormat", "check_exportable", "check_gemm_readback",
           "declared_gemms", "exported", "method", "methods", "register_method", "scalar"]


def method(name: str) -> type[QuantizationMethod]:
    """The registered method called ``name`` (a ``Precision`` / ``QuantMethod`` value)."""
    discover()
    return METHODS.get(str(name))


def exported() -> list[type[QuantizationMethod]]:
    """The methods export lowers to ONNX Runtime, by GEMM kind (``GemmKind``'s order), then vocabulary order."""
    kinds = list(GemmKind)
    return sorted((m for m in methods() if m.gemm is not None), key=lambda m: kinds.index(m.gemm))  # type: ignore[arg-type]


def check_exportable(layout: QuantLayout) -> None:
    """Refuse what this export cannot build, naming the reason, before anything is loaded."""
    if layout.kv_cache is not None:  # never a silently float cache
        raise UnsupportedError(f"{layout.source}: a {layout.kv_cache} KV cache (kv_cache_quant_algo) is not "
                               f"exported; the ONNX Runtime engine keeps its cache in fp32: quantize without "
                               f"--kv_cache_quantization")
    buildable = ", ".join(m.name for m in exported())
    for precision in sorted({lin.precision for lin in layout.quantized}):
        m = method(precision.value)
        if m.refused is not None:
            raise UnsupportedError(f"{layout.source}: {m.name} is refused on this platform: {m.refused}; "
                                   f"buildable here: {buildable}")
        if not m.exported():
            raise UnsupportedError(f"{layout.source}: {m.name} checkpoints are not exported yet; "
                                   f"buildable here: {buildable}")


def declared_gemms(layout: QuantLayout) -> dict[str, int]:
    """Quantized GEMMs the engine must hold, by kind (one per quantized linear; the read-back counts a GEMM the
    export fused from several linears as that many)."""
    counts: dict[str, int] = {}
    for lin in layout.quantized:
        kind = method(lin.precision.value).gemm
        assert kind is not None  # check_exportable refused the rest
        counts[kind.value] = counts.get(kind.value, 0) + 1
    return counts


def check_gemm_readback(declared: Mapping[str, int], found: Mapping[str, int], where: str) -> None:
    """A build with fewer quantized GEMMs of a kind than the checkpoint declares is a failure, never a silently
    float engine."""
    short = {k: (n, int(found.get(k, 0))) for k, n in declared.items() if int(found.get(k, 0)) < n}
    if short:
        raise TestFailure(f"{where}: the built engine holds fewer quantized GEMMs than the checkpoint declares: "
                          + ", ".join(f"{k} {f} of {n}" for k, (n, f) in short.items())
                          + "; the build lost quantized layers (they would run in float)")
