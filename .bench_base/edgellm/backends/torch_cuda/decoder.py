"""The torch-CUDA backend's decoder: the model's own layers (``edgellm.models.decoder``, the code the export traces)
around a KV cache preallocated for the engine's limits. ``prefill`` runs eagerly, attention by
``scaled_dot_product_attention`` (the fused kernel of the same math); ``decode`` reads and writes only device buffers,
so it can be captured in a CUDA graph, and attends through the model's ``grouped_attention``.

The layers take ``ColumnLinear`` for their Linear (weights [in, out], contiguous at load from the export's
[out, in], so a projection is ``x @ w``; q/k/v and gate/up one GEMM each); the LM head stays the export's (cuBLAS reads
either layout). Hidden states [B, S, H]. Cache per layer: keys and values [max_batch, kv_heads, capacity, head_dim];
``valid`` [max_batch, capacity] marks the positions a row may attend to (left padding stays invalid). A windowed
layer's cache is a ring of ``window`` columns instead, [max_batch, kv_heads, window, head_dim]: position c lives in
column c % window, so it holds the last ``window`` positions (the window of the last query) and never more. Numerics
follow transformers' eager path: RMSNorm in fp32, everything else in the model dtype, softmax in fp32.

With ``fused`` (the default on a CUDA device) prefill and decode run the layers' math through ``kernels`` (Triton),
hidden states [T, H] with T = B * S. Prefill, per layer: RMSNorm, the q/k/v GEMM (cuBLAS), RoPE + cache write,
SDPA, the o_proj GEMM adding into the residual (cuBLAS beta = 1), RMSNorm, the gate/up GEMM, SiLU * up, the down
GEMM adding into the residual. Decode (a few rows), eight kernels a layer: ``kernels.gemv`` for the four
projections (split-K float32 partial sums where the output is narrow; SiLU * up fused into gate/up), RoPE + cache
write summing the q/k/v partials, attention over the written columns, and the residual add + next RMSNorm summing
the o_proj / down partials; the LM head stays cuBLAS. Without ``fused`` (the CPU, ``fused=False``, or a model the
kernels do not implement: sliding windows, partial rotary, several RoPE layer types, Gemma's norms and soft-capping,
see ``Decoder.plain``) both run through the layer modules as below. A windowed layer's prefill attends to its
ring's last window - 1 positions (gathered in order) and the new ones, then writes the last ``window`` new ones into
the ring; its decode writes one ring column and attends to the whole ring, masked where a column holds no valid
position yet.

The layer modules' decode step: its per-layer functions (``attn_in_decode``, ``decode_attention``,
``attn_out_mlp``, ``lm_head``) take the layer modules and tensors: ``torch.compile`` traces each once and reuses it
for every layer (the modules' parameters are inputs of the compiled code, not constants).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from edgellm.config import ModelConfig
from edgellm.models import family_for
from edgellm.models.base import LAYER_PREFIX
from edgellm.models.decoder import MASK_VALUE, Decoder, Layer, grouped_attention, rotary

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


def attn_in_decode(layer: Layer, x: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, 1, H], cos/sin [B, 1, 1, D] -> q [B, Hq, 1, D] and the new keys and values stacked for one cache write,
    [2, B, KV, 1, D]."""
    q, k, v = layer.self_attn.project(layer.input_layernorm(x), rotary(cos, sin), x.shape[0], 1)
    return q, torch.stack([k, v])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     heads: tuple[int, int, int], scale: float, softcap: float | None = None) -> torch.Tensor:
    """One query per row against the whole cache: q [B, Hq, 1, D], k/v [B, KV, T, D], mask bool [B, 1, 1, T] ->
    [B, 1, Hq * D]. The model's grouped attention: two batched matmuls parallel over T (a fused kernel with one query
    block per head would walk T serially). The mask value is made on the GPU: a CUDA graph cannot copy a CPU
    constant in."""
    masked = q.new_full((), MASK_VALUE, dtype=torch.float32)
    return grouped_attention(q, k, v, mask, heads, scale, q.shape[0], 1, masked, softcap)


def attn_out_mlp(layer: Layer, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """x [B, S, H] residual, o [B, S, Hq * D] attention output -> the layer's output [B, S, H]."""
    return layer.after_attention(x, layer.self_attn.o_proj(o))


def lm_head(decoder: Decoder, x: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head: x [..., H] -> float32 logits [..., V]."""
    return decoder.logits(decoder.model.norm(x))


class GpuDecoder:
    """The decoder's layers and a KV cache on one device; ``prefill`` (eager) and ``decode`` (graph-capturable)
    write the cache."""

    def __init__(self, cfg: ModelConfig, params: dict[str, torch.Tensor], *, max_batch_size: int,
                 max_seq_len: int, device: torch.device, fns: dict[str, Any] | None = None,
                 decode_sdpa: bool = False, fused: bool | None = None) -> None:
        self.cfg, self.device = cfg, device
        # the parameters' own dtype (the table's): the runtime computes in the precision the engine states
        self.dtype = params["model.embed_tokens.weight"].dtype
        self.decoder = Decoder.from_weights(cfg, family_for(cfg), params, self.dtype)  # views of the table's tensors
        # the kernels implement the Llama math: a model with windows or another family's math runs the layer modules
        # whatever was asked (``fused`` is the session's default where Triton imports)
        self.fused = (device.type == "cuda" if fused is None else fused) and self.decoder.plain
        if self.fused:
            from edgellm.backends.torch_cuda import kernels  # imports triton: only where a GPU runs

            self.kernels = kernels
        self.heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.fns = fns or {"attn_in_decode": attn_in_decode, "decode_attention": decode_attention,
                           "attn_out_mlp": attn_out_mlp, "lm_head": lm_head}
        if decode_sdpa and "decode_attention" in self.fns:
            del self.fns["decode_attention"]
        self.layers: list[Layer] = list(self.decoder.model.layers)
        for i, layer in enumerate(self.layers):
            layer.self_attn.use_column_linears()
            layer.mlp.use_column_linears()
            # ``params`` is consumed: the layer's loaded views go as soon as its column copies exist, so each stored
            # tensor is freed layer by layer (the load's peak is the model and one layer, not the layers twice)
            for name in [n for n in params if n.startswith(f"{LAYER_PREFIX}{i}.")]:
                del params[name]
        # RoPE tables as the export's: position * inv_freq in fp32, then cos/sin in the model dtype, per layer type
        self.capacity = -(-(max_seq_len + SCRATCH_COLUMNS) // CAPACITY_ALIGN) * CAPACITY_ALIGN
        self.tables = {t: tuple(c.to(device) for c in self.decoder.cos_sin(torch.arange(self.capacity), t))
                       for t in self.decoder.ropes}
        self.cos, self.sin = self.tables[self.decoder.layer_types[0]]  # the kernels' (one layer type: ``plain``)
        self.windows = self.decoder.windows
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.kv = [torch.zeros((2, max_batch_size, cfg.num_key_value_heads, w or self.capacity, cfg.head_dim),
                               dtype=self.dtype, device=device) for w in self.windows]
        self.keys = [kv[0] for kv in self.kv]
        self.values = [kv[1] for kv in self.kv]
        self.valid = torch.zeros((max_batch_size, self.capacity), dtype=torch.bool, device=device)

    @property
    def embed(self) -> torch.Tensor:
        """[V, H], maybe a transposed view of the stored LM head."""
        return self.decoder.model.embed_tokens.weight

    @property
    def lm_w(self) -> torch.Tensor:
        """[H, V]: a view of the LM head (one copy of a tied embedding)."""
        return self.decoder.lm_head.weight.t()

    def kv_bytes(self) -> int:
        return sum(kv.numel() * kv.element_size() for kv in self.kv)

    def weight_bytes(self) -> int:
        seen = {p.data_ptr(): p.numel() * p.element_size() for p in self.decoder.parameters()}
        return sum(seen.values())

    def _rope(self, positions: torch.Tensor, layer_type: str) -> Any:
        """``rope`` of positions [B, S]: the tables' rows, [B, 1, S, D]."""
        cos, sin = self.tables[layer_type]
        return rotary(cos[positions][:, None], sin[positions][:, None])

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
        mask = self._prefill_mask(b, s, start, new_valid, causal_only)
        if self.fused:
            col = torch.full((1,), start, dtype=torch.int64, device=self.device)

            def attend(i: int, q: torch.Tensor) -> torch.Tensor:  # q [T, Hq, D] -> [T, Hq * D]
                kc, vc = self.keys[i][:b, :, :end], self.values[i][:b, :, :end]
                o = F.scaled_dot_product_attention(q.view(b, s, n_q, d).transpose(1, 2), kc, vc, attn_mask=mask,
                                                   is_causal=mask is None, enable_gqa=n_q != n_kv)
                return o.transpose(1, 2).reshape(b * s, n_q * d)

            x = self._fused_layers(self.embed_rows(ids.reshape(-1)), positions.reshape(-1), col, s, attend)
            last = x.view(b, s, -1)[:, logits_from:].reshape(b * (s - logits_from), -1)
            return self._fused_head(last).view(b, s - logits_from, -1)
        x = self.decoder.embed(ids)
        ropes = {t: self._rope(positions, t) for t in self.tables}
        # a windowed layer attends to the window - 1 positions before ``start`` (its ring's) and the new ones
        firsts = {w: 0 if w is None else start - min(start, w - 1) for w in set(self.windows)}
        masks = {w: self._prefill_mask(b, s, start, new_valid, causal_only, w, first) for w, first in firsts.items()}
        for i, (layer, kv) in enumerate(zip(self.layers, self.kv, strict=True)):
            q, k, v = layer.self_attn.project(layer.input_layernorm(x), ropes[self.decoder.layer_types[i]], b, s)
            window = self.windows[i]
            if window is None:
                kv[0, :b, :, start:end] = k
                kv[1, :b, :, start:end] = v
                kc, vc = kv[0, :b, :, :end], kv[1, :b, :, :end]
            else:
                held = self.ring_slots(firsts[window], start, window)
                kc = torch.cat([kv[0, :b].index_select(2, held), k], dim=2)
                vc = torch.cat([kv[1, :b].index_select(2, held), v], dim=2)
                kept = min(s, window)  # the last ``window`` new positions go into the ring
                kv[:, :b].index_copy_(3, self.ring_slots(end - kept, end, window),
                                      torch.stack([k[:, :, s - kept:], v[:, :, s - kept:]]))
            att, mask = layer.self_attn, masks[window]
            if att.softcap is not None:  # SDPA has no soft-capping: the model's grouped attention
                m = (mask if mask is not None else torch.ones((s, end), dtype=torch.bool,
                                                              device=self.device).tril(start)[None, None])
                o = grouped_attention(q, kc, vc, m.repeat(1, 1, n_q // n_kv, 1), self.heads, att.scale, b, s,
                                      softcap=att.softcap)
            else:
                o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, is_causal=mask is None,
                                                   enable_gqa=n_q != n_kv,
                                                   scale=att.sdpa_scale).transpose(1, 2).reshape(b, s, n_q * d)
            x = attn_out_mlp(layer, x, o)
        return lm_head(self.decoder, x[:, logits_from:])

    def ring_slots(self, first: int, end: int, window: int) -> torch.Tensor:
        """The ring columns of positions first..end-1 (at most ``window`` of them) of a layer of that window."""
        return torch.arange(first, end, device=self.device) % window

    def _prefill_mask(self, b: int, s: int, start: int, new_valid: torch.Tensor, causal_only: bool,
                      window: int | None = None, first: int = 0) -> torch.Tensor | None:
        """SDPA's bool mask [B, 1, S, end - first] over the keys of positions ``first``..end-1 (0: a full layer's
        whole cache) for the queries start..end-1 (None: plain causal); ``window``: keys ``window`` or more
        positions behind the query masked too."""
        end = start + s
        mask = None
        if window is not None and end > window:
            causal_only = False
        if not causal_only:
            q_pos = torch.arange(start, end, device=self.device)[:, None]
            k_pos = torch.arange(first, end, device=self.device)[None, :]
            causal = k_pos <= q_pos
            if window is not None:
                causal &= k_pos > q_pos - window
            mask = causal[None] & self.valid[:b, None, first:end]  # [B, S, T]
            # a padded query row attends to itself only: its output is unused but must stay finite
            mask = (mask | ((k_pos == q_pos)[None] & ~new_valid[:, :, None]))[:, None]
        return mask

    # --- the fused path (kernels.py) ---------------------------------------------------------------------------
    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 [T] -> hidden states [T, H] (a new tensor: the layers add into it in place)."""
        return F.embedding(ids, self.embed)

    def _fused_layers(self, x: torch.Tensor, positions: torch.Tensor, col: torch.Tensor, seq: int,
                      attend: Any) -> torch.Tensor:
        """x [T, H] (T = B * seq, batch-major) through every layer; positions int64 [T]; ``col`` int64 [1]: the
        cache column of each row's first token; ``attend(layer index, q [T, Hq, D]) -> [T, Hq * D]``."""
        k = self.kernels
        for i, layer in enumerate(self.layers):
            att, mlp = layer.self_attn, layer.mlp
            norm = layer.input_layernorm
            qkv = _linear(k.rms_norm(x, norm.weight, norm.eps), att.qkv_proj)  # [T, (Hq + 2 KV) * D]
            qn = att.q_norm.weight if att.q_norm is not None else None
            kn = att.k_norm.weight if att.k_norm is not None else None
            eps = att.q_norm.eps if att.q_norm is not None else 0.0
            q = k.rope_cache(qkv, self.cos, self.sin, positions, col, self.kv[i], self.heads, seq, qn, kn, eps)
            _add_linear(x, attend(i, q), att.o_proj)  # x += o @ Wo
            norm = layer.post_attention_layernorm
            gate_up = _linear(k.rms_norm(x, norm.weight, norm.eps), mlp.gate_up_proj)  # [T, 2F]
            _add_linear(x, k.silu_mul(gate_up), mlp.down_proj)  # x += (silu(gate) * up) @ Wd
        return x

    def _fused_head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> float32 logits [N, V]: the final norm and the LM head."""
        norm = self.decoder.model.norm
        return torch.mm(self.kernels.rms_norm(x, norm.weight, norm.eps), self.lm_w).float()

    def _decode_fused(self, tokens: torch.Tensor, positions: torch.Tensor, write_idx: torch.Tensor) -> torch.Tensor:
        """The decode step, eight kernels a layer: the GEMVs read each weight once (split along K into float32
        partial sums where the output is narrow), their sums land in the kernel after (RoPE + cache write; the
        residual add + next RMSNorm), gate/up ends in SiLU * up."""
        k = self.kernels
        b = tokens.shape[0]
        self.valid[:b].index_fill_(1, write_idx, True)
        x = self.embed_rows(tokens)  # [B, H], the residual stream (updated in place)
        norm = self.layers[0].input_layernorm
        xn = k.rms_norm(x, norm.weight, norm.eps)
        for i, layer in enumerate(self.layers):
            att, mlp = layer.self_attn, layer.mlp
            qn, kn = att.q_norm, att.k_norm
            q = k.rope_cache(k.gemv(xn, att.qkv_proj.weight, partial=True), self.cos, self.sin, positions,
                             write_idx, self.kv[i], self.heads, 1, qn.weight if qn else None,
                             kn.weight if kn else None, qn.eps if qn else 0.0, bias=att.qkv_proj.bias)  # [B, Hq, D]
            o = k.decode_attention(q, self.kv[i], self.valid, write_idx, self.heads, att.scale)  # [B, Hq * D]
            norm = layer.post_attention_layernorm
            xn = k.add_partials_norm(k.gemv(o, att.o_proj.weight, partial=True), x, att.o_proj.bias, norm.weight,
                                     norm.eps)
            h = k.gemv(xn, mlp.gate_up_proj.weight, bias=mlp.gate_up_proj.bias, silu=True)  # [B, F]
            norm = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.decoder.model.norm
            xn = k.add_partials_norm(k.gemv(h, mlp.down_proj.weight, partial=True), x, mlp.down_proj.bias,
                                     norm.weight, norm.eps)
        return torch.mm(xn, self.lm_w).float()  # the LM head at HBM speed through cuBLAS

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, write_idx: torch.Tensor) -> torch.Tensor:
        """One token per row, device tensors only (no host sync): tokens/positions int64 [B], write_idx int64 [1]
        (the cache column). Marks that column valid, appends k/v, returns float32 logits [B, V]."""
        if self.fused:
            return self._decode_fused(tokens, positions, write_idx)
        b = tokens.shape[0]
        n_q, n_kv, d = self.heads
        valid = self.valid[:b]
        valid.index_fill_(1, write_idx, True)
        f = self.fns
        sdpa = "decode_attention" not in f
        masks = {}
        for w in set(self.windows):  # a windowed layer: its ring, each column holding the last position c % w
            seen = valid if w is None else self._ring_valid(valid, write_idx, w)
            if sdpa:  # additive, built once per step (a bool mask would be converted by SDPA in every layer)
                masks[w] = torch.zeros((b, 1, 1, seen.shape[1]), dtype=self.dtype,
                                       device=self.device).masked_fill_(~seen[:, None, None, :], float("-inf"))
            else:
                masks[w] = seen[:, None, None, :]
        x = self.decoder.embed(tokens[:, None])  # [B, 1, H]
        tables = {t: (cos[positions][:, None, None], sin[positions][:, None, None])  # [B, 1, 1, D]
                  for t, (cos, sin) in self.tables.items()}
        for i, (layer, kv, kc, vc) in enumerate(zip(self.layers, self.kv, self.keys, self.values, strict=True)):
            q, new_kv = f["attn_in_decode"](layer, x, *tables[self.decoder.layer_types[i]])
            window = self.windows[i]
            kv[:, :b].index_copy_(3, write_idx if window is None else write_idx % window, new_kv)
            att, mask = layer.self_attn, masks[self.windows[i]]
            if sdpa and att.softcap is None:  # the query heads of one kv head are its rows: [B, KV, rep, D]
                qg = q.reshape(b, n_kv, n_q // n_kv, d)
                o = F.scaled_dot_product_attention(qg, kc[:b], vc[:b], attn_mask=mask,
                                                   scale=att.sdpa_scale).reshape(b, 1, n_q * d)
            elif sdpa:
                o = decode_attention(q, kc[:b], vc[:b], mask == 0, self.heads, att.scale, att.softcap)
            else:
                o = f["decode_attention"](q, kc[:b], vc[:b], mask, self.heads, att.scale, att.softcap)
            x = f["attn_out_mlp"](layer, x, o)
        return f["lm_head"](self.decoder, x)[:, 0]

    def _ring_valid(self, valid: torch.Tensor, write_idx: torch.Tensor, window: int) -> torch.Tensor:
        """bool [B, window]: whether each ring column of a layer of ``window`` holds a valid position once position
        ``write_idx`` is written (column j: the last position c <= write_idx with c % window == j)."""
        held = write_idx - (write_idx - torch.arange(window, device=self.device)) % window  # [window]
        return valid[:, held.clamp(min=0)] & (held >= 0)[None]

    def load_past(self, i: int, b: int, keys: torch.Tensor, values: torch.Tensor, end: int) -> None:
        """Layer ``i``'s cache given the positions end - n..end-1 (keys and values [b, kv_heads, n, head_dim]; a
        windowed layer keeps the last ``window`` of them)."""
        window = self.windows[i]
        if window is not None:
            keys, values = keys[:, :, -window:], values[:, :, -window:]
        n = keys.shape[2]
        cols = torch.arange(end - n, end, device=self.device)
        self.kv[i][:, :b].index_copy_(3, cols if window is None else cols % window, torch.stack([keys, values]))

    def held(self, i: int, b: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s cached keys and values once ``end`` positions are written, in order: all of them, or a
        windowed layer's last ``window``."""
        window = self.windows[i]
        cols = (torch.arange(end, device=self.device) if window is None
                else self.ring_slots(end - min(end, window), end, window))
        return self.kv[i][0, :b].index_select(2, cols), self.kv[i][1, :b].index_select(2, cols)


def _linear(x: torch.Tensor, lin: Any) -> torch.Tensor:
    """x [T, in] @ W [in, out] (+ bias): one cuBLAS GEMM (a ``ColumnLinear``)."""
    return torch.mm(x, lin.weight) if lin.bias is None else torch.addmm(lin.bias, x, lin.weight)


def _add_linear(x: torch.Tensor, inp: torch.Tensor, lin: Any) -> None:
    """x += inp @ W (+ bias), in place: the GEMM adds into the residual (beta = 1), no separate add."""
    x.addmm_(inp, lin.weight)
    if lin.bias is not None:
        x.add_(lin.bias)
