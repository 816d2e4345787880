from __future__ import annotations

from edgellm.models.base import ModelFamily, register_family


@register_family
class Qwen3(ModelFamily):
    """Qwen3: per-head RMSNorm on q and k before RoPE, explicit ``head_dim``."""

    name = "qwen3"
    model_types = ("qwen3",)
    architectures = ("Qwen3ForCausalLM",)
    qk_norm = True
