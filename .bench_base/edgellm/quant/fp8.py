"""fp8: float8 (e4m3) weights and activations, one static scale each per tensor (ModelOpt ``FP8``; a config.json
``quant_method: fp8``).

Stored per linear: weight F8_E4M3 [out, in], weight_scale [], input_scale [] (scalars).

ONNX Runtime's CPU provider has no fp8 GEMM, so the engine emulates one (opset 19: float8 QuantizeLinear /
DequantizeLinear):

    x -> QuantizeLinear(input_scale, float8e4m3 zero) -> DequantizeLinear   (the activation rounded to fp8, as the
                                                                             checkpoint's static scale says)
    W float8e4m3 [K, N] -> DequantizeLinear(weight_scale) -> MatMul          (weights stay fp8 on disk)

computing what an fp8 GEMM computes (fp8 operands, wider accumulation) at float speed; manifests say ``emulated``.

Thresholds (as int4_awq's, measured on the trained stories260K): 35 of 35 linears, emulated, ppl 5.831 -> 5.945
(+1.96%), top-1 0.922; a random tiny Qwen3: ppl +0.04%, top-1 0.87.
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

FP8_MAX = 448.0  # QuantizeLinear saturates float8 outputs to the largest finite e4m3 value


@register_method
class Fp8(QuantizationMethod):
    name = "fp8"
    order = 10
    modelopt_algos = ("FP8",)
    hf_quant_methods = (("fp8", None),)
    stored = StoredFormat(("F8_E4M3",), lambda o, i: (o, i),
                          {"weight_scale": Scale(scalar), "input_scale": Scale(scalar)})
    gemm = GemmKind.FP8_EMULATED
    emulated = True
    opset = 19
    kernel = "fp8"
    thresholds: ClassVar[dict[str, float]] = {"ppl_max_rel_diff": 0.06, "top1_min_agreement": 0.80}

    @classmethod
    def ort_linear(cls, layer: LinearLayer, tensors: Mapping[str, Any], layout: QuantLayout) -> nn.Module:
        return _module()(layer, tensors)


@functools.cache
def _module() -> type:
    """The torch module, made on first use (torch is imported by export only, never with the vocabulary)."""
    import torch

    from edgellm.compiler.quantized import QuantLinear, param, typed

    fp8 = torch.float8_e4m3fn

    def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(fp8)

    class Fp8Gemm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                    zero: torch.Tensor) -> torch.Tensor:
            xq = to_fp8(x, x_scale).to(torch.float32) * x_scale
            return xq @ (w.to(torch.float32) * w_scale)

        @staticmethod
        def symbolic(g: Any, x: Any, w: Any, x_scale: Any, w_scale: Any, zero: Any) -> Any:
            xq = g.op("QuantizeLinear", x, x_scale, zero)
            xd = g.op("DequantizeLinear", xq, x_scale, zero)
            wd = g.op("DequantizeLinear", w, w_scale, zero)
            return typed(g.op("MatMul", xd, wd), x, w.type().varyingSizes()[-1])

    class Fp8Linear(QuantLinear):
        def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor]) -> None:
            super().__init__(layer, tensors)
            w = tensors["weight"]  # float8_e4m3fn [N, K]
            self.weight_t = param(w.view(torch.uint8).t().contiguous().view(fp8))  # [K, N]
            self.input_scale = param(tensors["input_scale"].float().reshape(()))
            self.weight_scale = param(tensors["weight_scale"].float().reshape(()))
            self.fp8_zero = param(torch.zeros((), dtype=fp8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = Fp8Gemm.apply(self._smooth(x), self.weight_t, self.input_scale, self.weight_scale, self.fp8_zero)
            return self._bias(y)

    return Fp8Linear
