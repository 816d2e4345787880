from __future__ import annotations

from edgellm.models.base import ModelFamily, register_family


@register_family
class Mistral(ModelFamily):
    """Mistral: Llama layout. Full attention only: a build refuses max_seq_len above ``sliding_window``."""

    name = "mistral"
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)
