"""Quantized linear layers of a ModelOpt checkpoint, as torch modules that export to ONNX Runtime's integer kernels.

Each module holds its stored tensors, converted once at load to the layout its ONNX op reads, as parameters (so
the exporter traces them as graph inputs and ``onnx_weights.attach_weights`` writes them like any weight):

    int4_awq  x * pre_quant_scale -> com.microsoft.MatMulNBits(bits 4, block = the checkpoint's group size):
              B uint8 [N, K/block, block/2] (unsigned nibbles, zero point 8, element k in the low nibble when k is
              even), scales fp32 [N * K/block]
    int8_sq   x * pre_quant_scale -> QuantizeLinear(static input_scale, uint8 zero point 128, i.e. the symmetric
              int8 grid shifted for MLAS's u8s8 kernels) -> com.microsoft.MatMulIntegerToFloat(W int8 [K, N],
              input_scale, per-channel weight_scale [N])
    fp8       QuantizeLinear(x, input_scale) to float8e4m3 -> DequantizeLinear -> MatMul with
              DequantizeLinear(W float8e4m3 [K, N], weight_scale): emulated (no fp8 GEMM on the CPU), opset 19

Activations are fp32. The eager forward computes the same arithmetic in torch (used when tracing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgellm.checkpoint.modelopt import LinearLayer, QuantLayout
from edgellm.compiler.quant_kinds import REFUSED
from edgellm.config import ModelConfig
from edgellm.errors import BugError, UnsupportedError
from edgellm.models.base import ModelFamily
from edgellm.types import Precision

MIN_BLOCK = 16  # MatMulNBits' smallest block
INT8_ZERO_POINT = 128  # uint8 activations: the symmetric int8 grid shifted (MLAS's fast kernels are u8 x s8)
# MatMulNBits accuracy_level: 0 computes in fp32 from the dequantized weights (no activation rounding); 4 would
# quantize activations to int8 per block (faster, but a second rounding the checkpoint did not calibrate for).
INT4_ACCURACY_LEVEL = 0


def int4_block(in_features: int, group: int) -> int:
    """MatMulNBits' block: the checkpoint's group, or for a layer narrower than one group (one scale per row) the
    smallest power of two >= 16 covering it (the same blocks, no padding)."""
    if in_features >= group:
        return group
    return max(MIN_BLOCK, 1 << (in_features - 1).bit_length())


def unpack_modelopt_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N/2, K] (output rows 2r and 2r+1 in the low and high nibble, signed int4) -> int8 [N, K]."""
    lo = (packed & 0x0F).to(torch.int8)
    hi = (packed >> 4).to(torch.int8)
    lo = torch.where(lo >= 8, lo - 16, lo)
    hi = torch.where(hi >= 8, hi - 16, hi)
    return torch.stack((lo, hi), dim=1).reshape(-1, packed.shape[1])


def pack_matmulnbits(q: torch.Tensor, block: int) -> torch.Tensor:
    """int8 [N, K] in [-8, 7] -> uint8 [N, ceil(K/block), block/2]: unsigned (q + 8), zero-padded along K."""
    n, k = q.shape
    blocks = math.ceil(k / block)
    u = torch.full((n, blocks * block), 8, dtype=torch.uint8)
    u[:, :k] = (q + 8).to(torch.uint8)
    u = u.reshape(n, blocks, block // 2, 2)
    return u[..., 0] | (u[..., 1] << 4)


class _MatMulNBits(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, k: int, n: int,
                block: int) -> torch.Tensor:
        lo, hi = (b & 0x0F).to(torch.float32), (b >> 4).to(torch.float32)
        u = torch.stack((lo, hi), dim=-1).reshape(n, -1)[:, :k] - 8  # [N, K]
        w = u * scales.reshape(n, -1).repeat_interleave(block, dim=1)[:, :k]
        return x @ w.t()

    @staticmethod
    def symbolic(g: Any, x: Any, b: Any, scales: Any, k: int, n: int, block: int) -> Any:
        out = g.op("com.microsoft::MatMulNBits", x, b, scales, K_i=k, N_i=n, bits_i=4, block_size_i=block,
                   accuracy_level_i=INT4_ACCURACY_LEVEL)
        return _typed(out, x, n)


class _Int8Gemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                w_scale: torch.Tensor) -> torch.Tensor:
        xq = torch.clamp(torch.round(x / x_scale), -128, 127)
        return (xq @ w.to(torch.float32)) * (x_scale * w_scale)

    @staticmethod
    def symbolic(g: Any, x: Any, w: Any, x_scale: Any, w_scale: Any) -> Any:
        zp_a = g.op("Constant", value_t=torch.tensor(INT8_ZERO_POINT, dtype=torch.uint8))
        zp_b = g.op("Constant", value_t=torch.tensor(0, dtype=torch.int8))
        xq = g.op("QuantizeLinear", x, x_scale, zp_a)
        out = g.op("com.microsoft::MatMulIntegerToFloat", xq, w, x_scale, w_scale, zp_a, zp_b)
        return _typed(out, x, w.type().varyingSizes()[-1])


def _typed(out: Any, x: Any, n: int | None) -> Any:
    """A contrib op's output type for the exporter's shape inference: x's type with the last dim N."""
    sizes = x.type().varyingSizes()
    if sizes is not None:
        out.setType(x.type().with_sizes([*sizes[:-1], n]))
    return out


class QuantLinear(nn.Module):
    """Base: the float bias (when the layer has one) and the activation's pre_quant_scale (AWQ / SmoothQuant)."""

    def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        pqs = tensors.get("pre_quant_scale")
        self.pre_quant_scale = _param(pqs.float()) if pqs is not None else None
        bias = tensors.get("bias")
        self.bias = _param(bias.float()) if bias is not None else None

    def _smooth(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.pre_quant_scale if self.pre_quant_scale is not None else x

    def _bias(self, y: torch.Tensor) -> torch.Tensor:
        return y + self.bias if self.bias is not None else y


class Int4AwqLinear(QuantLinear):
    def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor], group: int) -> None:
        super().__init__(layer, tensors)
        self.block = int4_block(layer.in_features, group)
        q = unpack_modelopt_int4(tensors["weight"])  # [N, K]
        scale = tensors["weight_scale"].float()  # [N, ceil(K / group)]
        if self.block != group:
            scale = scale[:, :1]  # one group covers the row
        self.qweight = _param(pack_matmulnbits(q, self.block))
        self.scales = _param(scale.reshape(-1).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _MatMulNBits.apply(self._smooth(x), self.qweight, self.scales, self.in_features, self.out_features,
                               self.block)
        return self._bias(y)


class Int8SqLinear(QuantLinear):
    def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__(layer, tensors)
        self.weight_t = _param(tensors["weight"].t().contiguous())  # int8 [K, N]
        self.input_scale = _param(tensors["input_scale"].float().reshape(()))
        self.weight_scale = _param(tensors["weight_scale"].float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._bias(_Int8Gemm.apply(self._smooth(x), self.weight_t, self.input_scale, self.weight_scale))


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def make_quant_linear(layer: LinearLayer, tensors: Mapping[str, torch.Tensor], layout: QuantLayout) -> QuantLinear:
    if layer.precision is Precision.INT4_AWQ:
        assert layout.group_size is not None  # the layout reader requires it for int4_awq
        return Int4AwqLinear(layer, tensors, layout.group_size)
    if layer.precision is Precision.INT8_SQ:
        return Int8SqLinear(layer, tensors)
    if layer.precision is Precision.FP8:
        from edgellm.compiler.quantized_fp8 import Fp8Linear

        return Fp8Linear(layer, tensors)
    raise UnsupportedError(f"{layer.module}: {layer.precision.value} layers cannot be exported: "
                           f"{REFUSED.get(layer.precision, 'no ONNX Runtime kernel')}")


def load_quantized_decoder(ckpt_dir: Path, cfg: ModelConfig, family: type[ModelFamily], layout: QuantLayout,
                           dtype: torch.dtype = torch.float32) -> Any:
    """The torch decoder of a quantized checkpoint: float tensors cast to ``dtype``, quantized linears replaced by
    ``QuantLinear`` modules."""
    from safetensors import safe_open

    from edgellm.models.decoder import Decoder, rope_inv_freq
    from edgellm.weights import weight_files

    quantized = {lin.module: lin for lin in layout.quantized}
    wanted_float = set(family.expected_parameters(cfg))
    state: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {m: {} for m in quantized}
    for path in weight_files(ckpt_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                module, _, role = name.rpartition(".")
                if module in quantized:
                    parts[module][role] = f.get_tensor(name)
                elif name in wanted_float:
                    state[name] = f.get_tensor(name).to(dtype)
    with torch.device("meta"):
        model = Decoder(cfg, family, dtype)
    for module, lin in quantized.items():
        parent, _, attr = module.rpartition(".")
        setattr(model.get_submodule(parent), attr, make_quant_linear(lin, parts[module], layout))
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise BugError(f"quantized decoder parameters not loaded: {', '.join(missing[:5])}")
    return model.eval()
