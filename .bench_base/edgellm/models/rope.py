"""RoPE parameters, computed in one place for the export, the torch-cuda decoder and the ONNX Runtime rotary tables.

``rope_parameters(cfg, layer_type)`` returns the inverse frequencies [rotary_dim / 2] (float32), the attention
scaling transformers multiplies into cos and sin (yarn, longrope; 1 otherwise) and the rotary width (``head_dim``
times ``partial_rotary_factor``), as transformers 5's ``modeling_rope_utils`` computes them at initialization:

- ``default``; ``linear`` (inv_freq / factor); ``llama3`` (wavelength bands);
- ``dynamic``: equal to ``default`` for any length up to ``max_position_embeddings`` (transformers changes the base
  only past it; ``length_limit`` refuses engines longer than that);
- ``yarn``: interpolation/extrapolation blend over a linear ramp, attention factor from ``factor`` / ``mscale``;
- ``longrope``: the ``short_factor`` set (transformers switches every position to ``long_factor`` once a step's
  largest position passes ``original_max_position_embeddings``: ``length_limit`` refuses engines longer than that).

Configs with per-layer-type RoPE (Gemma-3: ``rope_parameters`` keyed by ``sliding_attention`` / ``full_attention``,
or the older ``rope_local_base_freq`` for local layers) give each layer type its own parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgellm.config import ModelConfig, RopeScaling, _Reader, _rope
from edgellm.errors import UnsupportedError

if TYPE_CHECKING:  # torch loads only where tables are computed: inspect and plan stay light
    import torch

ROPE_TYPES = ("llama3", "linear", "dynamic", "yarn", "longrope")  # implemented here besides "default"
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class RopeParams:
    inv_freq: torch.Tensor  # float32 [rotary_dim / 2]
    attention_scaling: float
    rotary_dim: int

    def key(self) -> tuple[Any, ...]:
        return (tuple(self.inv_freq.tolist()), self.attention_scaling, self.rotary_dim)


def partial_rotary_factor(cfg: ModelConfig) -> float:
    params = cfg.raw.get("rope_parameters")
    value = cfg.raw.get("partial_rotary_factor")
    if value is None and isinstance(params, dict):
        value = params.get("partial_rotary_factor")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UnsupportedError(f"partial_rotary_factor {value!r}: expected a number in (0, 1]")
    return float(value)


def rotary_dim(cfg: ModelConfig) -> int:
    dim = int(cfg.head_dim * partial_rotary_factor(cfg))
    if dim < 2 or dim % 2:
        raise UnsupportedError(f"partial_rotary_factor {partial_rotary_factor(cfg)} of head_dim {cfg.head_dim} "
                               f"gives a rotary width of {dim}; expected an even number >= 2")
    return dim


def _per_layer(cfg: ModelConfig) -> dict[str, Any] | None:
    params = cfg.raw.get("rope_parameters")
    if isinstance(params, dict) and params and all(k in LAYER_TYPES for k in params):
        return params
    return None


def layer_rope(cfg: ModelConfig, layer_type: str) -> tuple[float, RopeScaling | None, dict[str, Any]]:
    """(theta, scaling, the raw scaling dict) for layers of ``layer_type``."""
    per_layer = _per_layer(cfg)
    if per_layer is not None:
        sub = per_layer.get(layer_type, per_layer.get("full_attention"))
        r = _Reader({"rope_parameters": sub}, "config.json: rope_parameters")
        theta, scaling = _rope({"rope_parameters": sub}, r)
        r.raise_if_problems()
        return theta, scaling, sub if isinstance(sub, dict) else {}
    if layer_type == "sliding_attention" and cfg.raw.get("rope_local_base_freq") is not None:
        return float(cfg.raw["rope_local_base_freq"]), None, {}
    params, scaling = cfg.raw.get("rope_parameters"), cfg.raw.get("rope_scaling")
    if isinstance(params, dict) and params.get("rope_type", "default") != "default":
        scaling = params  # the layout _rope read the scaling from
    return cfg.rope_theta, cfg.rope_scaling, scaling if isinstance(scaling, dict) else {}


def _default(theta: float, dim: int) -> torch.Tensor:
    import torch

    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _original_max(cfg: ModelConfig, raw: dict[str, Any]) -> int:
    value = raw.get("original_max_position_embeddings", cfg.raw.get("original_max_position_embeddings"))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        if value is None:
            return cfg.max_position_embeddings
        raise UnsupportedError(f"rope_scaling original_max_position_embeddings {value!r}: expected an integer >= 1")
    return value


def rope_parameters(cfg: ModelConfig, layer_type: str = "full_attention") -> RopeParams:
    theta, rs, raw = layer_rope(cfg, layer_type)
    dim = rotary_dim(cfg)
    inv_freq = _default(theta, dim)
    if rs is None or rs.rope_type == "dynamic":
        return RopeParams(inv_freq, 1.0, dim)
    if rs.rope_type == "linear":
        return RopeParams(inv_freq / rs.factor, 1.0, dim)
    if rs.rope_type == "llama3":
        return RopeParams(_llama3(inv_freq, rs), 1.0, dim)
    if rs.rope_type == "yarn":
        return _yarn(cfg, theta, dim, rs, raw)
    if rs.rope_type == "longrope":
        return _longrope(cfg, theta, dim, raw)
    raise UnsupportedError(f"rope_scaling type {rs.rope_type!r} is not implemented; supported: default, "
                           f"{', '.join(ROPE_TYPES)}")


def length_limit(cfg: ModelConfig) -> tuple[int, str] | None:
    """The longest engine the RoPE of ``cfg`` is computed exactly for, and why; None: max_position_embeddings."""
    for layer_type in LAYER_TYPES:
        _, rs, raw = layer_rope(cfg, layer_type)
        if rs is not None and rs.rope_type == "longrope":
            limit = _original_max(cfg, raw)
            return limit, (f"longrope scaling switches to long_factor past original_max_position_embeddings "
                           f"{limit} (not implemented: transformers' Phi-3 generation then recomputes the whole "
                           f"cache with the long factors)")
    return None


def _llama3(inv_freq: torch.Tensor, rs: RopeScaling) -> torch.Tensor:
    import torch

    factor = rs.factor
    low, high = float(rs.params["low_freq_factor"]), float(rs.params["high_freq_factor"])
    old_ctx = float(rs.params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(cfg: ModelConfig, base: float, dim: int, rs: RopeScaling, raw: dict[str, Any]) -> RopeParams:
    original = _original_max(cfg, raw)
    factor = rs.factor if raw.get("factor") is not None else cfg.max_position_embeddings / original
    attention_factor = raw.get("attention_factor")
    mscale, mscale_all_dim = raw.get("mscale"), raw.get("mscale_all_dim")
    if attention_factor is None:
        attention_factor = (_mscale(factor, mscale) / _mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
                            else _mscale(factor))
    beta_fast, beta_slow = raw.get("beta_fast") or 32, raw.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if raw.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    import torch

    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return RopeParams(inv_freq, float(attention_factor), dim)


def _longrope(cfg: ModelConfig, base: float, dim: int, raw: dict[str, Any]) -> RopeParams:
    original = _original_max(cfg, raw)
    short = raw.get("short_factor")
    if not isinstance(short, list) or len(short) != dim // 2:
        raise UnsupportedError(f"longrope short_factor must be a list of {dim // 2} numbers (rotary width {dim}); "
                               f"got {short!r}")
    factor = raw.get("factor")
    if factor is None:
        factor = cfg.max_position_embeddings / original
    attention_factor = raw.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    import torch

    ext = torch.tensor(short, dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return RopeParams(1.0 / (ext * base**shape), float(attention_factor), dim)
