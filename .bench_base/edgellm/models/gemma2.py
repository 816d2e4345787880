from __future__ import annotations

from typing import Any, ClassVar

from edgellm.models.base import ModelFamily, register_family


@register_family
class Gemma2(ModelFamily):
    """Gemma 2: embeddings times sqrt(hidden) in the model dtype, (1 + w) RMSNorm, norms before and after attention
    and feed-forward, GeGLU (tanh GELU), attention scaled by query_pre_attn_scalar and its scores soft-capped
    (attn_logit_softcapping), final logits soft-capped, local (sliding-window) and global layers alternating."""

    name = "gemma2"
    model_types = ("gemma2",)
    architectures = ("Gemma2ForCausalLM",)
    hf_config = "Gemma2Config"
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=512, max_position_embeddings=256, query_pre_attn_scalar=16, sliding_window=8)
    conformance_features: ClassVar[dict[str, dict[str, Any]]] = {
        "sliding_window": {"sliding_window": 4},
        "no_softcap": {"attn_logit_softcapping": None, "final_logit_softcapping": None},
    }
    hidden_acts = ("gelu_pytorch_tanh",)
    hidden_act_key = "hidden_activation"
    norm_offset = True
    sandwich_norms = True
    scaled_embeddings = True
    default_window_pattern = 2  # even layers (0-based) local, odd ones global
    implements = frozenset({"query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                            "layer_types"})
