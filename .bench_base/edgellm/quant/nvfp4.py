"""nvfp4: NVIDIA's 4-bit float, e2m1 weights in blocks of 16 with fp8 block scales and a per-tensor second scale
(ModelOpt ``NVFP4``). Read by inspect; export refuses it on this platform.

Stored per linear: weight U8 [out, in/2] (e2m1 pairs), weight_scale F8_E4M3 [out, in/16], weight_scale_2 [],
input_scale [].
"""

from __future__ import annotations

from edgellm.quant.base import QuantizationMethod, Scale, StoredFormat, register_method, scalar


@register_method
class Nvfp4(QuantizationMethod):
    name = "nvfp4"
    order = 70
    modelopt_algos = ("NVFP4",)
    stored = StoredFormat(("U8",), lambda o, i: (o, i // 2),
                          {"weight_scale": Scale(lambda o, i, g: (o, i // (g or 16))), "weight_scale_2": Scale(scalar),
                           "input_scale": Scale(scalar)})
    refused = ("NVFP4 (e2m1 weights with fp8 block scales) needs Blackwell tensor cores; ONNX Runtime's CPU provider "
               "has no fp4 type or kernel")

    @classmethod
    def group_size_problem(cls, group: int) -> str | None:
        return None if group == 16 else f"group_size {group} is not NVFP4's block (16 e2m1 values per fp8 scale)"
