"""int4_wo: 4-bit integer weights by round-to-nearest, float activations (ModelOpt ``W4A16``). Recognised in a
checkpoint's config; its stored layout is not read and export does not build it yet.
"""

from __future__ import annotations

from edgellm.quant.base import QuantizationMethod, register_method


@register_method
class Int4Wo(QuantizationMethod):
    name = "int4_wo"
    order = 60
    modelopt_algos = ("W4A16",)
    bits_per_weight = 4.25  # 4-bit values + an fp32 scale per group of 128
