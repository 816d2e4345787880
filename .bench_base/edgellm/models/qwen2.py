from __future__ import annotations

from typing import Any, ClassVar

from edgellm.models.base import ModelFamily, register_family


@register_family
class Qwen2(ModelFamily):
    """Qwen2 / Qwen2.5: q/k/v projections always carry a bias, o_proj never does."""

    name = "qwen2"
    model_types = ("qwen2",)
    architectures = ("Qwen2ForCausalLM",)
    hf_config = "Qwen2Config"
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=256)
    qkv_bias = True
