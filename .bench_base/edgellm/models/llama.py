from __future__ import annotations

from typing import Any, ClassVar

from edgellm.models.base import ModelFamily, register_family


@register_family
class Llama(ModelFamily):
    """Llama 1/2/3 (and llama2.c exports such as stories260K). Llama-3 ``rope_scaling`` supported."""

    name = "llama"
    model_types = ("llama",)
    architectures = ("LlamaForCausalLM",)
    hf_config = "LlamaConfig"
    mlp_bias = None  # LlamaConfig.mlp_bias is read
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=256)
