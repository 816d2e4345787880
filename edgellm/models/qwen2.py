from __future__ import annotations

from edgellm.models.base import ModelFamily, register_family


@register_family
class Qwen2(ModelFamily):
    """Qwen2 / Qwen2.5: q/k/v projections always carry a bias, o_proj never does."""

    name = "qwen2"
    model_types = ("qwen2",)
    architectures = ("Qwen2ForCausalLM",)
    qkv_bias = True
