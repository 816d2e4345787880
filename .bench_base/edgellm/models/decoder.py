"""One decoder-only transformer in torch for every registered family, built from a checkpoint's tensors.

The family's class variables select the variants: q/k/v bias (``family.has_qkv_bias``), per-head q/k RMSNorm
(``qk_norm``), explicit ``head_dim``, tied embeddings, RoPE scaling and partial rotary (``edgellm.models.rope``, per
layer type), sliding windows per layer (``family.layer_windows``: a windowed layer's cache holds its last ``window``
positions, the window of its last query, and a mask keeps each query within its own window), Gemma's (1 + w) norms,
sandwich norms, scaled embeddings, tanh GELU, query_pre_attn_scalar and soft-capping, Phi-3's fused qkv_proj /
gate_up_proj. The forward pass takes an explicit KV cache so it exports to one ONNX graph serving prefill and decode:

    input_ids      int64 [B, S]
    attention_mask int64 [B, P + S]   1 = real token, 0 = padding (left padding)
    position_ids   int64 [B, S]
    past k/v       [B, kv_heads, P, head_dim] per layer, model dtype
    -> logits float32 [B, S, vocab], present k/v [B, kv_heads, P + S, head_dim] per layer

A windowed layer's past holds only the last positions of the P (at most its window; transformers' sliding cache
keeps window - 1, one more lets a runtime step back over one decode step) and its present keeps the last
``min(P_w + S, window)`` of past + new: a query attends to the ``window`` positions ending at itself, so the next
step needs no more, and that layer's cache never grows past its window.

Numerics follow transformers' eager path: RMSNorm and softmax in fp32, everything else in the model dtype.
For export, ``use_rotary_tables`` and (fp32) ``use_fused_attention`` select autograd functions whose ONNX form is
ONNX Runtime's fused ``RotaryEmbedding`` / ``GroupQueryAttention``; their eager forward computes the same math.

The math is written once for every runtime: ``rms_norm``, ``rope_cos_sin`` / ``apply_rope``, ``grouped_attention``
and the fused ops' autograd functions (edgellm.models.ops; RoPE parameters in edgellm.models.rope), and here
``Attention.project`` (projections, per-head norms, RoPE), ``MLP``, ``Layer.after_attention``. ``Decoder.forward`` is
the export's driver (an explicit past in, the present out); the torch-cuda backend drives the same layers around its
preallocated cache (edgellm/backends/torch_cuda/decoder.py). What differs between them is a Linear implementation
plugged into these modules: ``Linear`` (nn.Linear; export), a ModelOpt-quantized linear
(edgellm.compiler.quantized; export), ``ColumnLinear`` (weights [in, out], q/k/v and gate/up fused; torch-cuda).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from edgellm.config import ModelConfig
from edgellm.models.base import ModelFamily
from edgellm.models.ops import (
    MASK_VALUE,
    AddRMSNorm,
    FusedMask,
    GroupQueryAttention,
    Rope,
    RotaryEmbedding,
    ShapeOnlyLinear,
    grouped_attention,
    rms_norm,
    rope_cos_sin,
    rope_freqs,
    rotary,
)
from edgellm.models.rope import RopeParams, rope_parameters


class Linear(nn.Linear):
    """``nn.Linear`` that skips the random init on the meta device (``from_weights`` assigns every tensor): that init
    goes through torch's reference kernels, whose first use imports torch._dynamo (seconds). With
    ``shapes_only`` (``Decoder.trace_shapes_only``) it exports the same nodes but computes zeros."""

    shapes_only = False

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.shapes_only:
            return super().forward(x)
        y = ShapeOnlyLinear.apply(x, self.weight)
        return y if self.bias is None else y + self.bias


class Embedding(nn.Embedding):
    """``nn.Embedding`` with the same meta-device shortcut as ``Linear``."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class ColumnLinear(nn.Module):
    """Linears of one input as one GEMM, their weights concatenated along the output axis and stored [in, out]
    (contiguous: the product is ``x @ w``, cuBLAS reading the weight without a transpose): the torch-cuda runtime's
    Linear. ``widths``: each linear's output width, in order (split the output by them)."""

    def __init__(self, linears: list[nn.Module]) -> None:
        super().__init__()
        weight = torch.cat([lin.weight.t() for lin in linears], dim=1).contiguous()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [in, sum(out)]
        biases = [lin.bias for lin in linears]
        self.bias = None if any(b is None for b in biases) else nn.Parameter(torch.cat(biases), requires_grad=False)
        self.widths = [int(lin.weight.shape[0]) for lin in linears]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight.t(), self.bias)  # x @ weight (+ bias): one addmm / mm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: scaled by (1 + weight), the product in fp32, then cast to ``x``'s dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(family: type[ModelFamily], dim: int, eps: float, dtype: torch.dtype) -> RMSNorm:
    return OffsetRMSNorm(dim, eps, dtype) if family.norm_offset else RMSNorm(dim, eps, dtype)


class FusedLinear(Linear):
    """One checkpoint linear holding several (Phi-3's ``qkv_proj``, ``gate_up_proj``): ``widths`` split its output."""

    def __init__(self, in_features: int, widths: list[int], dtype: torch.dtype) -> None:
        super().__init__(in_features, sum(widths), bias=False, dtype=dtype)
        self.widths = widths


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, family: type[ModelFamily], dtype: torch.dtype) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.heads = (self.n_heads, self.n_kv, self.head_dim)
        h, q, kv = cfg.hidden_size, self.n_heads * self.head_dim, self.n_kv * self.head_dim
        bias = family.has_qkv_bias(cfg)
        self.qkv_proj: ColumnLinear | FusedLinear | None = None  # q/k/v as one GEMM
        if family.fused_checkpoint_linears:
            self.qkv_proj = FusedLinear(h, [q, kv, kv], dtype)
        else:
            self.q_proj = Linear(h, q, bias=bias, dtype=dtype)
            self.k_proj = Linear(h, kv, bias=bias, dtype=dtype)
            self.v_proj = Linear(h, kv, bias=bias, dtype=dtype)
        self.o_proj = Linear(q, h, bias=cfg.attention_bias and family.qkv_bias is None, dtype=dtype)
        self.q_norm = make_norm(family, self.head_dim, cfg.rms_norm_eps, dtype) if family.qk_norm else None
        self.k_norm = make_norm(family, self.head_dim, cfg.rms_norm_eps, dtype) if family.qk_norm else None
        self.scale = family.attention_scale(cfg)
        # SDPA's own default (1 / sqrt(D)) unless the family scales otherwise (the torch-cuda runtime's prefill)
        self.sdpa_scale = None if self.scale == self.head_dim**-0.5 else self.scale
        self.softcap = family.attention_softcap(cfg)

    def use_column_linears(self) -> None:
        """q/k/v as one ``ColumnLinear``, o_proj as another (the torch-cuda runtime's layout)."""
        if isinstance(self.qkv_proj, FusedLinear):
            fused = ColumnLinear([self.qkv_proj])
            fused.widths = self.qkv_proj.widths
            self.qkv_proj = fused
        else:
            self.qkv_proj = ColumnLinear([self.q_proj, self.k_proj, self.v_proj])
            del self.q_proj, self.k_proj, self.v_proj
        self.o_proj = ColumnLinear([self.o_proj])

    def _qkv_flat(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, S, H * D], k and v [B, S, KV * D]."""
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.widths, dim=-1)
        return q, k, v

    def project(self, x: torch.Tensor, rope: Rope, b: int, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, hidden] -> q [B, H, S, D], k and v [B, KV, S, D]: the projections, the per-head norms (qk_norm
        families) and RoPE. ``b``, ``s`` come from the driver's inputs (one traced value for every layer, so the
        exported shape computations are shared)."""
        q, k, v = self._qkv_flat(x)
        q, k = q.view(b, s, self.n_heads, self.head_dim), k.view(b, s, self.n_kv, self.head_dim)
        v = v.view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, S, D]
        return rope(q, 0), rope(k, 0), v

    def forward(
        self, x: torch.Tensor, rope: Rope, mask: torch.Tensor | FusedMask, past_k: torch.Tensor,
        past_v: torch.Tensor, b: int, s: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The export's attention: an explicit past in, the present (past + new keys and values) out."""
        if isinstance(mask, FusedMask):
            return self._fused(x, rope, mask, past_k, past_v, b, s)
        q, k, v = self.project(x, rope, b, s)
        k = torch.cat([past_k, k], dim=2)  # [B, KV, P+S, D]
        v = torch.cat([past_v, v], dim=2)
        out = grouped_attention(q, k, v, mask, self.heads, self.scale, b, s, softcap=self.softcap)
        return self.o_proj(out), k, v

    def _fused(
        self, x: torch.Tensor, rope: Rope, mask: FusedMask, past_k: torch.Tensor, past_v: torch.Tensor, b: int,
        s: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same attention through ``GroupQueryAttention``: q/k/v stay [B, S, heads * D]."""
        q, k, v = self._qkv_flat(x)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(b, s, self.n_heads, self.head_dim)).view(b, s, self.n_heads * self.head_dim)
            k = self.k_norm(k.view(b, s, self.n_kv, self.head_dim)).view(b, s, self.n_kv * self.head_dim)
        q, k = rope(q, self.n_heads), rope(k, self.n_kv)
        out, k, v = GroupQueryAttention.apply(q, k, v, past_k, past_v, *mask, self.n_heads, self.n_kv, self.scale)
        return self.o_proj(out), k, v


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """The MLP's gate activation, by its config name (``ModelFamily.hidden_acts``)."""
    if name == "gelu_pytorch_tanh":
        return nn.functional.gelu(x, approximate="tanh")
    return nn.functional.silu(x)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, family: type[ModelFamily], dtype: torch.dtype) -> None:
        super().__init__()
        h, f, bias = cfg.hidden_size, cfg.intermediate_size, family.has_mlp_bias(cfg)
        self.act = family.activation(cfg)
        self.gate_up_proj: ColumnLinear | FusedLinear | None = None  # gate/up as one GEMM
        if family.fused_checkpoint_linears:
            self.gate_up_proj = FusedLinear(h, [f, f], dtype)
        else:
            self.gate_proj = Linear(h, f, bias=bias, dtype=dtype)
            self.up_proj = Linear(h, f, bias=bias, dtype=dtype)
        self.down_proj = Linear(f, h, bias=bias, dtype=dtype)

    def use_column_linears(self) -> None:
        """gate/up as one ``ColumnLinear``, down_proj as another (the torch-cuda runtime's layout)."""
        if isinstance(self.gate_up_proj, FusedLinear):
            fused = ColumnLinear([self.gate_up_proj])
            fused.widths = self.gate_up_proj.widths
            self.gate_up_proj = fused
        else:
            self.gate_up_proj = ColumnLinear([self.gate_proj, self.up_proj])
            del self.gate_proj, self.up_proj
        self.down_proj = ColumnLinear([self.down_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """down(act(gate(x)) * up(x))."""
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).split(self.gate_up_proj.widths, dim=-1)
            return self.down_proj(activation(self.act, gate) * up)
        return self.down_proj(activation(self.act, self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, family: type[ModelFamily], dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = make_norm(family, cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, family, dtype)
        self.post_attention_layernorm = make_norm(family, cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.sandwich = family.sandwich_norms
        if self.sandwich:  # Gemma: the attention and MLP outputs normed before their residual adds
            self.pre_feedforward_layernorm = make_norm(family, cfg.hidden_size, cfg.rms_norm_eps, dtype)
            self.post_feedforward_layernorm = make_norm(family, cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, family, dtype)

    def after_attention(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The residual stream ``x`` after this layer, from its attention's output ``h`` (o_proj applied)."""
        if self.sandwich:
            x = x + self.post_attention_layernorm(h)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """HF-named submodules (``model.layers.N.self_attn.q_proj`` ...) so ``load_state_dict`` takes HF tensors."""

    def __init__(self, cfg: ModelConfig, family: type[ModelFamily], dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(Layer(cfg, family, dtype) for _ in range(cfg.num_hidden_layers))
        self.norm = make_norm(family, cfg.hidden_size, cfg.rms_norm_eps, dtype)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, family: type[ModelFamily], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg, self.family, self.dtype = cfg, family, dtype
        self.model = DecoderModel(cfg, family, dtype)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # per layer: its attention window (None: full) and the RoPE parameters of its layer type (computed on the
        # CPU even while the model is built on the meta device: see Linear)
        self.layer_types = family.layer_types(cfg)
        self.windows = family.layer_windows(cfg)
        with torch.device("cpu"):
            self.ropes: dict[str, RopeParams] = {t: rope_parameters(cfg, t) for t in sorted(set(self.layer_types))}
        self.embed_scale = family.embed_scale(cfg)
        self.final_softcap = family.final_softcap(cfg)
        self.rope_tables: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.fused_attention = False
        for p in self.parameters():
            p.requires_grad_(False)

    @property
    def plain(self) -> bool:
        """The Llama math only (what the torch-cuda kernels implement): no windows, one full-width RoPE, SiLU,
        plain RMSNorm, no soft-capping or embedding scale."""
        rope = next(iter(self.ropes.values()))
        f = self.family
        return (all(w is None for w in self.windows) and len(self.ropes) == 1 and rope.rotary_dim == self.cfg.head_dim
                and not f.sandwich_norms and not f.norm_offset and f.activation(self.cfg) == "silu"
                and self.embed_scale is None and self.final_softcap is None and f.attention_softcap(self.cfg) is None)

    @classmethod
    def from_weights(
        cls, cfg: ModelConfig, family: type[ModelFamily], weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype = torch.float32, modules: Mapping[str, nn.Module] | None = None,
    ) -> Decoder:
        """Build from ``load_weights`` output; tensors are cast to ``dtype`` (e.g. bf16 checkpoint -> fp16).
        ``modules`` (path -> module, e.g. ``model.layers.0.mlp.up_proj``) replace the float ones first: the
        variants (a quantized Linear, a quantized LM head) plugged into the same decoder; ``weights`` then holds
        the float tensors only. A replaced ``lm_head`` is not tied to the embedding."""
        modules = modules or {}
        with torch.device("meta"):
            model = cls(cfg, family, dtype)
        for path, module in modules.items():
            model.set_submodule(path, module)
        state = {k: v.to(dtype) for k, v in weights.items()}
        model.load_state_dict(state, strict=False, assign=True)
        if cfg.tie_word_embeddings and "lm_head" not in modules:
            model.lm_head.weight = model.model.embed_tokens.weight
        missing = [n for n, p in model.named_parameters() if p.is_meta]
        if missing:  # load_weights already checked names against the family; this is an internal mismatch
            from edgellm.errors import BugError

            raise BugError(f"decoder parameters not loaded: {', '.join(missing[:5])}")
        return model.eval()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [B, S, H], times sqrt(hidden) in the model dtype where the family scales them."""
        x = self.model.embed_tokens(input_ids)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype, device=x.device)
        return x

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits of the final-normed hidden states (soft-capped in the model dtype where configured)."""
        logits = self.lm_head(normed)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits.float()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
        *past: torch.Tensor, logits_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """``past`` is (k0, v0, k1, v1, ...); returns (logits, present k0, v0, ...). ``logits_positions`` (int64
        [n], indices into the S new positions) limits the logits to those positions: [B, n, vocab]."""
        b, s = input_ids.shape
        x = self.embed(input_ids)
        ropes = {t: self._rope_fn(position_ids, t) for t in self.ropes}
        masks = {w: self._mask(attention_mask, past, b, s, w) for w in set(self.windows)}
        presents: list[torch.Tensor] = []
        layers = list(self.model.layers)
        if self.family.sandwich_norms:
            for i, layer in enumerate(layers):
                h, k, v = layer.self_attn(layer.input_layernorm(x), ropes[self.layer_types[i]],
                                          masks[self.windows[i]], past[2 * i], past[2 * i + 1], b, s)
                x = layer.after_attention(x, h)
                presents += self._kept(i, k, v)
            normed = self.model.norm(x)
        else:
            normed = layers[0].input_layernorm(x)
            for i, layer in enumerate(layers):
                h, k, v = layer.self_attn(normed, ropes[self.layer_types[i]], masks[self.windows[i]], past[2 * i],
                                          past[2 * i + 1], b, s)
                normed, x = self._add_norm(x, h, layer.post_attention_layernorm)
                following = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
                normed, x = self._add_norm(x, layer.mlp(normed), following)
                presents += self._kept(i, k, v)
        if logits_positions is not None:
            normed = normed.index_select(1, logits_positions)
        return (self.logits(normed), *presents)

    def _mask(self, attention_mask: torch.Tensor, past: tuple[torch.Tensor, ...], b: int, s: int,
              window: int | None) -> torch.Tensor | FusedMask:
        """The mask of the layers of ``window``, once for all of them. A full layer's past holds every position
        (``attention_mask`` [B, P + S]; in place, its past input is a whole preallocated buffer, so P comes from the
        mask); a windowed layer's past holds the last P_w of them (its own input's length, the same for every layer
        of that window), so its mask is the last P_w + S columns, positions counted on its own cache's axis."""
        total = attention_mask.shape[1]
        if window is not None:
            held = past[2 * self.windows.index(window)].shape[2]
            attention_mask = attention_mask[:, total - held - s:]
            total = held + s
        if self.fused_attention:
            return self._fused_mask(attention_mask, b, s, total, window)
        return self._grouped_mask(attention_mask, s, total - s, total, window)

    def _kept(self, i: int, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        """Layer ``i``'s present keys and values: all of them, or a windowed layer's last ``window`` positions (its
        cache never grows past its window)."""
        window = self.windows[i]
        if window is None:
            return [k, v]
        return [k[:, :, -window:], v[:, :, -window:]]

    def _add_norm(self, x: torch.Tensor, h: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + h), x + h): the residual add and the next RMSNorm, one fused op in an fp32 export."""
        if self.dtype == torch.float32 and not isinstance(norm, OffsetRMSNorm):
            return AddRMSNorm.apply(x, h, norm.weight, norm.eps)  # type: ignore[no-any-return]
        x = x + h
        return norm(x), x

    def _grouped_mask(self, attention_mask: torch.Tensor, s: int, past_len: int, total: int,
                      window: int | None = None) -> torch.Tensor:
        """Attention's boolean mask [B, 1, rep*S, T]: causal over [S, T] (within ``window`` positions of the query,
        counted on the cache's axis as transformers does) repeated for the query heads of a KV group (Attention's
        rows) and the padding, once for every layer of that window."""
        q_idx = torch.arange(s, dtype=torch.int64)[:, None] + past_len
        k_idx = torch.arange(total, dtype=torch.int64)[None, :]
        allowed = k_idx <= q_idx
        if window is not None:
            allowed = allowed & (k_idx > q_idx - window)
        causal = allowed.repeat(self.cfg.num_attention_heads // self.cfg.num_key_value_heads, 1)
        return causal[None, None] & (attention_mask[:, None, None, :] > 0)

    @staticmethod
    def _fused_mask(attention_mask: torch.Tensor, b: int, s: int, total: int,
                    window: int | None = None) -> FusedMask:
        """``GroupQueryAttention``'s inputs for ``attention_mask`` [B, T], once for every layer of that window (the
        keys ``window`` or more positions behind a query masked in the bias)."""
        lengths = torch.ones_like(attention_mask).sum(dim=1)  # [B], every row T (see GroupQueryAttention)
        bias = (attention_mask[:, None, None, :] == 0).float() * MASK_VALUE  # [B, 1, 1, T]
        if window is None:
            bias = bias.expand(b, 1, s, total)
        else:
            q_idx = torch.arange(s, dtype=torch.int64)[:, None] + (total - s)
            k_idx = torch.arange(total, dtype=torch.int64)[None, :]
            bias = bias + (k_idx <= q_idx - window).float()[None, None] * MASK_VALUE  # [B, 1, S, T]
        return FusedMask(seqlens_k=(lengths - 1).to(torch.int32), total=lengths[0].to(torch.int32), bias=bias)

    def use_fused_attention(self) -> None:
        """Attention through ONNX Runtime's ``GroupQueryAttention`` (with rotary from tables: call
        ``use_rotary_tables`` first). fp32 only: its additive padding mask must stay finite in the model dtype.
        Not with attention soft-capping (the explicit path computes it as transformers does)."""
        if self.rope_tables is None or self.dtype != torch.float32:
            from edgellm.errors import BugError

            raise BugError("use_fused_attention needs use_rotary_tables first and an fp32 decoder")
        self.fused_attention = self.family.attention_softcap(self.cfg) is None

    def trace_shapes_only(self) -> None:
        """For the export's trace, which records operations and shapes, not values: the float linears compute zeros
        of their output's shape (exported as before). A real forward of a 0.5B checkpoint reads every mapped weight
        page, and the export then writes its 2 GB of weights about 2 s slower (measured, 4 rounds)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.shapes_only = True

    def cos_sin(self, positions: torch.Tensor, layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope_cos_sin`` of ``positions`` for layers of ``layer_type`` ([..., rotary_dim], model dtype)."""
        rope = self.ropes[layer_type]
        return rope_cos_sin(positions, rope.inv_freq, self.dtype, rope.attention_scaling)

    def use_rotary_tables(self, max_positions: int) -> None:
        """Apply RoPE from cos/sin tables through ``RotaryEmbedding`` (one fused op per q and k once exported)
        instead of computing cos/sin from the positions in the graph. The tables hold the same products:
        position * inv_freq in float32 (times the attention scaling), then cos/sin, in the model dtype."""
        self.rope_tables = {}
        for t, rope in self.ropes.items():
            freqs = rope_freqs(torch.arange(max_positions), rope.inv_freq)  # [max_positions, rotary_dim / 2]
            cos, sin = freqs.cos(), freqs.sin()
            if rope.attention_scaling != 1.0:
                cos, sin = cos * rope.attention_scaling, sin * rope.attention_scaling
            self.rope_tables[t] = (cos.to(self.dtype), sin.to(self.dtype))

    def _rope_fn(self, position_ids: torch.Tensor, layer_type: str) -> Rope:
        """rope(x, num_heads): x [B, heads, S, D] with num_heads 0, else [B, S, num_heads * D] (tables only)."""
        if self.rope_tables is None:
            cos, sin = self.cos_sin(position_ids, layer_type)  # [B, S, rotary_dim], once for all layers
            return rotary(cos[:, None], sin[:, None])
        cos_table, sin_table = self.rope_tables[layer_type]
        rot, d = self.ropes[layer_type].rotary_dim, self.cfg.head_dim
        if rot == d:
            return lambda t, heads: RotaryEmbedding.apply(t, position_ids, cos_table, sin_table, heads)

        def partial(t: torch.Tensor, heads: int) -> torch.Tensor:  # the first ``rot`` dims of each head rotate
            flat = t.shape
            if heads:  # [B, S, N * D] -> [B, N, S, D]
                t = t.view(flat[0], flat[1], heads, d).transpose(1, 2)
            out = torch.cat((RotaryEmbedding.apply(t[..., :rot], position_ids, cos_table, sin_table, 0),
                             t[..., rot:]), dim=-1)
            return out.transpose(1, 2).reshape(flat) if heads else out

        return partial

    def empty_past(self, batch: int) -> list[torch.Tensor]:
        shape = (batch, self.cfg.num_key_value_heads, 0, self.cfg.head_dim)
        return [torch.zeros(shape, dtype=self.dtype) for _ in range(2 * self.cfg.num_hidden_layers)]
