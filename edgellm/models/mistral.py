from __future__ import annotations

from edgellm.models.base import ModelFamily, register_family


@register_family
class Mistral(ModelFamily):
    """Mistral: Llama layout; ``sliding_window`` is honoured by the runtime's attention mask."""

    name = "mistral"
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)
