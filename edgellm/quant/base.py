"""What a quantization method is (``QuantizationMethod``), the kinds of quantized GEMM an engine runs (``GemmKind``),
how a method stores a linear layer in a ModelOpt checkpoint (``StoredFormat``), and the registry.

Nothing here imports torch, the vocabulary (``edgellm.types`` builds its enums from this registry) or the checkpoint
readers: a method module imports this module only at import time.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from edgellm.errors import BugError, UnsupportedError
from edgellm.registry import Registry

if TYPE_CHECKING:
    from torch import nn

    from edgellm.checkpoint.modelopt import LinearLayer, QuantLayout


class GemmKind(enum.StrEnum):
    """What a quantized GEMM runs as in an ONNX Runtime engine (the build's read-back counts these by node:
    edgellm.backends.ort.quantized_gemms); backends list the quantized precisions they build in this order."""

    INT4 = "int4"  # MatMulNBits, 4 bits
    INT8 = "int8"  # MatMulIntegerToFloat / MatMulInteger / QLinearMatMul, or MatMulNBits with 8 bits
    FP8_EMULATED = "fp8_emulated"  # MatMul of DequantizeLinear'd float8 weights


ShapeRule = Callable[[int, int, int | None], tuple[int, ...] | None]  # (out, in, group) -> shape; None: scalar
SCALE_DTYPES = ("F32", "F16", "BF16", "F8_E4M3")  # safetensors dtypes a scale may have, unless a Scale says others


def scalar(out: int, inp: int, group: int | None) -> None:
    """A per-tensor scale (stored 0-d or with one element)."""
    return None


@dataclass(frozen=True)
class Scale:
    """A tensor stored beside a quantized weight: its shape for an [out, in] linear (and group size), the dtypes it
    may have, and whether a checkpoint may leave it out."""

    shape: ShapeRule
    dtypes: tuple[str, ...] = SCALE_DTYPES
    optional: bool = False


@dataclass(frozen=True)
class StoredFormat:
    """How a method stores one linear layer in ModelOpt's unified checkpoint: the packed weight and, by tensor-name
    suffix, each companion tensor (in the order messages name them)."""

    weight_dtypes: tuple[str, ...]
    weight_shape: Callable[[int, int], tuple[int, ...]]
    scales: Mapping[str, Scale] = field(default_factory=dict)
    needs_group: bool = False  # the checkpoint must give group_size

    def shape_note(self, out: int, inp: int, group: int | None) -> str:
        parts = [f"weight {'/'.join(self.weight_dtypes)} {list(self.weight_shape(out, inp))}"]
        for suffix, scale in self.scales.items():
            shape = scale.shape(out, inp, group)
            parts.append(f"{suffix} {list(shape) if shape is not None else '[] (scalar)'}")
        return ", ".join(parts)


def scale_value_problem(dtype: str, chunks: Iterable[bytes]) -> str | None:
    """Why the stored values of a scale (its raw little-endian bytes in ``chunks`` of whole elements, safetensors
    ``dtype``) are unusable, or None.

    A scale multiplies a quantized value back to its float; one that is NaN, infinite, zero or negative is no
    quantizer's output but a poisoned or broken checkpoint (ONNX Runtime's kernels even compute finite logits from a
    NaN scale, so nothing downstream would notice). Checked on the raw bits: fp8 (e4m3fn) has NaN at magnitude 0x7F
    and no infinity; e8m0 (U8 block scales) is a power of two, NaN at 0xFF."""
    import numpy as np

    if dtype not in SCALE_BITS:
        return f"dtype {dtype} is not a scale type ({', '.join(SCALE_BITS)})"
    found: dict[str, int] = {}
    first: int | None = None
    seen = 0
    for data in chunks:
        bad = _bad_scale_values(np, dtype, data)
        for what, mask in bad.items():
            if mask.any():
                found[what] = found.get(what, 0) + int(mask.sum())
                at = seen + int(np.argmax(mask))
                first = at if first is None else min(first, at)
        seen += len(data) * 8 // SCALE_BITS[dtype]
    if not found:
        return None
    return (f"holds {', '.join(f'{n} {what}' for what, n in found.items())} of its {seen} values (the first at "
            f"flat index {first}); a scale must be finite and > 0")


def _bad_scale_values(np: Any, dtype: str, data: bytes) -> dict[str, Any]:
    raw = np.frombuffer(data, dtype=np.uint8)
    if dtype == "F8_E4M3":
        mag = raw & 0x7F
        return {"NaN": mag == 0x7F, "zero": mag == 0, "negative": ((raw & 0x80) != 0) & (mag != 0)}
    if dtype == "U8":
        return {"NaN": raw == 0xFF}
    if dtype == "BF16":
        values = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(data, dtype=_NUMPY_FLOATS[dtype])
    with np.errstate(invalid="ignore"):
        return {"NaN": np.isnan(values), "infinite": np.isinf(values), "zero": values == 0, "negative": values < 0}


_NUMPY_FLOATS = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}
SCALE_BITS = {"F8_E4M3": 8, "U8": 8, "F16": 16, "BF16": 16, "F32": 32, "F64": 64}  # dtypes whose values are checked


def groups(group: int | None, inp: int) -> int:
    """Scale columns of a weight with ``inp`` inputs in groups of ``group`` (None: one group)."""
    return math.ceil(inp / (group or inp))


class QuantizationMethod:
    """One quantization method: a subclass in a module of ``edgellm.quant``, decorated by ``@register_method``.

    Class attributes (``register_method`` refuses a class without the required ones):
      name            its name in the vocabulary (``Precision`` / ``QuantMethod`` values), e.g. ``int4_awq``
      order           its place in the vocabulary's listing (a new method takes a number after the last)
      modelopt_algos  ``quant_algo`` names of ModelOpt's ``hf_quant_config.json`` meaning this method, the one
                      ModelOpt writes first
      hf_quant_methods  ``(quant_method, bits)`` of a config.json ``quantization_config`` meaning it (bits None: any)
      stored          how a linear is stored (None: recognised, but its layout is not read)
      gemm            what its GEMMs run as in an ONNX Runtime engine; set exactly when ``ort_linear`` is implemented
      emulated        the engine computes its arithmetic without its hardware kernel (stated in manifests)
      opset           the ONNX opset its ONNX Runtime lowering needs at least
      refused         why export refuses it on this platform (None: no reason beyond "not exported yet")
      kernel          the GEMM a runtime that lacks it would need (in refusals), default the GEMM kind
      bits_per_weight bits one weight takes, scales amortised, for a method whose ``stored`` layout is not read
                      (memory estimates: ``edgellm.memory``; a method with ``stored`` is sized from it)
      thresholds      accuracy limits of its engines against the float source, by ``edgellm.thresholds`` field
                      (None: no defaults; a thresholds file is needed)
    A method with groups says which group sizes its kernel takes by overriding ``group_size_problem``.
    """

    name: ClassVar[str]
    order: ClassVar[int]
    modelopt_algos: ClassVar[tuple[str, ...]]
    hf_quant_methods: ClassVar[tuple[tuple[str, int | None], ...]] = ()
    stored: ClassVar[StoredFormat | None] = None
    gemm: ClassVar[GemmKind | None] = None
    emulated: ClassVar[bool] = False
    opset: ClassVar[int] = 0
    refused: ClassVar[str | None] = None
    kernel: ClassVar[str | None] = None
    thresholds: ClassVar[Mapping[str, float] | None] = None
    bits_per_weight: ClassVar[float | None] = None

    @classmethod
    def exported(cls) -> bool:
        """Whether export lowers it to ONNX Runtime."""
        return cls.gemm is not None

    @classmethod
    def gemm_label(cls) -> str:
        return cls.kernel or (cls.gemm.value if cls.gemm is not None else cls.name)

    @classmethod
    def group_size_problem(cls, group: int) -> str | None:
        """Why a checkpoint's ``group_size`` is one this method's kernel does not take (None: it takes it, or the
        method has no groups). Checked by inspect, before any layer is read."""
        return None

    @classmethod
    def ort_linear(cls, layer: LinearLayer, tensors: Mapping[str, Any], layout: QuantLayout) -> nn.Module:
        """The torch module that computes ``layer`` from its stored ``tensors`` (converted once to the layout its
        ONNX op reads) and exports to ONNX Runtime's kernel (``edgellm.compiler.quantized.QuantLinear``)."""
        raise UnsupportedError(f"{layer.module}: {cls.name} layers cannot be exported: "
                               f"{cls.refused or 'no ONNX Runtime kernel'}")


METHODS: Registry[type[QuantizationMethod]] = Registry("quantization method")
_frozen: list[str] = []  # set once edgellm.types has built the vocabulary from METHODS
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def register_method(cls: type[QuantizationMethod]) -> type[QuantizationMethod]:
    """Register a method class; refuses one missing a required attribute, or registered after ``edgellm.types``
    built the vocabulary (it would be a method the vocabulary does not name)."""
    for attr in ("name", "order", "modelopt_algos"):
        if getattr(cls, attr, None) in (None, "", ()):
            raise BugError(f"quantization method {cls.__qualname__} must set class attribute {attr!r}")
    if not _NAME.match(cls.name):
        raise BugError(f"quantization method {cls.__qualname__}: name {cls.name!r} must be lower-case letters, "
                       f"digits and '_' (it becomes a Precision member)")
    lowered = cls.ort_linear.__func__ is not QuantizationMethod.ort_linear.__func__  # type: ignore[attr-defined]
    if lowered != (cls.gemm is not None):
        raise BugError(f"quantization method {cls.name!r}: set gemm exactly when ort_linear is implemented "
                       f"(gemm {cls.gemm!r}, ort_linear {'implemented' if lowered else 'not implemented'})")
    if cls.refused is not None and cls.gemm is not None:
        raise BugError(f"quantization method {cls.name!r} is refused ({cls.refused}) but declares a GEMM")
    if _frozen:
        raise BugError(f"quantization method {cls.name!r} registered after edgellm.types built the vocabulary "
                       f"({', '.join(_frozen)}); define it in a module of edgellm/quant (imported by discover), or "
                       f"register it before importing edgellm.types")
    taken = {algo: other.name for _, other in METHODS.items() for algo in other.modelopt_algos}
    clash = [f"{a} (also {taken[a]})" for a in cls.modelopt_algos if a in taken]
    if clash:
        raise BugError(f"quantization method {cls.name!r}: quant_algo {', '.join(clash)} named twice")
    METHODS.add(cls.name, cls)
    return cls


def methods() -> list[type[QuantizationMethod]]:
    """Every registered method (the built-in modules imported first), in vocabulary order."""
    discover()
    return sorted((cls for _, cls in METHODS.items()), key=lambda cls: (cls.order, cls.name))


def freeze(names: list[str]) -> None:
    """Called by edgellm.types once the vocabulary is built from ``names``: later registrations are bugs."""
    _frozen[:] = names


_discovered: list[bool] = []


def discover() -> None:
    """Import the built-in method modules once, named here (the one list of them; nothing walks the package at
    import): their ``@register_method`` classes fill the registry. tests/test_quant_methods.py checks that each
    module of edgellm/quant but this one is imported here and registers one method."""
    if _discovered:
        return
    from edgellm.quant import fp8, int4_awq, int4_gptq, int4_wo, int8_sq, int8_wo, mxfp8, nvfp4  # noqa: F401

    _discovered.append(True)
