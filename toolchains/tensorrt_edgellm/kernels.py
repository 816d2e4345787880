"""What TensorRT Edge-LLM's attention kernels take: the SMs, head sizes and query/KV head ratios its prefill and
decode kernels exist for, and the SMs its FP8 KV cache runs on. A row needs both kernels (the engine prefills the
prompt, then decodes), so a model either kernel refuses never builds on the platform: the plan records it as not
applicable with :func:`problem`'s reason (``TensorrtEdgellm.model_problem``).

Source: NVIDIA TensorRT-Edge-LLM 0.10.0 (read at commit bb291453bc10 of its ``main``; no 0.11.0 source was
public). Paths below are that repository's. All kernels take FP16
activations; the weight precision does not change these limits.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgefarm.toolchains.base import ModelShape
from edgellm.types import KVCachePrecision

# --- decode: XQA (cpp/kernels/decodeAttentionKernels/decoderXQARunner.cpp:551-586) ---------------------------------
DECODE_SMS = frozenset({80, 86, 87, 89, 100, 101, 120, 121})
# Thor's SM110 runs as 101 inside the plugin (cpp/plugins/utils/pluginUtils.cpp:46-53; its XQA cubins are generated
# as 101: cmake/XQACubins.cmake:7-16, :32-33)
DECODE_SM_ALIASES: Mapping[int, int] = {110: 101}
# head size -> the query heads per KV head XQA has kernels for
DECODE_Q_PER_KV: Mapping[int, frozenset[int]] = {
    32: frozenset(range(1, 9)),
    64: frozenset(range(1, 9)),
    128: frozenset({*range(1, 9), 16}),
    256: frozenset({2, 4, 6, 8}),
    512: frozenset({2, 4, 8, 16}),
}

# --- prefill: CuTe DSL FMHA v2, causal and paged (cpp/kernels/contextAttentionKernels/cuteDslFMHAV2Runner.cpp:60-130)
PREFILL_SMS = frozenset({80, 86, 87, 89, 100, 101, 110, 120, 121})
PREFILL_HEAD_SIZES = frozenset({64, 128, 256, 512})

# --- FP8 KV cache (cpp/plugins/attentionPlugin/attentionPlugin.cpp:487-490) -----------------------------------------
FP8_KV_SMS = frozenset({89, 100, 101, 110, 120, 121})

# the paged KV cache's page (kTOKENS_PER_PAGE, cpp/common/pagedKvTypes.h:27)
TOKENS_PER_PAGE = 128

WHO = "TensorRT Edge-LLM's"


def _sms(sms: frozenset[int]) -> str:
    return ", ".join(f"SM{s}" for s in sorted(sms))


def _ints(values: frozenset[int]) -> str:
    return ", ".join(str(v) for v in sorted(values))


def head_sizes() -> frozenset[int]:
    """The head sizes both kernels take (a row needs both)."""
    return PREFILL_HEAD_SIZES & frozenset(DECODE_Q_PER_KV)


def problem(shape: ModelShape, sm: int | None, kv_cache: KVCachePrecision | None = None) -> str | None:
    """Why TensorRT Edge-LLM's attention kernels cannot run a model of ``shape`` on SM ``sm`` (None: no GPU) with
    ``kv_cache``, as one line naming the model's value and what is valid; None when both kernels exist."""
    if sm is None:
        return f"{WHO} attention kernels need an NVIDIA GPU ({_sms(PREFILL_SMS)})"
    if sm not in PREFILL_SMS:
        return f"{WHO} prefill attention kernels exist for {_sms(PREFILL_SMS)}; this GPU is SM{sm}"
    decode_sm = DECODE_SM_ALIASES.get(sm, sm)
    if decode_sm not in DECODE_SMS:
        return (f"{WHO} decode attention kernels (XQA) exist for {_sms(DECODE_SMS)} (SM110 runs as SM101); "
                f"this GPU is SM{sm}")
    q, kv = shape.num_attention_heads, shape.num_key_value_heads
    if kv <= 0 or q < kv or q % kv:
        return (f"{WHO} attention kernels need the query heads to be a multiple of the KV heads; this model has {q} "
                f"query and {kv} KV heads")
    head = shape.head_dim
    both = head_sizes()
    if head not in both:
        half = ""
        if head in DECODE_Q_PER_KV:
            half = " (a decode kernel, but no prefill kernel)"
        elif head in PREFILL_HEAD_SIZES:
            half = " (a prefill kernel, but no decode kernel)"
        return (f"{WHO} attention kernels take head sizes {_ints(both)} (prefill and decode); this model's is "
                f"{head}{half}")
    ratios = DECODE_Q_PER_KV[head]
    if shape.q_per_kv not in ratios:
        return (f"{WHO} decode attention kernels (XQA) take head size {head} with {_ints(ratios)} query heads per KV "
                f"head; this model has {shape.q_per_kv} ({q} query, {kv} KV heads)")
    if kv_cache is KVCachePrecision.FP8 and sm not in FP8_KV_SMS:
        return f"{WHO} FP8 KV cache runs only on {_sms(FP8_KV_SMS)}; this GPU is SM{sm}"
    return None
