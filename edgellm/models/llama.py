from __future__ import annotations

from edgellm.models.base import ModelFamily, register_family


@register_family
class Llama(ModelFamily):
    """Llama 1/2/3 (and llama2.c exports such as stories260K). Llama-3 ``rope_scaling`` supported."""

    name = "llama"
    model_types = ("llama",)
    architectures = ("LlamaForCausalLM",)
