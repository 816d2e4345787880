"""The config contract: every ``config.json`` field that changes a decoder's maths, and whether a family honours it.

A field listed here is either implemented by the family (named in its ``implements``) or refused by name when a
config turns it on: a checkpoint is never exported with a field silently ignored. ``edgellm inspect`` shows a refusal
as a problem naming the field (exit 2), ``export`` refuses before a weight is read. A field a family honours only in
part (a sliding window served by engines no longer than the window) is a finding at inspect, named the same way.

Fields read by ``ModelConfig`` itself (sizes, ``head_dim``, ``rope_theta``, ``rms_norm_eps``, biases, tied
embeddings, ``hidden_act``) and ``rope_scaling`` types (``ModelFamily.rope_types``) are checked where they are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    params = raw.get("rope_parameters")
    return params if isinstance(params, dict) else {}


def _not_one(value: Any) -> bool:
    return value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and float(value) == 1.0)


def _partial_rotary(raw: dict[str, Any]) -> Any:
    value = raw.get("partial_rotary_factor", _rope_params(raw).get("partial_rotary_factor"))
    return value if _not_one(value) else None


def _set(key: str) -> Callable[[dict[str, Any]], Any]:
    """Active when the key holds anything but null."""
    return lambda raw: raw.get(key)


def _scaled(key: str) -> Callable[[dict[str, Any]], Any]:
    """Active when the key holds a multiplier other than 1."""
    return lambda raw: raw.get(key) if _not_one(raw.get(key)) else None


def _true(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda raw: True if raw.get(key) is True else None


def _local_layers(raw: dict[str, Any]) -> Any:
    types = raw.get("layer_types")
    if isinstance(types, list) and any(t != "full_attention" for t in types):
        return sorted({str(t) for t in types})
    return None


@dataclass(frozen=True)
class MathField:
    """A config key that changes the maths when ``active(raw)`` returns a value (shown in the message), else None."""

    key: str
    what: str
    active: Callable[[dict[str, Any]], Any]


MATH_FIELDS: tuple[MathField, ...] = (
    MathField("partial_rotary_factor", "RoPE on part of each head", _partial_rotary),
    MathField("attn_logit_softcapping", "attention scores soft-capped", _set("attn_logit_softcapping")),
    MathField("final_logit_softcapping", "final logits soft-capped", _set("final_logit_softcapping")),
    MathField("query_pre_attn_scalar", "attention scale from query_pre_attn_scalar", _set("query_pre_attn_scalar")),
    MathField("attention_multiplier", "attention scale multiplier", _scaled("attention_multiplier")),
    MathField("embedding_multiplier", "embeddings scaled", _scaled("embedding_multiplier")),
    MathField("residual_multiplier", "residual branches scaled", _scaled("residual_multiplier")),
    MathField("logits_scaling", "logits divided", _scaled("logits_scaling")),
    MathField("layer_types", "per-layer attention kinds", _local_layers),
    MathField("sliding_window_pattern", "interleaved local/global layers", _set("sliding_window_pattern")),
    MathField("use_sliding_window", "sliding-window attention", _true("use_sliding_window")),
    MathField("no_rope_layers", "layers without RoPE", _set("no_rope_layers")),
    MathField("use_qk_norm", "per-head q/k norms", _true("use_qk_norm")),
)

SLIDING_FIELDS = ("sliding_window", "use_sliding_window", "layer_types", "sliding_window_pattern")


def unimplemented(raw: dict[str, Any], implements: frozenset[str]) -> list[tuple[MathField, Any]]:
    """The math fields ``raw`` turns on that a family implementing ``implements`` does not: (field, value)."""
    found = []
    for spec in MATH_FIELDS:
        if spec.key in implements:
            continue
        value = spec.active(raw)
        if value is not None:
            found.append((spec, value))
    return found


def describe(family: str, found: list[tuple[MathField, Any]]) -> str:
    fields = "; ".join(f"{spec.key} = {value!r} ({spec.what})" for spec, value in found)
    return (f"{family}: config field(s) that change the maths are not implemented by this family: {fields}; "
            f"a checkpoint is never exported with them ignored")
