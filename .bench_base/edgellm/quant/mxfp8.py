"""mxfp8: OCP microscaling fp8, e4m3 weights in blocks of 32 with e8m0 (power of two) block scales (ModelOpt
``MXFP8``). Read by inspect; export refuses it on this platform.

Stored per linear: weight F8_E4M3 [out, in], weight_scale U8 (e8m0) [out, in/32].
"""

from __future__ import annotations

from edgellm.quant.base import QuantizationMethod, Scale, StoredFormat, register_method


@register_method
class Mxfp8(QuantizationMethod):
    name = "mxfp8"
    order = 80
    modelopt_algos = ("MXFP8",)
    stored = StoredFormat(("F8_E4M3",), lambda o, i: (o, i),
                          {"weight_scale": Scale(lambda o, i, g: (o, i // (g or 32)), dtypes=("U8",))})
    refused = "MXFP8 (e8m0 block scales) has no ONNX Runtime CPU kernel and no ONNX scale type before opset 23"

    @classmethod
    def group_size_problem(cls, group: int) -> str | None:
        return None if group == 32 else f"group_size {group} is not MXFP8's block (32 e4m3 values per e8m0 scale)"
