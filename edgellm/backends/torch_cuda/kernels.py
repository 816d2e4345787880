"""Triton kernels of the torch-CUDA decoder (issue 25): the small ops between the GEMMs, each one kernel, so a decode
step is nine kernels a layer (three Triton here, four cuBLAS GEMMs, RMSNorm twice) instead of the ~15 that the
layer modules launch. Imported lazily, only where a CUDA session runs (``triton`` comes with CUDA builds of torch;
CPU-only installs never import this module).

Numerics follow the layer modules (``edgellm.models.decoder``): RMSNorm in fp32 and scaled in the model dtype,
RoPE from the same cos/sin tables, SiLU rounded to the model dtype before the product; attention scores, softmax and
the weighted sum in fp32 (transformers rounds scores and probabilities to the model dtype; this is closer to fp32).

Shapes: tokens ``T = B * S`` (rows of hidden states [T, H]); the KV cache of one layer ``kv`` [2, max_batch, KV,
capacity, D]; ``col`` an int64 [1] device tensor holding the cache column of position 0 of this call (a CUDA graph
replays with whatever it holds); ``valid`` bool [max_batch, capacity].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MASKED = tl.constexpr(-1.0e30)  # masked scores: finite, as the model's MASK_VALUE (a masked prefix stays finite)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_out, BLOCK: tl.constexpr):
    """One row of x [T, H] -> w * (x * rsqrt(mean(x^2) + eps)).to(dtype)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = h.to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_out + cols, y.to(x.dtype), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H] (rows contiguous) -> [T, H]."""
    t, h = x.shape
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)
    _rms_norm_kernel[(t,)](x, weight, out, h, eps, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(h),
                           num_warps=4 if h <= 2048 else 8)
    return out


@triton.jit
def _head_norm(x1, x2, w_ptr, eps, half, i, DTYPE: tl.constexpr):
    """Per-head RMSNorm (qk_norm families) of one head given as its two halves (fp32), rounded to the model dtype."""
    r = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * half) + eps)
    w1 = tl.load(w_ptr + i).to(tl.float32)
    w2 = tl.load(w_ptr + half + i).to(tl.float32)
    y1 = (x1 * r).to(DTYPE).to(tl.float32) * w1
    y2 = (x2 * r).to(DTYPE).to(tl.float32) * w2
    return y1.to(DTYPE).to(tl.float32), y2.to(DTYPE).to(tl.float32)


@triton.jit
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, col_ptr, q_ptr, kv_ptr, qn_ptr, kn_ptr, seq, eps,
                       stride_qkv, s_kv, s_b, s_h, s_c,
                       N_Q: tl.constexpr, N_KV: tl.constexpr, HALF: tl.constexpr, QK_NORM: tl.constexpr):
    """Program (token t, head h of the N_Q + 2 * N_KV in qkv [T, (N_Q + 2 N_KV) * D]): a query head -> RoPE -> q
    [T, N_Q, D]; a key head -> RoPE -> the cache's keys at column col + t % seq; a value head -> the cache's values."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    d: tl.constexpr = 2 * HALF
    i = tl.arange(0, HALF)
    src = qkv_ptr + t * stride_qkv + h * d
    dtype = qkv_ptr.dtype.element_ty
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    b = t // seq
    col = tl.load(col_ptr) + t % seq
    if h < N_Q + N_KV:
        if QK_NORM:
            if h < N_Q:
                x1, x2 = _head_norm(x1, x2, qn_ptr, eps, HALF, i, dtype)
            else:
                x1, x2 = _head_norm(x1, x2, kn_ptr, eps, HALF, i, dtype)
        pos = tl.load(pos_ptr + t)
        c1 = tl.load(cos_ptr + pos * d + i).to(tl.float32)
        c2 = tl.load(cos_ptr + pos * d + HALF + i).to(tl.float32)
        s1 = tl.load(sin_ptr + pos * d + i).to(tl.float32)  # sin with rotate_half's sign (negative half)
        s2 = tl.load(sin_ptr + pos * d + HALF + i).to(tl.float32)
        y1 = (x1 * c1 + x2 * s1).to(dtype)
        y2 = (x2 * c2 + x1 * s2).to(dtype)
        if h < N_Q:  # noqa: SIM108 (a runtime branch: Triton has no runtime conditional expression)
            dst = q_ptr + (t * N_Q + h) * d
        else:
            dst = kv_ptr + b * s_b + (h - N_Q) * s_h + col * s_c
        tl.store(dst + i, y1)
        tl.store(dst + HALF + i, y2)
    else:
        dst = kv_ptr + s_kv + b * s_b + (h - N_Q - N_KV) * s_h + col * s_c
        tl.store(dst + i, x1.to(dtype))
        tl.store(dst + HALF + i, x2.to(dtype))


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, col: torch.Tensor,
               kv: torch.Tensor, heads: tuple[int, int, int], seq: int, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """qkv [T, (N_Q + 2 KV) * D] (T = B * seq tokens, batch-major), cos/sin tables [capacity, D], positions int64
    [T], col int64 [1]: writes the rotated keys and the values into kv [2, B_max, KV, C, D] at columns
    col .. col + seq - 1 and returns the rotated queries [T, N_Q, D]."""
    n_q, n_kv, d = heads
    t = qkv.shape[0]
    q = torch.empty((t, n_q, d), dtype=qkv.dtype, device=qkv.device)
    norm = q_norm is not None and k_norm is not None
    _rope_cache_kernel[(t, n_q + 2 * n_kv)](
        qkv, cos, sin, positions, col, q, kv, q_norm if norm else q, k_norm if norm else q, seq, eps,
        qkv.stride(0), kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
        N_Q=n_q, N_KV=n_kv, HALF=d // 2, QK_NORM=norm, num_warps=1)
    return q


@triton.jit
def _decode_attention_kernel(q_ptr, kv_ptr, valid_ptr, col_ptr, out_ptr, scale, s_kv, s_b, s_h, s_c, s_valid,
                             N_Q: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
    """Program (row b, query head h): q [B, N_Q, D] against the cache's columns 0 .. col (those ``valid`` marks)
    with an online softmax, one pass over the keys and values -> out [B, N_Q * D]."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (b * N_Q + h) * D + d).to(tl.float32)
    n = tl.load(col_ptr) + 1  # the columns written so far, this step's included
    k_base = kv_ptr + b * s_b + (h // REP) * s_h
    v_base = k_base + s_kv
    m_i = tl.zeros([1], dtype=tl.float32) + MASKED
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    start = n * 0  # a tensor from the start (a loop-carried value keeps its type)
    while start < n:  # a bound read on the device: a CUDA graph replays it for any length
        cols = start + tl.arange(0, BLOCK_T)
        inside = cols < n
        ok = tl.load(valid_ptr + b * s_valid + cols, mask=inside, other=0) != 0
        k = tl.load(k_base + cols[:, None] * s_c + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], axis=1) * scale, MASKED)  # [BLOCK_T]
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.where(inside, tl.exp(s - m_new), 0.0)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_base + cols[:, None] * s_c + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
        start += BLOCK_T
    out = acc / l_i
    tl.store(out_ptr + (b * N_Q + h) * D + d, out.to(out_ptr.dtype.element_ty))


def decode_attention(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, col: torch.Tensor,
                     heads: tuple[int, int, int], scale: float) -> torch.Tensor:
    """One query per row: q [B, N_Q, D] against kv [2, B_max, KV, C, D] columns 0..col -> [B, N_Q * D]."""
    n_q, n_kv, d = heads
    b = q.shape[0]
    out = torch.empty((b, n_q * d), dtype=q.dtype, device=q.device)
    flags = valid.view(torch.uint8)
    _decode_attention_kernel[(b, n_q)](q, kv, flags, col, out, scale, kv.stride(0), kv.stride(1), kv.stride(2),
                                       kv.stride(3), flags.stride(0), N_Q=n_q, REP=n_q // n_kv, D=d,
                                       BLOCK_T=64 if d <= 64 else 32, num_warps=4)
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, width, stride_gu, stride_out, BLOCK: tl.constexpr):
    """gu [T, 2F] (gate | up) -> silu(gate) * up [T, F], silu rounded to the model dtype first (as two torch ops)."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < width
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=m, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + width + cols, mask=m, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * u).to(g.dtype), mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    t, two_f = gu.shape
    f = two_f // 2
    out = torch.empty((t, f), dtype=gu.dtype, device=gu.device)
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(f, block))](gu, out, f, gu.stride(0), out.stride(0), BLOCK=block, num_warps=4)
    return out
