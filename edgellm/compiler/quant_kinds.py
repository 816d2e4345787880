"""What a quantized engine must hold, without torch: the GEMM kinds the ONNX Runtime read-back counts, which
precisions export refuses here and why, and the read-back check. The build and the runtime import this (an engine's
eval must not pull torch in); ``edgellm.compiler.quantized`` builds the torch modules.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from edgellm.checkpoint.modelopt import QuantLayout
from edgellm.errors import TestFailure, UnsupportedError
from edgellm.types import Precision


class GemmKind(enum.StrEnum):
    """What a quantized GEMM runs as in the engine (the read-back counts these)."""

    INT4 = "int4"  # MatMulNBits
    INT8 = "int8"  # MatMulIntegerToFloat / MatMulInteger / QLinearMatMul
    FP8_EMULATED = "fp8_emulated"  # MatMul of DequantizeLinear'd float8 weights


GEMM_KIND: dict[Precision, GemmKind] = {Precision.INT4_AWQ: GemmKind.INT4, Precision.INT8_SQ: GemmKind.INT8,
                                        Precision.FP8: GemmKind.FP8_EMULATED}
EMULATED = frozenset({Precision.FP8})
# Understood by inspect, refused by export on this platform, with the reason.
REFUSED: dict[Precision, str] = {
    Precision.NVFP4: "NVFP4 (e2m1 weights with fp8 block scales) needs Blackwell tensor cores; ONNX Runtime's CPU "
                     "provider has no fp4 type or kernel",
    Precision.MXFP8: "MXFP8 (e8m0 block scales) has no ONNX Runtime CPU kernel and no ONNX scale type before opset 23",
}


def check_exportable(layout: QuantLayout) -> None:
    """Refuse what this export cannot build, naming the reason, before anything is loaded."""
    if layout.kv_cache is not None:  # never a silently float cache
        raise UnsupportedError(f"{layout.source}: a {layout.kv_cache} KV cache (kv_cache_quant_algo) is not "
                               f"exported; the ONNX Runtime engine keeps its cache in fp32: quantize without "
                               f"--kv_cache_quantization")
    for precision in sorted({lin.precision for lin in layout.quantized}):
        if precision in REFUSED:
            raise UnsupportedError(f"{layout.source}: {precision.value} is refused on this platform: "
                                   f"{REFUSED[precision]}; buildable here: {', '.join(p.value for p in GEMM_KIND)}")
        if precision not in GEMM_KIND:
            raise UnsupportedError(f"{layout.source}: {precision.value} checkpoints are not exported yet; "
                                   f"buildable here: {', '.join(p.value for p in GEMM_KIND)}")


def declared_gemms(layout: QuantLayout) -> dict[str, int]:
    """Quantized GEMMs the engine must hold, by kind (one per quantized linear; the read-back counts a GEMM the
    export fused from several linears as that many)."""
    counts: dict[str, int] = {}
    for lin in layout.quantized:
        kind = GEMM_KIND[lin.precision].value
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def check_gemm_readback(declared: Mapping[str, int], found: Mapping[str, int], where: str) -> None:
    """A build with fewer quantized GEMMs of a kind than the checkpoint declares is a failure, never a silently
    float engine."""
    short = {k: (n, int(found.get(k, 0))) for k, n in declared.items() if int(found.get(k, 0)) < n}
    if short:
        raise TestFailure(f"{where}: the built engine holds fewer quantized GEMMs than the checkpoint declares: "
                          + ", ".join(f"{k} {f} of {n}" for k, (n, f) in short.items())
                          + "; the build lost quantized layers (they would run in float)")
