from __future__ import annotations

from typing import Any, ClassVar

from edgellm.models.base import ModelFamily, register_family


@register_family
class Mistral(ModelFamily):
    """Mistral: Llama layout; ``sliding_window`` (when set) windows every layer."""

    name = "mistral"
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)
    hf_config = "MistralConfig"
    qkv_bias = False  # transformers' Mistral has no attention bias, whatever the config says
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=256, sliding_window=None)
