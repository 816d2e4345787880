"""int8_wo: 8-bit integer weights, float activations (ModelOpt ``W8A16``). Recognised in a checkpoint's config; its
stored layout is not read and export does not build it yet.
"""

from __future__ import annotations

from edgellm.quant.base import QuantizationMethod, register_method


@register_method
class Int8Wo(QuantizationMethod):
    name = "int8_wo"
    order = 30
    modelopt_algos = ("W8A16",)
    bits_per_weight = 8.0  # 8-bit values; a per-channel scale is negligible
