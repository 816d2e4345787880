"""Triton kernels of the torch-CUDA decoder (issue 25). Prefill: the small ops between cuBLAS GEMMs (RMSNorm, RoPE +
cache write, SiLU * up), one kernel each. Decode: eight kernels a layer, all here: GEMVs that read each weight once
(``gemv``: split along K into float32 partial sums where the output is narrow, SiLU * up fused into gate/up), RoPE +
cache write summing the q/k/v partials, attention over the written columns, and the residual add + the next RMSNorm
summing the o_proj / down partials. Imported lazily, only where a CUDA session runs (``triton`` comes with CUDA
builds of torch; CPU-only installs never import this module).

Numerics follow the layer modules (``edgellm.models.decoder``): RMSNorm in fp32 and scaled in the model dtype,
RoPE from the same cos/sin tables, SiLU rounded to the model dtype before the product; attention scores, softmax and
the weighted sum in fp32 (transformers rounds scores and probabilities to the model dtype; this is closer to fp32).

Launch (issue 39): with ``PDL`` on a Hopper or newer GPU every kernel here is a programmatic dependent launch: each
program first lets the next kernel of the stream launch (``gdc_launch_dependents``), then waits for the previous one
to finish and flush (``gdc_wait``) before it touches anything another kernel writes, so a kernel's launch and
prologue overlap the one before. ``pdl`` is the one decision. With ``PDL_PREFETCH`` a GEMV first prefetches its own
weight slice (weights nothing writes) into L2. Measured end to end on an H100, the Qwen2.5-0.5B shape bf16, one call,
each variant a fresh process (benchmarks/results/gpu_issue39_call3.json): plain launch batch 1 1,003 / 1,005 / 1,009
tok/s and batch 16 14,811 / 14,805 / 14,812 (three runs); dependent launch without the prefetch 1,026 and 15,948
(+2% and +8%); with the prefetch 910 and 15,101 (the prefetch costs batch 1 more than the launch overlap gains). So
it ships on, without the prefetch; older GPUs compile the instructions out.

Shapes: tokens ``T = B * S`` (rows of hidden states [T, H]); the KV cache of one layer ``kv`` [2, max_batch, KV,
capacity, D]; ``col`` an int64 [1] device tensor holding the cache column of position 0 of this call (a CUDA graph
replays with whatever it holds); ``valid`` bool [max_batch, capacity].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MASKED = tl.constexpr(-1.0e30)  # masked scores: finite, as the model's MASK_VALUE (a masked prefix stays finite)
PDL: bool = True  # programmatic dependent launch (``pdl``) where the GPU has it; False: the plain launch (the A/B)
PDL_PREFETCH: bool = False  # under PDL, a GEMV prefetches its weight slice into L2 before it waits (True: the A/B)
PDL_MIN_CAPABILITY = (9, 0)  # griddepcontrol: sm_90 (Hopper) and newer
_CAPABLE: dict[int, bool] = {}


def pdl(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch as programmatic dependent launches: ``PDL`` and a GPU of compute
    capability 9.0 or newer (never off a CUDA device: Triton's interpreter on the CPU has no such launch)."""
    if not PDL or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABLE:
        _CAPABLE[index] = torch.cuda.get_device_capability(index) >= PDL_MIN_CAPABILITY
    return _CAPABLE[index]


@triton.jit
def _chain(PDL: tl.constexpr):
    """A kernel's first step under PDL: let the next kernel launch, then wait until the previous one finished and its
    writes are visible. Nothing is read or written before this that another kernel writes."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def _prefetch_l2(ptrs):
    """L2 prefetch of each address (one 32-byte sector each; read-only data: the weights)."""
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [ptrs.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_out, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """One row of x [T, H] -> w * (x * rsqrt(mean(x^2) + eps)).to(dtype)."""
    _chain(PDL)
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
    on = pdl(x.device)
    _rms_norm_kernel[(t,)](x, weight, out, h, eps, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(h),
                           PDL=on, num_warps=4 if h <= 2048 else 8, launch_pdl=on)
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
def _rope_cache_kernel(qkv_ptr, bias_ptr, cos_ptr, sin_ptr, pos_ptr, col_ptr, q_ptr, kv_ptr, qn_ptr, kn_ptr, seq,
                       eps, stride_split, stride_qkv, s_kv, s_b, s_h, s_c, SPLIT: tl.constexpr,
                       N_Q: tl.constexpr, N_KV: tl.constexpr, HALF: tl.constexpr, QK_NORM: tl.constexpr,
                       HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    """Program (token t, head h of the N_Q + 2 * N_KV in qkv [split, T, (N_Q + 2 N_KV) * D], summed over split (a
    split-K GEMV's partial sums; split 1: the GEMM's output) + bias, rounded to the model dtype): a query head ->
    RoPE -> q [T, N_Q, D]; a key head -> RoPE -> the cache's keys at column col + t % seq; a value head -> the
    cache's values."""
    _chain(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    d: tl.constexpr = 2 * HALF
    i = tl.arange(0, HALF)
    dtype = q_ptr.dtype.element_ty
    x1 = tl.zeros([HALF], dtype=tl.float32)
    x2 = tl.zeros([HALF], dtype=tl.float32)
    for p in range(0, SPLIT):
        src = qkv_ptr + p * stride_split + t * stride_qkv + h * d
        x1 += tl.load(src + i).to(tl.float32)
        x2 += tl.load(src + HALF + i).to(tl.float32)
    if HAS_BIAS:
        x1 += tl.load(bias_ptr + h * d + i).to(tl.float32)
        x2 += tl.load(bias_ptr + h * d + HALF + i).to(tl.float32)
    x1 = x1.to(dtype).to(tl.float32)  # the projection's output in the model dtype, as the GEMM's
    x2 = x2.to(dtype).to(tl.float32)
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
               k_norm: torch.Tensor | None = None, eps: float = 0.0, bias: torch.Tensor | None = None) -> torch.Tensor:
    """qkv [T, (N_Q + 2 KV) * D] in the model dtype, or float32 partial sums [split, T, ...] (``gemv``'s, then
    ``bias`` is added here); T = B * seq tokens, batch-major. cos/sin tables [capacity, D], positions int64 [T],
    col int64 [1]: writes the rotated keys and the values into kv [2, B_max, KV, C, D] at columns
    col .. col + seq - 1 and returns the rotated queries [T, N_Q, D] in kv's dtype."""
    n_q, n_kv, d = heads
    parts = qkv if qkv.dim() == 3 else qkv[None]
    t = parts.shape[1]
    q = torch.empty((t, n_q, d), dtype=kv.dtype, device=qkv.device)
    norm = q_norm is not None and k_norm is not None
    on = pdl(qkv.device)
    _rope_cache_kernel[(t, n_q + 2 * n_kv)](
        parts, bias if bias is not None else q, cos, sin, positions, col, q, kv, q_norm if norm else q,
        k_norm if norm else q, seq, eps, parts.stride(0), parts.stride(1),
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), SPLIT=parts.shape[0],
        N_Q=n_q, N_KV=n_kv, HALF=d // 2, QK_NORM=norm, HAS_BIAS=bias is not None, PDL=on, num_warps=1,
        launch_pdl=on)
    return q


@triton.jit
def _decode_attention_kernel(q_ptr, kv_ptr, valid_ptr, col_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, scale, s_kv, s_b,
                             s_h, s_c, s_valid, N_Q: tl.constexpr, REP: tl.constexpr, D: tl.constexpr,
                             BLOCK_T: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Program (row b, query head h, slice s): q [B, N_Q, D] against the s-th of SPLITS equal slices of the cache's
    columns 0 .. col (those ``valid`` marks; a slice a multiple of BLOCK_T; the length is read on the device, so a
    CUDA graph replays it for any length) with an online softmax, one pass over the keys and values -> the slice's
    running max, sum and unnormalised output (float32), merged by ``_merge_splits_kernel``."""
    _chain(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (b * N_Q + h) * D + d).to(tl.float32)
    n = tl.load(col_ptr) + 1
    per = (n + SPLITS * BLOCK_T - 1) // (SPLITS * BLOCK_T) * BLOCK_T
    start = sp * per
    end = tl.minimum(n, start + per)
    k_base = kv_ptr + b * s_b + (h // REP) * s_h
    v_base = k_base + s_kv
    m_i = tl.zeros([1], dtype=tl.float32) + MASKED
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    while start < end:
        cols = start + tl.arange(0, BLOCK_T)
        inside = cols < end
        ok = tl.load(valid_ptr + b * s_valid + cols, mask=inside, other=0) != 0
        k = tl.load(k_base + cols[:, None] * s_c + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_base + cols[:, None] * s_c + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], axis=1) * scale, MASKED)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.where(inside, tl.exp(s - m_new), 0.0)
        alpha = tl.exp(m_i - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
        start += BLOCK_T
    if SPLITS == 1:  # the whole length in one program: the output itself, no merge
        tl.store(out_ptr + (b * N_Q + h) * D + d, (acc / l_i).to(out_ptr.dtype.element_ty))
    else:
        slot = (b * N_Q + h) * SPLITS + sp
        one = tl.arange(0, 1)
        tl.store(m_ptr + slot + one, m_i)
        tl.store(l_ptr + slot + one, l_i)
        tl.store(acc_ptr + slot * D + d, acc)


@triton.jit
def _merge_splits_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, D: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Program (row b * N_Q + h): the SPLITS slices' (max, sum, output) -> the normalised output [D]."""
    _chain(PDL)
    r = tl.program_id(0)
    sp = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    m = tl.load(m_ptr + r * SPLITS + sp)
    l_s = tl.load(l_ptr + r * SPLITS + sp)
    acc = tl.load(acc_ptr + (r * SPLITS + sp)[:, None] * D + d[None, :])
    m_all = tl.max(m, axis=0)
    w = tl.where(l_s > 0, tl.exp(m - m_all), 0.0)  # an empty slice (l = 0) adds nothing
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l_s, axis=0)
    tl.store(out_ptr + r * D + d, out.to(out_ptr.dtype.element_ty))


def attention_split(batch: int) -> tuple[int, int]:
    """(slices of the columns, columns a loop step) for decode attention at ``batch`` rows: few rows -> many slices
    (few query heads alone leave most SMs idle), many rows -> a few. Measured on an H100 over 128..2048 columns
    (``benchmarks/gpu_sweep.py``; benchmarks/results/gpu_sweep_issue39_call1.json): one pass per head took 3.6, 5.7,
    18.5, 38.7 us at batch 1, 32 slices of 32-column steps 4.4, 4.6, 5.5, 7.6 us."""
    return (32, 32) if batch < 4 else (4, 64)  # end to end on an H100: batch 1 965 -> 1,011 tok/s, 16 14,553 -> 14,838


def decode_attention(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, col: torch.Tensor,
                     heads: tuple[int, int, int], scale: float, splits: int | None = None,
                     block_t: int | None = None) -> torch.Tensor:
    """One query per row: q [B, N_Q, D] against kv [2, B_max, KV, C, D] columns 0..col -> [B, N_Q * D]: the columns
    split into ``splits`` slices (the flash-decoding split; ``attention_split`` by default), merged by a second
    kernel."""
    n_q, n_kv, d = heads
    b = q.shape[0]
    default_splits, default_block = attention_split(b)
    splits, block_t = splits or default_splits, block_t or default_block
    out = torch.empty((b, n_q * d), dtype=q.dtype, device=q.device)
    flags = valid.view(torch.uint8)
    m = l_s = acc = out  # one slice: the kernel writes the output itself
    on = pdl(q.device)
    if splits > 1:
        m = torch.empty((b * n_q * splits,), dtype=torch.float32, device=q.device)
        l_s = torch.empty_like(m)
        acc = torch.empty((b * n_q * splits, d), dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(b, n_q, splits)](
        q, kv, flags, col, m, l_s, acc, out, scale, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
        flags.stride(0), N_Q=n_q, REP=n_q // n_kv, D=d, BLOCK_T=block_t, SPLITS=splits, PDL=on,
        num_warps=8 if splits == 1 else 4, launch_pdl=on)
    if splits > 1:
        _merge_splits_kernel[(b * n_q,)](m, l_s, acc, out, D=d, SPLITS=splits, PDL=on, num_warps=1,
                                         launch_pdl=on)
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, width, stride_gu, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """gu [T, 2F] (gate | up) -> silu(gate) * up [T, F], silu rounded to the model dtype first (as two torch ops)."""
    _chain(PDL)
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
    on = pdl(gu.device)
    _silu_mul_kernel[(t, triton.cdiv(f, block))](gu, out, f, gu.stride(0), out.stride(0), BLOCK=block, PDL=on,
                                                  num_warps=4, launch_pdl=on)
    return out


# --- GEMV for decode (a few rows): W [K, N] read once, split along K where N alone gives too few programs --------
TARGET_PROGRAMS = 132  # about one program per SM of an H100/H200; fewer leave HBM bandwidth unused


@triton.jit
def _dot(x, w, IEEE: tl.constexpr):
    """x [BM, BK] @ w [BK, BN] accumulated in fp32 on the tensor cores (fp32 inputs: exact products, no TF32). The
    rows are padded to 16 even for one: measured on the H200, a broadcast product for BM = 1 was slower (issue 25)."""
    if IEEE:
        return tl.dot(x, w, input_precision="ieee")
    else:
        return tl.dot(x, w)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_x, stride_w, K_PER: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
                 PARTIAL: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                 SECTOR: tl.constexpr, PF_ROWS: tl.constexpr):
    """Program (column block, K split, row block): x [M, K] @ W[k range, columns]. PARTIAL: float32 partial sums
    out [split, M, N]; else out [M, N] in x's dtype with the bias, and with SILU the columns n of gate (W's first N
    columns) and n + N of up give silu(gate) * up (each rounded to the model dtype first, as the torch ops).
    PDL: the program waits for the kernel before (which wrote x) before reading x; with PREFETCH its weight slice (its
    K range x its columns) is first prefetched into L2, one prefetch per 32-byte sector."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = tl.program_id(2) * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    n_ok = rn < N
    m_ok = rm < M
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        if PREFETCH and tl.program_id(2) == 0:  # one row block prefetches: the others read the same weights
            sectors = tl.minimum(pid_n * BN + tl.arange(0, BN // SECTOR) * SECTOR, N - 1)
            for kk in range(0, K_PER, PF_ROWS):
                pk = tl.minimum(pid_k * K_PER + kk + tl.arange(0, PF_ROWS), K - 1)
                at = w_ptr + pk[:, None] * stride_w + sectors[None, :]
                _prefetch_l2(at)
                if SILU:
                    _prefetch_l2(at + N)
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc_up = tl.zeros([BM, BN], dtype=tl.float32)
    for kk in range(0, K_PER, BK):
        k = pid_k * K_PER + kk + rk
        k_ok = k < K
        x = tl.load(x_ptr + rm[:, None] * stride_x + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_off = w_ptr + k[:, None] * stride_w + rn[None, :]
        w_ok = k_ok[:, None] & n_ok[None, :]
        acc += _dot(x, tl.load(w_off, mask=w_ok, other=0.0), IEEE)
        if SILU:
            acc_up += _dot(x, tl.load(w_off + N, mask=w_ok, other=0.0), IEEE)
    out_ok = m_ok[:, None] & n_ok[None, :]
    if PARTIAL:
        tl.store(out_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=out_ok)
    else:
        dt = out_ptr.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if SILU:
                acc_up += tl.load(b_ptr + N + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SILU:
            g = acc.to(dt).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            acc = act * acc_up.to(dt).to(tl.float32)
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(dt), mask=out_ok)


def gemv_tiles(k: int, silu: bool, partial: bool) -> tuple[int, int, int]:
    """(BN, BK, programs a split-K output aims at) of a decode GEMV. Shorter K steps and twice the programs looked
    faster alone (``benchmarks/gpu_sweep.py``: qkv 3.25 -> 2.83 us, o_proj 3.39 -> 2.62, down 5.90 -> 5.27 at one row
    on an H100) but lost end to end (batch 1 1,011 -> 940 tok/s, batch 16 14,838 -> 13,195: twice the partial sums
    for the kernel after to add; benchmarks/results/gpu_ab_issue39.json), so these stay."""
    if silu or not partial:
        return 32, 128, TARGET_PROGRAMS
    return 64, 128, TARGET_PROGRAMS


def gemv(x: torch.Tensor, w: torch.Tensor, *, bias: torch.Tensor | None = None, silu: bool = False,
         partial: bool = False) -> torch.Tensor:
    """x [M, K] @ w [K, N'] for a few rows M (decode). ``partial``: split along K, float32 partial sums
    [split, M, N'] (``add_partials_norm`` / ``rope_cache`` sum them); else [M, N'] in x's dtype (+ bias), and with
    ``silu`` (w = gate | up, N' = 2F) silu(x @ gate) * (x @ up) [M, F]."""
    m, k = x.shape
    n = w.shape[1] // 2 if silu else w.shape[1]
    bm = 16  # tl.dot's smallest tile; padded rows are masked (read as 0, never stored)
    bn, bk, target = gemv_tiles(k, silu, partial)
    n_blocks, m_blocks = triton.cdiv(n, bn), triton.cdiv(m, bm)
    split = 1
    if partial:  # enough programs to pull HBM bandwidth: split K until about ``target`` programs
        split = max(1, min(triton.cdiv(k, bk), target // max(1, n_blocks * m_blocks)))
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per)
    out = (torch.empty((split, m, n), dtype=torch.float32, device=x.device) if partial
           else torch.empty((m, n), dtype=x.dtype, device=x.device))
    on = pdl(x.device)
    sector = max(1, 32 // w.element_size())  # elements of one 32-byte L2 sector
    _gemv_kernel[(n_blocks, split, m_blocks)](
        x, w, bias if bias is not None else x, out, m, n, k, x.stride(0), w.stride(0), K_PER=k_per, BM=bm, BN=bn, BK=bk,
        SILU=silu, HAS_BIAS=bias is not None and not partial, PARTIAL=partial, IEEE=x.dtype == torch.float32,
        PDL=on, PREFETCH=on and PDL_PREFETCH, SECTOR=min(sector, bn), PF_ROWS=min(128, k_per), num_warps=4,
        num_stages=3, launch_pdl=on)
    return out


@triton.jit
def _add_partials_norm_kernel(part_ptr, M, x_ptr, b_ptr, w_ptr, xn_ptr, n_cols, eps, SPLIT: tl.constexpr,
                              HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Row r: x[r] += sum of the partials [split, M, H] (+ bias), rounded once to the model dtype (in place; the
    residual stream), then xn[r] = RMSNorm(x[r]) * w."""
    _chain(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in range(0, SPLIT):
        acc += tl.load(part_ptr + (p * M + row) * n_cols + cols, mask=m, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0)
    x = (x.to(tl.float32) + acc).to(x.dtype)
    tl.store(x_ptr + row * n_cols + cols, x, mask=m)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    y = h.to(x.dtype).to(tl.float32) * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(xn_ptr + row * n_cols + cols, y.to(x.dtype), mask=m)


def add_partials_norm(parts: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, weight: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """x [M, H] += parts [split, M, H] summed (+ bias), in place; returns RMSNorm(x) * weight [M, H]: a projection
    into the residual stream and the next norm, one kernel."""
    split, m, h = parts.shape
    xn = torch.empty_like(x)
    on = pdl(x.device)
    _add_partials_norm_kernel[(m,)](parts, m, x, bias if bias is not None else x, weight, xn, h, eps, SPLIT=split,
                                    HAS_BIAS=bias is not None, BLOCK=triton.next_power_of_2(h), PDL=on,
                                    num_warps=4 if h <= 2048 else 8, launch_pdl=on)
    return xn
