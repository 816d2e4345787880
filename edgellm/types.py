"""Enums for the vocabulary the whole project shares. Never parsed from file or folder names."""

from __future__ import annotations

import enum

from edgellm.errors import ConfigurationError


class _ChoiceEnum(enum.StrEnum):
    @classmethod
    def parse(cls, value: str | _ChoiceEnum, *, what: str | None = None) -> _ChoiceEnum:
        """Parse a user-given value; the error names the bad value and every valid one."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            label = what or cls.__name__
            raise ConfigurationError(f"unknown {label} {value!r}; valid: {choices}") from None


class Precision(_ChoiceEnum):
    """Numeric format of a model's weights and compute (the LM head and KV cache have their own enums)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT8_WO = "int8_wo"
    INT4_AWQ = "int4_awq"
    INT4_GPTQ = "int4_gptq"
    INT4_WO = "int4_wo"
    NVFP4 = "nvfp4"
    MXFP8 = "mxfp8"


# Weight precisions that need no quantizer: the checkpoint is only cast (quantize is the identity for them).
UNQUANTIZED: frozenset[Precision] = frozenset({Precision.FP32, Precision.FP16, Precision.BF16})


class LMHeadPrecision(_ChoiceEnum):
    """Numeric format of the LM head (output projection) when it differs from the weights."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8_WO = "int8_wo"
    INT4_WO = "int4_wo"
    NVFP4 = "nvfp4"


class KVCachePrecision(_ChoiceEnum):
    """Storage format of the KV cache (int8 here is a plain per-tensor int8 cache, not a weight scheme)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    NVFP4 = "nvfp4"


class QuantMethod(_ChoiceEnum):
    """Quantization algorithm that produced (or will produce) a checkpoint."""

    NONE = "none"
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT8_WO = "int8_wo"
    INT4_AWQ = "int4_awq"
    INT4_GPTQ = "int4_gptq"
    INT4_WO = "int4_wo"
    NVFP4 = "nvfp4"
    MXFP8 = "mxfp8"


class Backend(_ChoiceEnum):
    """Engine backends; each member is implemented by one ``@register_backend`` class in ``edgellm.backends``."""

    ORT = "ort"
    TORCH_CUDA = "torch-cuda"


class BenchMode(_ChoiceEnum):
    """What an engine benchmark times: ``prefill`` (a prompt's tokens in one step) or ``decode`` (one new token per
    sequence over a KV cache). ``edgellm bench --mode`` takes these names; toolchains that drive another tool's
    benchmark use the same two."""

    PREFILL = "prefill"
    DECODE = "decode"
