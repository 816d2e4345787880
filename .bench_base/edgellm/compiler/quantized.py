"""Quantized linear layers of a ModelOpt checkpoint as torch modules that export to ONNX Runtime's kernels: what
every method shares. Each method's own module (a ``QuantLinear`` subclass and its ONNX op) lives with the method in
``edgellm/quant/<method>.py`` and is made by its ``ort_linear``; the decoder is the export's own
(edgellm.models.decoder) with these plugged in place of its float linears.

A module holds its stored tensors, converted once at load to the layout its ONNX op reads, as parameters (so the
exporter traces them as graph inputs and ``onnx_weights.attach_weights`` writes them like any weight). Activations are
fp32. The eager forward computes the same arithmetic in torch (used when tracing).

Also here: ``MatMulNBits`` (ONNX Runtime's blocked n-bit GEMM, used by int4 methods and by LM heads quantized at
export), ``WeightOnlyLMHead``, ``GatheredEmbedding``, and the folding of activation smoothing into norms and scales.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgellm.checkpoint.modelopt import LinearLayer, QuantLayout
from edgellm.config import ModelConfig
from edgellm.errors import BugError, UnsupportedError
from edgellm.models.base import ModelFamily
from edgellm.models.decoder import RMSNorm

# MatMulNBits accuracy_level 4: the activation is quantized to int8 per block of the weight's block (symmetric,
# scale = block amax / 127) and the dot products run on the CPU's int8 kernels (VNNI): at 2 threads on the 0.5B
# shape about 2.5x faster per GEMM than level 0 (fp32 from dequantized weights), the way onnxruntime-genai builds its
# int4 engines. The extra rounding is ~0.4% of each activation block's range; the eager forward below does the same.
INT4_ACCURACY_LEVEL = 4


class MatMulNBits(torch.autograd.Function):
    """x [..., K] times W^T, W [N, K] stored as ``b`` uint8 [N, ceil(K/block), block * bits / 8] (unsigned, zero
    point 2^(bits-1); 4 bits: element k in the low nibble when k is even) with ``scales`` fp32 [N * ceil(K/block)]:
    ONNX Runtime's ``com.microsoft.MatMulNBits``."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, k: int, n: int,
                block: int, bits: int = 4) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():  # the tracer needs the shape only: skip dequantizing every weight
            return x.new_zeros((*x.shape[:-1], n))
        if bits == 4:
            lo, hi = (b & 0x0F).to(torch.float32), (b >> 4).to(torch.float32)
            u = torch.stack((lo, hi), dim=-1).reshape(n, -1)[:, :k] - 8  # [N, K]
        else:
            u = b.to(torch.float32).reshape(n, -1)[:, :k] - 128
        w = u * scales.reshape(n, -1).repeat_interleave(block, dim=1)[:, :k]
        return _int8_blocks(x, block) @ w.t()

    @staticmethod
    def symbolic(g: Any, x: Any, b: Any, scales: Any, k: int, n: int, block: int, bits: int = 4) -> Any:
        out = g.op("com.microsoft::MatMulNBits", x, b, scales, K_i=k, N_i=n, bits_i=bits, block_size_i=block,
                   accuracy_level_i=INT4_ACCURACY_LEVEL)
        return typed(out, x, n)


def _int8_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded as MatMulNBits' accuracy_level 4 rounds it: per block of ``block`` along K, to the int8 grid of
    the block's amax / 127."""
    if INT4_ACCURACY_LEVEL != 4:
        return x
    k = x.shape[-1]
    pad = -k % block
    xb = torch.nn.functional.pad(x, (0, pad)).reshape(*x.shape[:-1], -1, block)
    scale = xb.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(xb / torch.where(scale > 0, scale, 1)), 0) * scale
    return q.reshape(*x.shape[:-1], -1)[..., :k]


def typed(out: Any, x: Any, n: int | None) -> Any:
    """A contrib op's output type for the exporter's shape inference: x's type with the last dim N."""
    sizes = x.type().varyingSizes()
    if sizes is not None:
        out.setType(x.type().with_sizes([*sizes[:-1], n]))
    return out


def param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class QuantLinear(nn.Module):
    """Base of a method's linear: the float bias (when the layer has one) and the activation's pre_quant_scale
    (AWQ / SmoothQuant)."""

    def __init__(self, layer: LinearLayer, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        pqs = tensors.get("pre_quant_scale")
        self.pre_quant_scale = param(pqs.float()) if pqs is not None else None
        bias = tensors.get("bias")
        self.bias = param(bias.float()) if bias is not None else None

    def _smooth(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.pre_quant_scale if self.pre_quant_scale is not None else x

    def _bias(self, y: torch.Tensor) -> torch.Tensor:
        return y + self.bias if self.bias is not None else y

    def scale_outputs(self, factor: torch.Tensor) -> bool:
        """Multiply output column j by ``factor[j]`` through the weight's scales when they are per output column
        (True); a method whose scales are not returns False and changes nothing."""
        return False


class WeightOnlyLMHead(nn.Module):
    """An LM head quantized at export, on request (``--lm-head-precision int8_wo | int4_wo``; the checkpoint keeps
    it in float): round-to-nearest, symmetric, one fp32 scale per LM_HEAD_BLOCK inputs, run by MatMulNBits (bits 8
    or 4, accuracy_level 4). A decode step reads the LM head whole: at Qwen2.5-0.5B's vocabulary it is 544 MB in fp32
    of a 730 MB int4 engine; int8 makes it 153 MB, int4 85 MB (what onnxruntime-genai's int4 builder does)."""

    def __init__(self, weight: torch.Tensor, bits: int) -> None:
        super().__init__()
        n, k = weight.shape
        self.in_features, self.out_features, self.bits, self.block = k, n, bits, LM_HEAD_BLOCK
        blocks = math.ceil(k / self.block)
        w = torch.zeros(n, blocks * self.block)
        w[:, :k] = weight.float()
        w = w.reshape(n, blocks, self.block)
        top = 2 ** (bits - 1)
        scale = (w.abs().amax(dim=2) / (top - 1)).clamp_min(1e-12)  # [N, blocks]
        u = (torch.clamp(torch.round(w / scale[..., None]), -top, top - 1) + top).to(torch.uint8)
        if bits == 4:
            u = u.reshape(n, blocks, self.block // 2, 2)
            u = u[..., 0] | (u[..., 1] << 4)
        self.qweight = param(u.contiguous())
        self.scales = param(scale.reshape(-1).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return MatMulNBits.apply(x, self.qweight, self.scales, self.in_features, self.out_features, self.block,
                                  self.bits)


class GatheredEmbedding(nn.Module):
    """The token embedding in the checkpoint's own half-precision dtype, cast to fp32 after the lookup (exact): once
    the LM head is quantized the table is only gathered (one row per token), so it need not be widened on disk."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(weight)
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, self.weight).to(self.dtype)


LM_HEAD_BITS = {"int8_wo": 8, "int4_wo": 4}
LM_HEAD_BLOCK = 32


def _fold_down_smoothing(mlp: nn.Module) -> None:
    """down_proj's input is act(gate) * up, so its pre_quant_scale (one factor per up output column) moves into
    up_proj's per-output-column weight scales (and bias): one multiply fewer per layer and step, the same product up
    to fp32 rounding of the scales."""
    down, up = getattr(mlp, "down_proj", None), getattr(mlp, "up_proj", None)
    if not isinstance(down, QuantLinear) or down.pre_quant_scale is None:
        return
    pqs = down.pre_quant_scale.detach()
    if not isinstance(up, QuantLinear) or not up.scale_outputs(pqs):
        return
    if up.bias is not None:
        up.bias = param(up.bias.detach() * pqs)
    down.pre_quant_scale = None


def _fold_input_smoothing(norm: nn.Module, linears: list[nn.Module]) -> None:
    """The linears reading one RMSNorm's output (q/k/v; gate/up) each multiply it by their pre_quant_scale: the
    first one's moves into the norm's weight, the others' become their ratio to it (dropped where it is exactly 1:
    SmoothQuant's shared scale). Two multiplies fewer per layer and step for AWQ's per-linear scales (one multiply
    node costs about what a small MatMulNBits does at batch 1), the same products up to fp32 rounding."""
    if type(norm) is not RMSNorm:  # only a plain ``weight * x / rms`` norm carries a scale exactly
        return
    if not all(isinstance(lin, QuantLinear) and lin.pre_quant_scale is not None for lin in linears):
        return
    base = linears[0].pre_quant_scale.detach()  # type: ignore[union-attr]
    if not bool(torch.isfinite(base).all()) or not bool((base > 0).all()):
        return
    norm.weight = param(norm.weight.detach() * base)
    for lin in linears:
        ratio = lin.pre_quant_scale.detach() / base  # type: ignore[union-attr]
        lin.pre_quant_scale = None if bool((ratio == 1).all()) else param(ratio)  # type: ignore[assignment]


def make_quant_linear(layer: LinearLayer, tensors: Mapping[str, torch.Tensor], layout: QuantLayout) -> nn.Module:
    """The stored layer as its method's module (the method's ``ort_linear``; a method export refuses says why)."""
    from edgellm.quant import method

    return method(layer.precision.value).ort_linear(layer, tensors, layout)


def load_quantized_decoder(ckpt_dir: Path, cfg: ModelConfig, family: type[ModelFamily], layout: QuantLayout,
                           dtype: torch.dtype = torch.float32, lm_head: str = "fp32",
                           fold_input_smoothing: bool = True) -> Any:
    """The decoder (edgellm.models.decoder) of a quantized checkpoint: its quantized linears are ``QuantLinear``
    modules plugged in place of the float ones, its float tensors are cast to ``dtype``; ``lm_head`` int8_wo /
    int4_wo quantizes the (float) LM head, see WeightOnlyLMHead. ``fold_input_smoothing`` False keeps every linear's
    own pre_quant_scale multiply (the checkpoint's arithmetic as written, which the folded decoder the export traces
    must match)."""
    from safetensors import safe_open

    from edgellm.models.decoder import Decoder
    from edgellm.weights import weight_files

    if not family.quantized_export:
        raise UnsupportedError(f"{family.name}: a quantized checkpoint's fused linears (qkv_proj, gate_up_proj) are "
                               f"not exported (each would need its split widths); export the float checkpoint")
    # Gemma's (1 + w) norms cannot take a smoothing scale by multiplying the weight: each linear keeps its own
    fold_input_smoothing = fold_input_smoothing and not family.norm_offset
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
                    state[name] = f.get_tensor(name)
    modules: dict[str, nn.Module] = {m: make_quant_linear(lin, parts[m], layout) for m, lin in quantized.items()}
    if lm_head in LM_HEAD_BITS:
        embed = state["model.embed_tokens.weight"]
        modules["lm_head"] = WeightOnlyLMHead(state.pop("lm_head.weight", embed), LM_HEAD_BITS[lm_head])  # tied: it
        if embed.dtype in (torch.float16, torch.bfloat16):
            modules["model.embed_tokens"] = GatheredEmbedding(state.pop("model.embed_tokens.weight"), dtype)
    elif lm_head != "fp32":
        raise BugError(f"LM-head precision {lm_head!r} is not built for quantized exports")
    model = Decoder.from_weights(cfg, family, state, dtype, modules=modules)
    for layer in model.model.layers:
        _fold_down_smoothing(layer.mlp)
        if not fold_input_smoothing:
            continue
        attn, mlp = layer.self_attn, layer.mlp
        _fold_input_smoothing(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj])
        _fold_input_smoothing(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])
    return model
