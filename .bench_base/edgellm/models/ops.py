"""The decoder's math primitives and the autograd functions whose ONNX form is ONNX Runtime's fused op for them
(their eager forward is the same math): RMSNorm, RoPE, grouped-query attention (edgellm.models.decoder assembles
them into layers; the torch-cuda runtime calls them around its own cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

# Masked scores use a large finite negative (not -inf) so fully padded query rows stay finite.
MASK_VALUE = -1e30


class ShapeOnlyLinear(torch.autograd.Function):
    """``x @ W^T`` in the ONNX form ``nn.Linear`` exports (MatMul of a Transpose), computing only the output's shape:
    zeros [..., out_features]."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((*x.shape[:-1], weight.shape[0]))

    @staticmethod
    def symbolic(g: Any, x: Any, weight: Any) -> Any:
        return g.op("MatMul", x, g.op("Transpose", weight, perm_i=[1, 0]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis, computed in fp32 and scaled in ``x``'s dtype (transformers' Llama/Qwen)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope_freqs(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE angles [..., head_dim / 2] of ``positions`` (any shape): position * inv_freq in fp32."""
    return positions.float()[..., None] * inv_freq


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                 scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., rotary_dim] of ``positions`` (any shape): position * inv_freq in fp32, both halves, times
    the attention ``scaling`` (yarn, longrope) in fp32, then cos/sin in ``dtype``; ``sin`` carries rotate_half's sign
    (negated first half), so ``apply_rope`` is two products and a sum."""
    freqs = rope_freqs(positions, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    cos, sin = cos.to(dtype), sin.to(dtype)
    half = inv_freq.shape[0]
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with the sign of rotate_half folded into ``sin_signed`` (exact). A rotary
    width (cos's last axis) below x's rotates the first dims and passes the rest (partial_rotary_factor)."""
    rot = cos.shape[-1]
    if rot != x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, sin_signed), x[..., rot:]), dim=-1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin_signed


Rope = Callable[[torch.Tensor, int], torch.Tensor]  # rope(x, num_heads): see Decoder._rope_fn


def rotary(cos: torch.Tensor, sin_signed: torch.Tensor) -> Rope:
    """The ``rope`` of ``Attention.project`` from cos/sin (``rope_cos_sin``) broadcasting against [B, heads, S, D]."""
    return lambda x, num_heads: apply_rope(x, cos, sin_signed)


class RotaryEmbedding(torch.autograd.Function):
    """Rotary embedding from cos/sin tables [positions, head_dim / 2]; positions [B, S]; x [B, heads, S, head_dim]
    (``num_heads`` 0) or [B, S, num_heads * head_dim]. Exports as ONNX Runtime's fused
    ``com.microsoft.RotaryEmbedding`` (non-interleaved); eager is ``apply_rope`` of the tables (x1 cos - x2 sin,
    x2 cos + x1 sin)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor,
                sin_table: torch.Tensor, num_heads: int) -> torch.Tensor:
        flat = x.shape
        if num_heads:  # [B, S, N * D] -> [B, N, S, D]
            x = x.view(flat[0], flat[1], num_heads, -1).transpose(1, 2)
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]  # [B, 1, S, D/2]
        out = apply_rope(x, torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))
        return out.transpose(1, 2).reshape(flat) if num_heads else out

    @staticmethod
    def symbolic(g: Any, x: Any, positions: Any, cos_table: Any, sin_table: Any, num_heads: int) -> Any:
        out = g.op("com.microsoft::RotaryEmbedding", x, positions, cos_table, sin_table, interleaved_i=0,
                   **({"num_heads_i": num_heads} if num_heads else {}))
        out.setType(x.type())
        return out


class GroupQueryAttention(torch.autograd.Function):
    """Causal attention of rotated queries over past + new keys and values, heads grouped (GQA), exported as ONNX
    Runtime's ``com.microsoft.GroupQueryAttention`` (one node instead of the reshapes, transposes, concatenations,
    mask and softmax of ``Attention``'s own path).

    q [B, S, H * D], k and v [B, S, KV * D] (rotary already applied: the op's own rotary assumes right padding),
    past k/v [B, KV, P, D] -> out [B, S, H * D], present k/v [B, KV, P + S, D]. ``seqlens_k`` int32 [B] = P + S - 1
    and ``total`` int32 [] = P + S for every row: the op's padding is on the right, ours on the left, so every row
    counts as full and ``bias`` float32 [B, 1, S, P + S] (0 or MASK) masks the padding; the op adds the causal mask.
    ONNX Runtime refuses S > 1 with a past for B > 1 (the runtime runs such a step row by row)."""

    @staticmethod
    def forward(ctx: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
                past_v: torch.Tensor, seqlens_k: torch.Tensor, total: torch.Tensor, bias: torch.Tensor,
                num_heads: int, kv_heads: int, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, _ = q.shape
        p, d = past_k.shape[2], past_k.shape[3]
        k = torch.cat([past_k, k.view(b, s, kv_heads, d).transpose(1, 2)], dim=2)
        v = torch.cat([past_v, v.view(b, s, kv_heads, d).transpose(1, 2)], dim=2)
        causal = torch.arange(p + s)[None, :] <= torch.arange(s)[:, None] + p  # [S, P + S]
        mask = (causal & (bias == 0)).repeat(1, 1, num_heads // kv_heads, 1)  # grouped_attention's rows
        qh = q.view(b, s, num_heads, d).transpose(1, 2)
        return grouped_attention(qh, k, v, mask, (num_heads, kv_heads, d), scale, b, s), k, v

    @staticmethod
    def symbolic(g: Any, q: Any, k: Any, v: Any, past_k: Any, past_v: Any, seqlens_k: Any, total: Any, bias: Any,
                 num_heads: int, kv_heads: int, scale: float) -> tuple[Any, Any, Any]:
        none = g.op("prim::Constant")
        none.setType(torch._C.NoneType.get())
        out, present_k, present_v = g.op(
            "com.microsoft::GroupQueryAttention", q, k, v, past_k, past_v, seqlens_k, total, none, none, none, bias,
            num_heads_i=num_heads, kv_num_heads_i=kv_heads, scale_f=scale, do_rotary_i=0, outputs=3)
        out.setType(q.type())
        present_k.setType(past_k.type())
        present_v.setType(past_v.type())
        return out, present_k, present_v


class AddRMSNorm(torch.autograd.Function):
    """fp32 (RMSNorm(x + skip), x + skip), exported as ONNX Runtime's fused ``com.microsoft.
    SkipSimplifiedLayerNormalization`` (its fourth output is the sum): one node for the residual add and the norm,
    which ORT's own fusion leaves apart because the sum also feeds the next residual. Eager is ``rms_norm``."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + skip
        return rms_norm(total, weight, eps), total

    @staticmethod
    def symbolic(g: Any, x: Any, skip: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        out, _, _, total = g.op("com.microsoft::SkipSimplifiedLayerNormalization", x, skip, weight, epsilon_f=eps,
                                outputs=4)
        out.setType(x.type())
        total.setType(x.type())
        return out, total


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      heads: tuple[int, int, int], scale: float, b: int, s: int,
                      masked: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal grouped-query attention as transformers' eager path computes it (scores in the model dtype, softmax
    in fp32): q [B, H, S, D] against k/v [B, KV, T, D] -> [B, S, H * D]; ``heads`` (H, KV, D) and ``b``, ``s`` are
    given (a trace records shapes read from tensors). K/V are not repeated: the query heads of a group fold into the
    rows (row j * S + i is query position i of the group's head j), so ``mask`` (True = attend) broadcasts to
    [B, KV, rep * S, T]; masked scores take MASK_VALUE (``masked``: that value as a 0-dim float32 tensor already
    on the scores' device, for a caller captured in a CUDA graph, where a CPU constant cannot be copied). ``softcap``
    (Gemma-2's attn_logit_softcapping): scores = tanh(scores / cap) * cap, in the model dtype, before the mask."""
    n_heads, n_kv, head_dim = heads
    rep = n_heads // n_kv
    # Without groups (MHA) q is already [B, KV, S, D]: a reshape to its own shape, traced inside
    # GroupQueryAttention's export, breaks TorchScript's peephole pass ("Argument passed to at() was not in the map").
    qg = q if rep == 1 else q.reshape(b, n_kv, rep * s, head_dim)
    scores = torch.matmul(qg, k.transpose(2, 3)) * scale  # [B, KV, rep*S, T]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.float()
    fill = masked if masked is not None else torch.tensor(MASK_VALUE, dtype=torch.float32)
    scores = torch.where(mask, scores, fill)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v).view(b, n_heads, s, head_dim)
    return out.transpose(1, 2).reshape(b, s, n_heads * head_dim)


class FusedMask(NamedTuple):
    """What ``GroupQueryAttention`` takes instead of the boolean mask (shapes in its docstring)."""

    seqlens_k: torch.Tensor
    total: torch.Tensor
    bias: torch.Tensor
