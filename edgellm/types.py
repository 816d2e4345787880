"""Enums for the vocabulary the whole project shares. Never parsed from file or folder names."""

from __future__ import annotations

import enum

from edgellm.errors import ConfigurationError


class ChoiceEnum(enum.StrEnum):
    @classmethod
    def parse(cls, value: str | ChoiceEnum, *, what: str | None = None) -> ChoiceEnum:
        """Parse a user-given value; the error names the bad value and every valid one."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            label = what or cls.__name__
            raise ConfigurationError(f"unknown {label} {value!r}; valid: {choices}") from None


def _vocabulary() -> tuple[type[ChoiceEnum], type[ChoiceEnum]]:
    """``QuantMethod`` (none + every registered quantization method, edgellm/quant) and ``Precision`` (the float
    formats + the same methods): one registry, no list kept here. A method is a member named by its upper-cased
    name (``Precision.INT4_AWQ``), in the methods' declared order."""
    from edgellm.quant.base import freeze, methods

    names = [m.name for m in methods()]
    freeze(names)
    method = ChoiceEnum("QuantMethod", {"NONE": "none", **{n.upper(): n for n in names}},  # type: ignore[misc]
                         module=__name__, qualname="QuantMethod")
    method.__doc__ = "Quantization algorithm that produced (or will produce) a checkpoint (edgellm/quant)."
    floats = {"FP32": "fp32", "FP16": "fp16", "BF16": "bf16"}
    precision = ChoiceEnum("Precision",  # type: ignore[misc]
                            {**floats, **{m.name: m.value for m in method if m.value != "none"}},
                            module=__name__, qualname="Precision")
    precision.__doc__ = ("Numeric format of a model's weights and compute: fp32, fp16, bf16, or a quantization method "
                         "(the LM head and KV cache have their own enums).")
    return method, precision


QuantMethod, Precision = _vocabulary()

# Weight precisions that need no quantizer: the checkpoint is only cast (quantize is the identity for them).
UNQUANTIZED: frozenset[Precision] = frozenset({Precision.FP32, Precision.FP16, Precision.BF16})


class LMHeadPrecision(ChoiceEnum):
    """Numeric format of the LM head (output projection) when it differs from the weights."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8_WO = "int8_wo"
    INT4_WO = "int4_wo"
    NVFP4 = "nvfp4"


class KVCachePrecision(ChoiceEnum):
    """Storage format of the KV cache (int8 here is a plain per-tensor int8 cache, not a weight scheme)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    NVFP4 = "nvfp4"


class BenchMode(ChoiceEnum):
    """What an engine benchmark times: ``prefill`` (a prompt's tokens in one step) or ``decode`` (one new token per
    sequence over a KV cache). ``edgellm bench --mode`` takes these names; toolchains that drive another tool's
    benchmark use the same two."""

    PREFILL = "prefill"
    DECODE = "decode"
