"""The decoder math of the torch-CUDA backend: weights from the engine's table, a KV cache preallocated for the
engine's limits, prefill through ``scaled_dot_product_attention`` and a decode step that reads and writes only
device buffers (so it can be captured in a CUDA graph).

Shapes: N tokens = B x S flattened; hidden [N, H]; linear weights ``[in, out]`` (made contiguous at load from the
export's ``[out, in]``) so a projection is ``x @ w``; q/k/v and gate/up fused along the output axis. Cache per layer:
keys and values [max_batch, kv_heads, capacity, head_dim]; ``valid`` [max_batch, capacity] marks the positions a row
may attend to (left padding stays invalid). Numerics follow transformers' eager path: RMSNorm in fp32, everything else
in the model dtype, softmax inside SDPA in fp32. """

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from edgellm.config import ModelConfig
from edgellm.models import family_for
from edgellm.models.decoder import rope_inv_freq

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CAPACITY_ALIGN = 64  # cache length rounded up so SDPA's masked kernels need no padded copy of the mask
SCRATCH_COLUMNS = 2  # cache columns past max_seq_len that graph warm-ups may write (never valid)


def load_parameters(data_file: Path, table: list[dict[str, Any]], device: torch.device) -> dict[str, torch.Tensor]:
    """``{hf_param: tensor}`` on ``device`` in Hugging Face orientation ([out, in] for linears, maybe a
    transposed view of what was stored), each a view into one device copy of its stored tensor."""
    raw = np.memmap(data_file, dtype=np.uint8, mode="r")
    params: dict[str, torch.Tensor] = {}
    for t in table:
        buf = torch.from_numpy(np.array(raw[t["offset"]:t["offset"] + t["length"]]))
        stored = buf.view(_TORCH_DTYPES[t["dtype"]]).reshape(t["shape"]).to(device)
        start = 0
        for m in t["members"]:
            width = int(m["shape"][0])
            if len(t["shape"]) == 1:
                params[m["param"]] = stored[start:start + width]
            elif t["transposed"]:
                params[m["param"]] = stored[:, start:start + width].t()
            else:
                params[m["param"]] = stored[start:start + width]
            start += width
    del raw
    return params


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x @ w if b is None else torch.addmm(b, x, w)


def attn_in(x: torch.Tensor, ln: torch.Tensor, wqkv: torch.Tensor, bqkv: torch.Tensor | None,
            qn: torch.Tensor | None, kn: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
            eps: float, heads: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, H], cos/sin [N, D] (rotate_half's sign folded into sin) -> q [N, Hq, D], k/v [N, KV, D]."""
    n_q, n_kv, d = heads
    qkv = _linear(rms_norm(x, ln, eps), wqkv, bqkv).view(x.shape[0], n_q + 2 * n_kv, d)
    q, k, v = qkv.split([n_q, n_kv, n_kv], dim=1)
    if qn is not None and kn is not None:
        q, k = rms_norm(q, qn, eps), rms_norm(k, kn, eps)
    c, s = cos[:, None], sin[:, None]
    q = q * c + torch.roll(q, d // 2, dims=-1) * s
    k = k * c + torch.roll(k, d // 2, dims=-1) * s
    return q, k, v


def attn_in_decode(x: torch.Tensor, ln: torch.Tensor, wqkv: torch.Tensor, bqkv: torch.Tensor | None,
                   qn: torch.Tensor | None, kn: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                   eps: float, heads: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``attn_in`` for one token per row, k and v stacked for one cache write: q [B, Hq, D], kv [2, B, KV, 1, D]."""
    q, k, v = attn_in(x, ln, wqkv, bqkv, qn, kn, cos, sin, eps, heads)
    return q, torch.stack([k, v])[:, :, :, None]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query per row against the whole cache, as transformers' eager attention computes it (scores in the
    model dtype, softmax in fp32): q [B, KV, rep, D], k/v [B, KV, T, D], mask [B, 1, 1, T] additive -> [B, Hq*D].
    Two batched matmuls parallel over T (a fused kernel with one query block per head would walk T serially)."""
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    probs = torch.softmax(scores.float() + mask, dim=-1).to(v.dtype)
    return (probs @ v).reshape(q.shape[0], -1)


def attn_out_mlp(x: torch.Tensor, o: torch.Tensor, wo: torch.Tensor, bo: torch.Tensor | None, ln: torch.Tensor,
                 wgu: torch.Tensor, bgu: torch.Tensor | None, wd: torch.Tensor, bd: torch.Tensor | None,
                 eps: float) -> torch.Tensor:
    """x [N, H] residual, o [N, Hq*D] attention output -> the layer's output [N, H]."""
    x = x + _linear(o, wo, bo)
    g, u = _linear(rms_norm(x, ln, eps), wgu, bgu).chunk(2, dim=-1)
    return x + _linear(F.silu(g) * u, wd, bd)


def lm_head(x: torch.Tensor, ln: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return (rms_norm(x, ln, eps) @ w).float()


@dataclass
class LayerWeights:
    ln1: torch.Tensor
    wqkv: torch.Tensor  # [H, (Hq + 2 KV) * D]
    bqkv: torch.Tensor | None
    qn: torch.Tensor | None
    kn: torch.Tensor | None
    wo: torch.Tensor  # [Hq * D, H]
    bo: torch.Tensor | None
    ln2: torch.Tensor
    wgu: torch.Tensor  # [H, 2F]
    bgu: torch.Tensor | None
    wd: torch.Tensor  # [F, H]
    bd: torch.Tensor | None


class GpuDecoder:
    """Weights and KV cache on one device; ``prefill`` (eager) and ``decode`` (graph-capturable) write the cache."""

    def __init__(self, cfg: ModelConfig, params: dict[str, torch.Tensor], *, max_batch_size: int,
                 max_seq_len: int, device: torch.device, fns: dict[str, Any] | None = None,
                 decode_sdpa: bool = False) -> None:
        self.cfg, self.device = cfg, device
        self.eps = cfg.rms_norm_eps
        self.heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.fns = fns or {"attn_in_decode": attn_in_decode, "decode_attention": decode_attention,
                           "attn_out_mlp": attn_out_mlp, "lm_head": lm_head}
        if decode_sdpa and "decode_attention" in self.fns:
            del self.fns["decode_attention"]
        family_for(cfg)  # refuses configs the math below does not implement

        def io(name: str) -> torch.Tensor:  # [in, out] contiguous
            return params[name].t().contiguous()

        def cat(names: list[str]) -> torch.Tensor:
            return torch.cat([params[n].t() for n in names], dim=1).contiguous()

        def opt(name: str) -> torch.Tensor | None:
            return params.get(name)

        def opt_cat(names: list[str]) -> torch.Tensor | None:
            return torch.cat([params[n] for n in names]) if all(n in params for n in names) else None

        self.layers: list[LayerWeights] = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            self.layers.append(LayerWeights(
                ln1=params[p + "input_layernorm.weight"],
                wqkv=cat([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]),
                bqkv=opt_cat([a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"]),
                qn=opt(a + "q_norm.weight"), kn=opt(a + "k_norm.weight"),
                wo=io(a + "o_proj.weight"), bo=opt(a + "o_proj.bias"),
                ln2=params[p + "post_attention_layernorm.weight"],
                wgu=cat([m + "gate_proj.weight", m + "up_proj.weight"]),
                bgu=opt_cat([m + "gate_proj.bias", m + "up_proj.bias"]),
                wd=io(m + "down_proj.weight"), bd=opt(m + "down_proj.bias"),
            ))
        self.embed = params["model.embed_tokens.weight"]  # [V, H], maybe a transposed view of the lm_head
        head = params.get("lm_head.weight", self.embed)
        self.lm_w = head.t()  # [H, V], a view: one copy of a tied embedding (cuBLAS reads either layout)
        self.norm = params["model.norm.weight"]
        self.dtype = self.embed.dtype
        # RoPE tables as the export's: position * inv_freq in fp32, then cos/sin in the model dtype
        self.capacity = -(-(max_seq_len + SCRATCH_COLUMNS) // CAPACITY_ALIGN) * CAPACITY_ALIGN
        freqs = torch.arange(self.capacity, dtype=torch.float32)[:, None] * rope_inv_freq(cfg)[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = cfg.head_dim // 2
        self.cos = emb.cos().to(self.dtype).to(device)
        sin = emb.sin().to(self.dtype)
        self.sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(device)
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        kv_shape = (2, max_batch_size, cfg.num_key_value_heads, self.capacity, cfg.head_dim)
        self.kv = [torch.zeros(kv_shape, dtype=self.dtype, device=device) for _ in self.layers]
        self.keys = [kv[0] for kv in self.kv]
        self.values = [kv[1] for kv in self.kv]
        self.valid = torch.zeros((max_batch_size, self.capacity), dtype=torch.bool, device=device)

    def kv_bytes(self) -> int:
        return sum(kv.numel() * kv.element_size() for kv in self.kv)

    def weight_bytes(self) -> int:
        seen: dict[int, int] = {}
        for lw in self.layers:
            for t in vars(lw).values():
                if isinstance(t, torch.Tensor):
                    seen[t.data_ptr()] = t.numel() * t.element_size()
        for t in (self.embed, self.lm_w, self.norm):
            seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, start: int, new_valid: torch.Tensor,
                logits_from: int, *, causal_only: bool) -> torch.Tensor:
        """ids/positions int64 [B, S] appended at cache column ``start``; ``new_valid`` bool [B, S] (False =
        padding). ``causal_only``: start 0 and no padding anywhere (the caller knows it without a device sync),
        so SDPA runs causal with no mask. Returns float32 logits [B, S - logits_from, V] of positions
        logits_from..S-1."""
        b, s = ids.shape
        end = start + s
        n_q, n_kv, d = self.heads
        self.valid[:b, start:end] = new_valid
        self.valid[:b, end:] = False
        x = F.embedding(ids.reshape(-1), self.embed)
        pos = positions.reshape(-1)
        cos, sin = self.cos[pos], self.sin[pos]
        mask = None
        if not causal_only:
            causal = torch.ones((s, end), dtype=torch.bool, device=self.device).tril(start)
            mask = causal[None] & self.valid[:b, None, :end]  # [B, S, T]
            # a padded query row attends to itself only: its output is unused but must stay finite
            eye = torch.zeros((s, end), dtype=torch.bool, device=self.device)
            eye[:, start:] = torch.eye(s, dtype=torch.bool, device=self.device)
            mask = (mask | (eye[None] & ~new_valid[:, :, None]))[:, None]
        for lw, kc, vc in zip(self.layers, self.keys, self.values, strict=True):
            q, k, v = attn_in(x, lw.ln1, lw.wqkv, lw.bqkv, lw.qn, lw.kn, cos, sin, self.eps, self.heads)
            kc[:b, :, start:end] = k.view(b, s, n_kv, d).transpose(1, 2)
            vc[:b, :, start:end] = v.view(b, s, n_kv, d).transpose(1, 2)
            qh = q.view(b, s, n_q, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(qh, kc[:b, :, :end], vc[:b, :, :end], attn_mask=mask,
                                               is_causal=mask is None, enable_gqa=n_q != n_kv)
            x = attn_out_mlp(x, o.transpose(1, 2).reshape(b * s, n_q * d), lw.wo, lw.bo, lw.ln2, lw.wgu, lw.bgu,
                             lw.wd, lw.bd, self.eps)
        x = x.view(b, s, -1)[:, logits_from:].reshape(-1, x.shape[-1])
        return lm_head(x, self.norm, self.lm_w, self.eps).view(b, s - logits_from, -1)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, write_idx: torch.Tensor) -> torch.Tensor:
        """One token per row, device tensors only (no host sync): tokens/positions int64 [B], write_idx int64 [1]
        (the cache column). Marks that column valid, appends k/v, returns float32 logits [B, V]."""
        b = tokens.shape[0]
        n_q, n_kv, d = self.heads
        valid = self.valid[:b]
        valid.index_fill_(1, write_idx, True)
        # additive mask built once per step (a bool mask would be converted by SDPA in every layer)
        sdpa = "decode_attention" not in self.fns
        mask = torch.zeros((b, 1, 1, self.capacity), dtype=self.dtype if sdpa else torch.float32,
                           device=self.device).masked_fill_(~valid[:, None, None, :], float("-inf"))
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[positions], self.sin[positions]
        f = self.fns
        for lw, kv, kc, vc in zip(self.layers, self.kv, self.keys, self.values, strict=True):
            q, new_kv = f["attn_in_decode"](x, lw.ln1, lw.wqkv, lw.bqkv, lw.qn, lw.kn, cos, sin, self.eps, self.heads)
            kv[:, :b].index_copy_(3, write_idx, new_kv)
            # the query heads of one kv head are its rows: [B, KV, rep, D] against [B, KV, T, D], no repeat
            qg = q.reshape(b, n_kv, n_q // n_kv, d)
            if sdpa:
                o = F.scaled_dot_product_attention(qg, kc[:b], vc[:b], attn_mask=mask).reshape(b, n_q * d)
            else:
                o = f["decode_attention"](qg, kc[:b], vc[:b], mask)
            x = f["attn_out_mlp"](x, o, lw.wo, lw.bo, lw.ln2, lw.wgu, lw.bgu, lw.wd, lw.bd, self.eps)
        return f["lm_head"](x, self.norm, self.lm_w, self.eps)
