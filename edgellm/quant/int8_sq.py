"""int8_sq: SmoothQuant, 8-bit integer weights per output channel and 8-bit activations with one static scale,
smoothed by a per-input-channel scale (ModelOpt ``W8A8_SQ_PER_CHANNEL``, also spelled ``INT8_SQ``).

Stored per linear: weight I8 [out, in], weight_scale [out], input_scale [] (static), pre_quant_scale [in] (absent
when the quantizer did not smooth). ModelOpt gives the linears of one input (q/k/v; gate/up) one smoothing and one
input scale, so the export fuses them into one integer GEMM.

ONNX Runtime: x * pre_quant_scale -> QuantizeLinear(static input_scale, uint8 zero point 128, i.e. the symmetric int8
grid shifted) -> com.microsoft.MatMulIntegerToFloat(W as uint8 [K, N] with zero point 128, input_scale, per-channel
weight_scale [N]). Both operands are unsigned on purpose: MLAS's u8 x s8 kernels on x86 CPUs without VNNI (AVX2,
AVX-512 without VNNI) add pairs of u8*s8 products in int16 and saturate (255*127*2 > 32767), which cost a random
Gemma-3 export 0.2 in its logits on such a CPU; its u8 x u8 kernels widen first and are exact everywhere. The
engine is the same on every x86 CPU, so one built on a VNNI host stays right on an AVX2 one.

Thresholds (as int4_awq's, measured on the trained stories260K): 35 of 35 linears, ppl 5.831 -> 5.852 (+0.36%),
top-1 0.961; a random tiny Qwen3: ppl +0.01%, top-1 0.93.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from edgellm.quant.base import GemmKind, QuantizationMethod, Scale, StoredFormat, register_method, scalar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from edgellm.checkpoint.modelopt import LinearLayer, QuantLayout

INT8_ZERO_POINT = 128  # uint8 activations and weights: the symmetric int8 grid shifted (u8 x u8: exact on any x86)


@register_method
class Int8Sq(QuantizationMethod):
    name = "int8_sq"
    order = 20
    modelopt_algos = ("W8A8_SQ_PER_CHANNEL", "INT8_SQ")
    stored = StoredFormat(("I8",), lambda o, i: (o, i),
                          {"weight_scale": Scale(lambda o, i, g: (o,)), "input_scale": Scale(scalar),
                           "pre_quant_scale": Scale(lambda o, i, g: (i,), optional=True)})
    gemm = GemmKind.INT8
    kernel = "int8 (SmoothQuant)"
    thresholds: ClassVar[dict[str, float]] = {"ppl_max_rel_diff": 0.015, "top1_min_agreement": 0.90}

    @classmethod
    def ort_linear(cls, layer: LinearLayer, tensors: Mapping[str, Any], layout: QuantLayout) -> nn.Module:
        return _module()(layer, tensors)


@functools.cache
def _module() -> type:
    """The torch module, made on first use (torch is imported by export only, never with the vocabulary)."""
    import torch

    from edgellm.compiler.quantized import QuantLinear, param, typed

    class Int8Gemm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                    w_scale: torch.Tensor) -> torch.Tensor:
            if torch.onnx.is_in_onnx_export():  # the tracer needs the shape only
                return x.new_zeros((*x.shape[:-1], w.shape[-1]))
            xq = torch.clamp(torch.round(x / x_scale), -128, 127)
            return (xq @ (w.to(torch.float32) - INT8_ZERO_POINT)) * (x_scale * w_scale)

        @staticmethod
        def symbolic(g: Any, x: Any, w: Any, x_scale: Any, w_scale: Any) -> Any:
            zp = g.op("Constant", value_t=torch.tensor(INT8_ZERO_POINT, dtype=torch.uint8))  # A's and B's
            xq = g.op("QuantizeLinear", x, x_scale, zp)
            out = g.op("com.microsoft::MatMulIntegerToFloat", xq, w, x_scale, w_scale, zp, zp)
            return typed(out, x, w.type().varyingSizes()[-1])

    class Int8SqLinear(QuantLinear):
        def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor]) -> None:
            super().__init__(layer, tensors)
            # int8 [out, in] -> uint8 [K, N] on the grid shifted by INT8_ZERO_POINT (the same integers)
            shifted = tensors["weight"].t().to(torch.int16) + INT8_ZERO_POINT
            self.weight_t = param(shifted.to(torch.uint8).contiguous())
            self.input_scale = param(tensors["input_scale"].float().reshape(()))
            self.weight_scale = param(tensors["weight_scale"].float())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._bias(Int8Gemm.apply(self._smooth(x), self.weight_t, self.input_scale, self.weight_scale))

        def scale_outputs(self, factor: torch.Tensor) -> bool:
            self.weight_scale = param(self.weight_scale.detach() * factor)
            return True

    return Int8SqLinear
