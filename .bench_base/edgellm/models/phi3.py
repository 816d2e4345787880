from __future__ import annotations

from typing import Any, ClassVar

from edgellm.models.base import ModelFamily, register_family

_ROT = 24  # the tiny config's rotary width: head_dim 32 x partial_rotary_factor 0.75


@register_family
class Phi3(ModelFamily):
    """Phi-3 / Phi-3.5 / Phi-4-mini (model_type phi3): q/k/v as one ``qkv_proj`` and gate/up as one
    ``gate_up_proj`` in the checkpoint (the decoder keeps them fused: one GEMM each), RoPE on the first
    partial_rotary_factor of each head (Phi-4-mini: 0.75), ``longrope`` scaling of the 128k variants (its short
    factors: engines no longer than original_max_position_embeddings), a sliding window on every layer when set."""

    name = "phi3"
    model_types = ("phi3",)
    architectures = ("Phi3ForCausalLM",)
    hf_config = "Phi3Config"
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=256, pad_token_id=0)
    conformance_features: ClassVar[dict[str, dict[str, Any]]] = {
        "partial_rotary": {"partial_rotary_factor": 0.75},
        "longrope": {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 256,
                     "rope_scaling": {"rope_type": "longrope", "factor": 32.0,
                                      "short_factor": [1.0 + 0.05 * i for i in range(_ROT // 2)],
                                      "long_factor": [2.0 + 0.5 * i for i in range(_ROT // 2)]}},
        "sliding_window": {"sliding_window": 8},
    }
    rope_types = ("longrope",)  # transformers' Phi3Config takes no other type
    fused_checkpoint_linears = True
    quantized_export = False  # its quantized qkv_proj / gate_up_proj would need their split widths: not implemented
    qkv_bias = False
    implements = frozenset({"partial_rotary_factor"})
