"""FP8 (e4m3) linear layers, emulated on ONNX Runtime's CPU provider (it has no fp8 GEMM):

    x -> QuantizeLinear(input_scale, float8e4m3 zero) -> DequantizeLinear   (the activation rounded to fp8, as the
                                                                             checkpoint's static scale says)
    W float8e4m3 [K, N] -> DequantizeLinear(weight_scale) -> MatMul          (weights stay fp8 on disk)

so the engine computes what an fp8 GEMM computes (fp8 operands, wider accumulation) at float speed; its manifest
marks it ``emulated``. Opset 19 (float8 types in QuantizeLinear / DequantizeLinear).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from edgellm.checkpoint.modelopt import LinearLayer
from edgellm.compiler.quantized import QuantLinear, _param, _typed

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # QuantizeLinear saturates float8 outputs to the largest finite e4m3 value


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8)


class _Fp8Gemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                zero: torch.Tensor) -> torch.Tensor:
        xq = _to_fp8(x, x_scale).to(torch.float32) * x_scale
        return xq @ (w.to(torch.float32) * w_scale)

    @staticmethod
    def symbolic(g: Any, x: Any, w: Any, x_scale: Any, w_scale: Any, zero: Any) -> Any:
        xq = g.op("QuantizeLinear", x, x_scale, zero)
        xd = g.op("DequantizeLinear", xq, x_scale, zero)
        wd = g.op("DequantizeLinear", w, w_scale, zero)
        return _typed(g.op("MatMul", xd, wd), x, w.type().varyingSizes()[-1])


class Fp8Linear(QuantLinear):
    def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__(layer, tensors)
        w = tensors["weight"]  # float8_e4m3fn [N, K]
        self.weight_t = _param(w.view(torch.uint8).t().contiguous().view(FP8))  # [K, N]
        self.input_scale = _param(tensors["input_scale"].float().reshape(()))
        self.weight_scale = _param(tensors["weight_scale"].float().reshape(()))
        self.fp8_zero = _param(torch.zeros((), dtype=FP8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Fp8Gemm.apply(self._smooth(x), self.weight_t, self.input_scale, self.weight_scale, self.fp8_zero)
        return self._bias(y)
