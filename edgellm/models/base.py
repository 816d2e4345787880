"""Model families: what a family needs from a checkpoint, and the registry that finds it.

A new family is one module in this package with a class decorated by ``@register_family``; the decorator reads
the class's ``model_types`` and ``architectures`` and refuses a class that lacks them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from edgellm.config import ModelConfig
from edgellm.errors import BugError, ConfigurationError, UnsupportedError
from edgellm.models.contract import SLIDING_FIELDS, describe, unimplemented
from edgellm.registry import Registry


@dataclass(frozen=True)
class IgnoreRule:
    """A named reason a checkpoint tensor is not needed (e.g. precomputed RoPE buffers)."""

    name: str
    pattern: str

    def matches(self, tensor: str) -> bool:
        return re.fullmatch(self.pattern, tensor) is not None


ROTARY_BUFFERS = IgnoreRule("rotary inv_freq buffer (recomputed from rope_theta)", r".*rotary_emb\.inv_freq")


class ModelFamily:
    """Base class of a decoder-only family. Subclasses set the class variables and, if needed, override hooks."""

    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]
    architectures: ClassVar[tuple[str, ...]]
    qkv_bias: ClassVar[bool | None] = None  # None: follow config.attention_bias
    mlp_bias: ClassVar[bool | None] = False  # None: follow config.mlp_bias (Llama); else what transformers hard-codes
    qk_norm: ClassVar[bool] = False
    # rope_scaling types implemented besides "default" (edgellm.models.rope), each equal to transformers'
    rope_types: ClassVar[tuple[str, ...]] = ("llama3", "linear", "dynamic", "yarn")
    hidden_acts: ClassVar[tuple[str, ...]] = ("silu",)
    hidden_act_key: ClassVar[str] = "hidden_act"  # Gemma names it hidden_activation
    norm_offset: ClassVar[bool] = False  # RMSNorm scaled by (1 + weight) (Gemma)
    sandwich_norms: ClassVar[bool] = False  # pre/post feed-forward norms, attention output normed (Gemma)
    scaled_embeddings: ClassVar[bool] = False  # embeddings times sqrt(hidden_size) in the model dtype (Gemma)
    fused_checkpoint_linears: ClassVar[bool] = False  # qkv_proj and gate_up_proj as the checkpoint stores them (Phi-3)
    # whether export takes a ModelOpt-quantized checkpoint of the family (edgellm.compiler.quantized); when False it
    # is refused by name and the family's quantized rows are not made
    quantized_export: ClassVar[bool] = True
    # the layer kind when a config names none (layer_types, sliding_window_pattern, max_window_layers): every layer
    # windowed when the config sets sliding_window (Mistral, Phi-3), or a family's own rule (Gemma-2: even layers)
    default_window_pattern: ClassVar[int | None] = None  # every n-th layer (1-based) global, the others windowed
    # named config overrides (over tiny_config) of features the family's published configs use: the conformance
    # matrix (edgellm.conformance) crosses them with dtypes and precisions
    conformance_features: ClassVar[dict[str, dict[str, Any]]] = {}
    # config fields of edgellm.models.contract.MATH_FIELDS this family implements; any other one a config turns on
    # is refused by name (sliding windows apart: see ``sliding_window``)
    implements: ClassVar[frozenset[str]] = frozenset()
    ignore_rules: ClassVar[tuple[IgnoreRule, ...]] = (ROTARY_BUFFERS,)
    # A tiny checkpoint of the family for tests and the embedded nightly (edgellm.synth): the transformers config
    # class that writes it and its shape (vocab 512 so the bundled tokenizer can drive it).
    hf_config: ClassVar[str | None] = None
    tiny_config: ClassVar[dict[str, Any]] = {}

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        """Refuse a config this family cannot honour, naming the value and what is supported."""
        from edgellm.models.rope import layer_rope, rotary_dim

        for layer_type in sorted(set(cls.layer_types(cfg))):
            _, scaling, _ = layer_rope(cfg, layer_type)
            if scaling is not None and scaling.rope_type not in cls.rope_types:
                raise UnsupportedError(
                    f"{cls.name}: rope_scaling type {scaling.rope_type!r} is not implemented; "
                    f"supported: default, {', '.join(cls.rope_types)}"
                )
        rotary_dim(cfg)
        if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "llama3":
            need = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            bad = [k for k in need if isinstance(cfg.rope_scaling.params.get(k), bool)
                   or not isinstance(cfg.rope_scaling.params.get(k), (int, float))
                   or cfg.rope_scaling.params[k] <= 0]
            if bad:
                raise UnsupportedError(
                    f"{cls.name}: llama3 rope_scaling needs positive numbers for {', '.join(bad)}; "
                    f"got {cfg.rope_scaling.params!r}"
                )
            if cfg.rope_scaling.params["low_freq_factor"] == cfg.rope_scaling.params["high_freq_factor"]:
                raise UnsupportedError(f"{cls.name}: llama3 rope_scaling low_freq_factor must differ from "
                                       "high_freq_factor")
        found = unimplemented(cfg.raw, cls.implements | frozenset(SLIDING_FIELDS))
        if found:
            raise UnsupportedError(describe(cls.name, found))
        act = cls.activation(cfg)
        if act not in cls.hidden_acts:
            raise UnsupportedError(
                f"{cls.name}: {cls.hidden_act_key} {act!r} is not implemented; supported: {', '.join(cls.hidden_acts)}"
            )
        cls.layer_windows(cfg)

    @classmethod
    def activation(cls, cfg: ModelConfig) -> str:
        value = cfg.raw.get(cls.hidden_act_key)
        return value if isinstance(value, str) else cfg.hidden_act

    @classmethod
    def attention_scale(cls, cfg: ModelConfig) -> float:
        """The factor of q @ k^T: head_dim^-0.5, or query_pre_attn_scalar^-0.5 where the family implements it."""
        scalar = cfg.raw.get("query_pre_attn_scalar")
        if "query_pre_attn_scalar" in cls.implements and scalar is not None:
            return float(scalar) ** -0.5
        return float(cfg.head_dim) ** -0.5

    @classmethod
    def _cap(cls, cfg: ModelConfig, key: str) -> float | None:
        value = cfg.raw.get(key)
        if key not in cls.implements or value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UnsupportedError(f"{cls.name}: {key} {value!r}: expected null or a number > 0")
        return float(value)

    @classmethod
    def attention_softcap(cls, cfg: ModelConfig) -> float | None:
        return cls._cap(cfg, "attn_logit_softcapping")

    @classmethod
    def final_softcap(cls, cfg: ModelConfig) -> float | None:
        return cls._cap(cfg, "final_logit_softcapping")

    @classmethod
    def mlp_input_norm(cls) -> str:
        """The layer's norm that reads the residual stream after attention (the MLP's input norm), by its name in a
        layer (``model.layers.{i}.<name>``): post_attention_layernorm, or pre_feedforward_layernorm where sandwich
        norms put post_attention_layernorm on the attention's output instead."""
        return "pre_feedforward_layernorm" if cls.sandwich_norms else "post_attention_layernorm"

    @classmethod
    def embed_scale(cls, cfg: ModelConfig) -> float | None:
        return float(cfg.hidden_size) ** 0.5 if cls.scaled_embeddings else None

    @classmethod
    def sliding_window(cls, cfg: ModelConfig) -> int | None:
        """The attention window of the config's windowed layers, or None when no layer is windowed (Qwen configs
        carry one with use_sliding_window false)."""
        windows = [w for w in cls.layer_windows(cfg) if w is not None]
        return windows[0] if windows else None

    @classmethod
    def layer_types(cls, cfg: ModelConfig) -> tuple[str, ...]:
        """Each layer's kind, ``full_attention`` or ``sliding_attention``, as transformers decides it: the config's
        ``layer_types``; else ``sliding_window_pattern`` (every n-th layer global); else ``max_window_layers``
        (Qwen: layers from that index on windowed); else the family's pattern; else every layer windowed when a
        window is set. Without a window (or with use_sliding_window false) every layer is full."""
        n = cfg.num_hidden_layers
        full = ("full_attention",) * n
        # read before deciding (a config's pattern beside its layer_types is one the layer_types already spell out,
        # as transformers writes both): every field read here is one this family honours
        pattern = cfg.raw.get("sliding_window_pattern", cfg.raw.get("_sliding_window_pattern"))
        if cfg.sliding_window is None or cfg.raw.get("use_sliding_window") is False:
            return full
        types = cfg.raw.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or len(types) != n or any(t not in LAYER_KINDS for t in types):
                raise UnsupportedError(f"{cls.name}: layer_types {types!r}: expected {n} entries of "
                                       f"{', '.join(LAYER_KINDS)}")
            return tuple(types)
        if pattern is None:
            pattern = cls.default_window_pattern
        if pattern is not None:
            if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
                raise UnsupportedError(f"{cls.name}: sliding_window_pattern {pattern!r}: expected an integer >= 1")
            return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n))
        first = cfg.raw.get("max_window_layers")
        if isinstance(first, int) and not isinstance(first, bool):
            return tuple("sliding_attention" if i >= first else "full_attention" for i in range(n))
        return ("sliding_attention",) * n

    @classmethod
    def layer_windows(cls, cfg: ModelConfig) -> tuple[int | None, ...]:
        """Each layer's attention window (a query attends to the ``window`` positions ending at itself), or None."""
        return tuple(cfg.sliding_window if t == "sliding_attention" else None for t in cls.layer_types(cfg))

    @classmethod
    def has_qkv_bias(cls, cfg: ModelConfig) -> bool:
        return cfg.attention_bias if cls.qkv_bias is None else cls.qkv_bias

    @classmethod
    def has_mlp_bias(cls, cfg: ModelConfig) -> bool:
        return cfg.mlp_bias if cls.mlp_bias is None else cls.mlp_bias

    @classmethod
    def expected_parameters(cls, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every parameter the family needs, with its shape (HF names)."""
        h, d = cfg.hidden_size, cfg.head_dim
        q, kv, f = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
        params: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
        qkv_bias = cls.has_qkv_bias(cfg)
        for i in range(cfg.num_hidden_layers):
            p = f"{LAYER_PREFIX}{i}."
            params[p + "input_layernorm.weight"] = (h,)
            params[p + "post_attention_layernorm.weight"] = (h,)
            if cls.sandwich_norms:
                params[p + "pre_feedforward_layernorm.weight"] = (h,)
                params[p + "post_feedforward_layernorm.weight"] = (h,)
            if cls.fused_checkpoint_linears:
                params[p + "self_attn.qkv_proj.weight"] = (q + 2 * kv, h)
            else:
                params[p + "self_attn.q_proj.weight"] = (q, h)
                params[p + "self_attn.k_proj.weight"] = (kv, h)
                params[p + "self_attn.v_proj.weight"] = (kv, h)
            params[p + "self_attn.o_proj.weight"] = (h, q)
            if qkv_bias:
                params[p + "self_attn.q_proj.bias"] = (q,)
                params[p + "self_attn.k_proj.bias"] = (kv,)
                params[p + "self_attn.v_proj.bias"] = (kv,)
            if cfg.attention_bias and cls.qkv_bias is None:
                params[p + "self_attn.o_proj.bias"] = (h,)
            if cls.qk_norm:
                params[p + "self_attn.q_norm.weight"] = (d,)
                params[p + "self_attn.k_norm.weight"] = (d,)
            if cls.fused_checkpoint_linears:
                params[p + "mlp.gate_up_proj.weight"] = (2 * f, h)
            else:
                params[p + "mlp.gate_proj.weight"] = (f, h)
                params[p + "mlp.up_proj.weight"] = (f, h)
            params[p + "mlp.down_proj.weight"] = (h, f)
            if cls.has_mlp_bias(cfg):
                params[p + "mlp.gate_proj.bias"] = (f,)
                params[p + "mlp.up_proj.bias"] = (f,)
                params[p + "mlp.down_proj.bias"] = (h,)
        params["model.norm.weight"] = (h,)
        if not cfg.tie_word_embeddings:
            params["lm_head.weight"] = (cfg.vocab_size, h)
        return params

    @classmethod
    def tied_parameters(cls, cfg: ModelConfig) -> dict[str, str]:
        """Checkpoint names that alias another parameter when embeddings are tied: name -> source."""
        return {"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_word_embeddings else {}


LAYER_KINDS = ("full_attention", "sliding_attention")
LAYER_PREFIX = "model.layers."  # decoder layer i's parameters are named model.layers.{i}.*


def layers_held(names: Iterable[str]) -> set[int]:
    """The decoder layer indices that tensor ``names`` hold (``model.layers.{i}.*``), read from the names only."""
    held = set()
    for name in names:
        if name.startswith(LAYER_PREFIX):
            index = name[len(LAYER_PREFIX):].partition(".")[0]
            if index.isascii() and index.isdigit() and len(index) <= 18:  # longer: no layer, an unexpected name
                held.add(int(index))
    return held


class NoFamilyError(UnsupportedError):
    """No registered family takes this config: its model_type or an architecture is unknown, or they name different
    families. (A family that refuses a config it does own raises plain ``UnsupportedError``.)"""


FAMILIES: Registry[type[ModelFamily]] = Registry("model_type")
ARCHITECTURES: Registry[type[ModelFamily]] = Registry("architecture")


def register_family(cls: type[ModelFamily]) -> type[ModelFamily]:
    for attr in ("name", "model_types", "architectures"):
        if not getattr(cls, attr, None):
            raise BugError(f"model family {cls.__qualname__} must set class attribute {attr!r}")
    for mt in cls.model_types:
        FAMILIES.add(mt, cls)
    for arch in cls.architectures:
        ARCHITECTURES.add(arch, cls)
    return cls


def family_for(cfg: ModelConfig) -> type[ModelFamily]:
    """The family for a config, by ``model_type`` (checked against ``architectures``). Fails fast, listing
    every registered ``model_type``, before any tensor is read."""
    _load_builtin_families()
    if cfg.model_type not in FAMILIES:
        raise NoFamilyError(FAMILIES.unknown_message(cfg.model_type))
    family = FAMILIES.get(cfg.model_type)
    for arch in cfg.architectures:
        if arch not in ARCHITECTURES:
            raise NoFamilyError(ARCHITECTURES.unknown_message(arch))
        if ARCHITECTURES.get(arch) is not family:
            raise NoFamilyError(
                f"architecture {arch!r} belongs to family {ARCHITECTURES.get(arch).name!r}, "
                f"but model_type {cfg.model_type!r} names {family.name!r}"
            )
    family.check_config(cfg)
    return family


# the package's modules that hold no family: never imported to fill the registry (decoder, ops and rope import torch,
# which inspect, the plan and eval --reference must not load)
SUPPORT_MODULES = frozenset({"base", "contract", "decoder", "ops", "rope"})


def _load_builtin_families() -> None:
    """Import every module of this package once (sorted: a stable registration order); their decorators fill
    the registries. A family is one module: nothing here lists them."""
    from edgellm.registry import import_submodules

    import_submodules("edgellm.models", skip=SUPPORT_MODULES)


def registered_families() -> list[type[ModelFamily]]:
    """Every registered family once, sorted by name."""
    _load_builtin_families()
    return sorted({cls for _, cls in FAMILIES.items()}, key=lambda c: c.name)


def is_registered_model_type(model_type: object) -> bool:
    _load_builtin_families()
    return isinstance(model_type, str) and model_type in FAMILIES


def family_named(name: str) -> type[ModelFamily]:
    """The registered family called ``name`` (its ``name``, e.g. "qwen3"); unknown: every valid name."""
    _load_builtin_families()
    found = {cls.name: cls for _, cls in FAMILIES.items()}
    if name not in found:
        raise ConfigurationError(f"unknown model family {name!r}; valid: {', '.join(sorted(found))}")
    return found[name]
