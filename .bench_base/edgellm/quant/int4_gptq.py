"""int4_gptq: 4-bit integer weights quantized by GPTQ (ModelOpt ``W4A16_GPTQ``; a config.json ``quant_method: gptq``
with 4 bits). Recognised in a checkpoint's config; its stored layout is not read and export does not build it yet.
"""

from __future__ import annotations

from edgellm.quant.base import QuantizationMethod, register_method


@register_method
class Int4Gptq(QuantizationMethod):
    name = "int4_gptq"
    order = 50
    modelopt_algos = ("W4A16_GPTQ",)
    bits_per_weight = 4.25  # 4-bit values + an fp32 scale per group of 128
    hf_quant_methods = (("gptq", 4),)
