from __future__ import annotations

from typing import Any, ClassVar

from edgellm.config import ModelConfig
from edgellm.errors import UnsupportedError
from edgellm.models.base import ModelFamily, register_family


@register_family
class Gemma3Text(ModelFamily):
    """Gemma 3 text (1B, and the language model of 4B/12B/27B): embeddings times sqrt(hidden) in the model dtype,
    (1 + w) RMSNorm, norms before and after attention and feed-forward, GeGLU (tanh GELU), per-head q/k norms,
    attention scaled by query_pre_attn_scalar, five local (sliding-window, rope_local_base_freq) layers to one
    global (rope_theta, with its rope_scaling) — ``layer_types`` or ``sliding_window_pattern`` — and optional
    final-logit soft-capping. transformers' Gemma-3 attention ignores ``attn_logit_softcapping``: a config setting
    it is refused rather than silently dropped."""

    name = "gemma3_text"
    model_types = ("gemma3_text",)
    architectures = ("Gemma3ForCausalLM",)
    hf_config = "Gemma3TextConfig"
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=512, max_position_embeddings=256, query_pre_attn_scalar=16, sliding_window=8,
        sliding_window_pattern=3)
    conformance_features: ClassVar[dict[str, dict[str, Any]]] = {
        # 4B/12B/27B: linear scaling of the global layers' RoPE
        "global_linear_rope": {"rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        "final_softcap": {"final_logit_softcapping": 30.0},
        "sliding_window": {"sliding_window": 4},
    }
    rope_types = ("linear", "dynamic", "yarn", "llama3")
    hidden_acts = ("gelu_pytorch_tanh",)
    hidden_act_key = "hidden_activation"
    qk_norm = True
    norm_offset = True
    sandwich_norms = True
    scaled_embeddings = True
    default_window_pattern = 6
    implements = frozenset({"query_pre_attn_scalar", "final_logit_softcapping", "layer_types",
                            "sliding_window_pattern"})

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        super().check_config(cfg)
        if cfg.raw.get("use_bidirectional_attention"):
            raise UnsupportedError(f"{cls.name}: use_bidirectional_attention = true (bidirectional attention, the "
                                   f"embedding models) is not implemented; a decoder attends causally")
