from __future__ import annotations

from typing import Any, ClassVar

from edgellm.models.base import ModelFamily, register_family


@register_family
class Qwen3(ModelFamily):
    """Qwen3: per-head RMSNorm on q and k before RoPE, explicit ``head_dim``."""

    name = "qwen3"
    model_types = ("qwen3",)
    architectures = ("Qwen3ForCausalLM",)
    hf_config = "Qwen3Config"
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=256, head_dim=32)
    qk_norm = True
