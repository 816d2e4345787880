"""int4_awq: 4-bit integer weights in groups along the input, activations in float, smoothed by AWQ's per-input-channel
scale (ModelOpt ``W4A16_AWQ``; a config.json ``quant_method: awq`` with 4 bits).

Stored per linear: weight U8 [out/2, in] (two signed int4 output rows per byte, row 2r in the low nibble),
weight_scale [out, ceil(in/group)], pre_quant_scale [in] (multiplies the activation).

ONNX Runtime: x * pre_quant_scale -> com.microsoft.MatMulNBits(bits 4, block = the checkpoint's group size): B uint8
[N, K/block, block/2] (unsigned nibbles, zero point 8, element k in the low nibble when k is even), scales fp32
[N * K/block], accuracy level 4 (edgellm.compiler.quantized.MatMulNBits).

Thresholds (engine against the float source; about 3x the error measured on the trained stories260K, bundled text,
4064 tokens, window 128, 16 calibration rows; 2026-11-30, tensorrt-edgellm 0.11.0 / ModelOpt 0.45.0, ONNX Runtime
1.32.0): 10 of 35 linears int4 (25 left fp16 by the tool), ppl 5.831 -> 5.916 (+1.46%), top-1 0.945. On a random tiny
Qwen3 with every linear quantized: ppl +0.19%, top-1 0.60 (near-uniform logits: a thresholds file is needed there).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from edgellm.quant.base import GemmKind, QuantizationMethod, Scale, StoredFormat, groups, register_method

if TYPE_CHECKING:
    import torch
    from torch import nn

    from edgellm.checkpoint.modelopt import LinearLayer, QuantLayout

MIN_BLOCK = 16  # MatMulNBits' smallest block; every power of two from it up is one (its schema; measured to 4096)


@register_method
class Int4Awq(QuantizationMethod):
    name = "int4_awq"
    order = 40
    modelopt_algos = ("W4A16_AWQ",)
    hf_quant_methods = (("awq", 4),)
    stored = StoredFormat(("U8",), lambda o, i: (o // 2, i),
                          {"weight_scale": Scale(lambda o, i, g: (o, groups(g, i))),
                           "pre_quant_scale": Scale(lambda o, i, g: (i,))},
                          needs_group=True)
    gemm = GemmKind.INT4
    kernel = "int4 (AWQ, MatMulNBits)"
    thresholds: ClassVar[dict[str, float]] = {"ppl_max_rel_diff": 0.05, "top1_min_agreement": 0.85}

    @classmethod
    def group_size_problem(cls, group: int) -> str | None:
        if group >= MIN_BLOCK and group & (group - 1) == 0:
            return None
        return (f"group_size {group} is not a block ONNX Runtime's MatMulNBits takes (its block_size: a power of two "
                f">= {MIN_BLOCK}, e.g. 32, 64, 128)")

    @classmethod
    def ort_linear(cls, layer: LinearLayer, tensors: Mapping[str, Any], layout: QuantLayout) -> nn.Module:
        assert layout.group_size is not None  # the layout reader requires it (needs_group)
        return _module()(layer, tensors, layout.group_size)


def int4_block(in_features: int, group: int) -> int:
    """MatMulNBits' block: the checkpoint's group, or for a layer narrower than one group (one scale per row) the
    smallest power of two >= 16 covering it (the same blocks, no padding)."""
    if in_features >= group:
        return group
    return max(MIN_BLOCK, 1 << (in_features - 1).bit_length())


def unpack_modelopt_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N/2, K] (output rows 2r and 2r+1 in the low and high nibble, signed int4) -> int8 [N, K]."""
    import torch

    lo = (packed & 0x0F).to(torch.int8)
    hi = (packed >> 4).to(torch.int8)
    lo = torch.where(lo >= 8, lo - 16, lo)
    hi = torch.where(hi >= 8, hi - 16, hi)
    return torch.stack((lo, hi), dim=1).reshape(-1, packed.shape[1])


def pack_matmulnbits(q: torch.Tensor, block: int) -> torch.Tensor:
    """int8 [N, K] in [-8, 7] -> uint8 [N, ceil(K/block), block/2]: unsigned (q + 8), zero-padded along K."""
    import torch

    n, k = q.shape
    blocks = math.ceil(k / block)
    u = torch.full((n, blocks * block), 8, dtype=torch.uint8)
    u[:, :k] = (q + 8).to(torch.uint8)
    u = u.reshape(n, blocks, block // 2, 2)
    return u[..., 0] | (u[..., 1] << 4)


def repack_modelopt_int4(packed: torch.Tensor, block: int) -> torch.Tensor:
    """ModelOpt's uint8 [N/2, K] -> MatMulNBits' uint8 [N, ceil(K/block), block/2], in bit operations on the packed
    bytes (what ``pack_matmulnbits(unpack_modelopt_int4(packed), block)`` gives, ~20x faster): a two's-complement
    nibble plus 8 (mod 16) is the nibble with its top bit flipped, so ``packed ^ 0x88`` makes both unsigned; output
    row 2r takes the low nibbles of byte row r, row 2r+1 the high ones, and adjacent K elements pair into one byte."""
    import numpy as np
    import torch

    half, k = packed.shape
    blocks = math.ceil(k / block)
    x = packed.numpy() ^ np.uint8(0x88)
    if k % 2 or blocks * block != k:  # pad K with unsigned 8 (int4 zero) in both nibbles
        x = np.pad(x, ((0, 0), (0, blocks * block - k)), constant_values=0x88)
    even, odd = x[:, 0::2], x[:, 1::2]  # K elements 2j and 2j+1
    out = np.empty((half, 2, x.shape[1] // 2), dtype=np.uint8)
    np.bitwise_or(even & 0x0F, (odd & 0x0F) << 4, out=out[:, 0])  # output row 2r: low nibbles
    np.bitwise_or(even >> 4, odd & 0xF0, out=out[:, 1])  # output row 2r + 1: high nibbles
    return torch.from_numpy(out.reshape(2 * half, blocks, block // 2))


@functools.cache
def _module() -> type:
    """The torch module, made on first use (torch is imported by export only, never with the vocabulary)."""
    from edgellm.compiler.quantized import MatMulNBits, QuantLinear, param

    class Int4AwqLinear(QuantLinear):
        def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor], group: int) -> None:
            super().__init__(layer, tensors)
            self.block = int4_block(layer.in_features, group)
            scale = tensors["weight_scale"].float()  # [N, ceil(K / group)]
            if self.block != group:
                scale = scale[:, :1]  # one group covers the row
            self.qweight = param(repack_modelopt_int4(tensors["weight"], self.block))
            self.scales = param(scale.reshape(-1).contiguous())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = MatMulNBits.apply(self._smooth(x), self.qweight, self.scales, self.in_features, self.out_features,
                                  self.block)
            return self._bias(y)

        def scale_outputs(self, factor: torch.Tensor) -> bool:
            self.scales = param((self.scales.detach().reshape(self.out_features, -1) * factor[:, None]).reshape(-1))
            return True

    return Int4AwqLinear
