"""Compact test ids: parse and format round-trip, including model names that contain '-'."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgellm.errors import ConfigurationError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision
from test_lists.ids import TestId, case_name_problem, model_name_problem

EXAMPLES = {
    "Qwen2.5-0.5B-Instruct-fp16-mxsl4096-mxbs4-mxil2048": TestId(
        "Qwen2.5-0.5B-Instruct", Precision.FP16, 4096, 4, 2048
    ),
    "Llama-3.2-1B-Instruct-int4_awq-lmfp16-mxsl2048-mxbs1-mxil1024-fp8kv": TestId(
        "Llama-3.2-1B-Instruct", Precision.INT4_AWQ, 2048, 1, 1024,
        lm_head_precision=LMHeadPrecision.FP16, kv_cache_precision=KVCachePrecision.FP8,
    ),
    "Mistral-7B-v0.3-fp8-mxsl8192-mxbs4-mxil4096-fp8kv-long-ctx": TestId(
        "Mistral-7B-v0.3", Precision.FP8, 8192, 4, 4096, kv_cache_precision=KVCachePrecision.FP8, case="long-ctx"
    ),
    "stories260K-fp32-mxsl256-mxbs2-mxil128": TestId("stories260K", Precision.FP32, 256, 2, 128),
    # a model whose last token is itself a precision name
    "foo-fp16-fp16-lmfp32-mxsl8-mxbs1-mxil8-batch8": TestId(
        "foo-fp16", Precision.FP16, 8, 1, 8, lm_head_precision=LMHeadPrecision.FP32, case="batch8"
    ),
    "Qwen3-0.6B-nvfp4-mxsl4096-mxbs4-mxil2048": TestId("Qwen3-0.6B", Precision.NVFP4, 4096, 4, 2048),
}


@pytest.mark.parametrize("text", sorted(EXAMPLES))
def test_examples_parse_and_format(text: str) -> None:
    parsed = TestId.parse(text)
    assert parsed == EXAMPLES[text]
    assert parsed.format() == text
    assert str(parsed) == text


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("Qwen2.5-0.5B-fp7-mxsl4096-mxbs4-mxil2048", "'fp7' before the limits is not a precision; valid: fp32"),
        ("Qwen2.5-0.5B-fp16-mxbs4-mxil2048", "lacks 'mxslN-mxbsN-mxilN'"),
        ("Qwen2.5-0.5B-fp16-mxsl4096-mxil2048-mxbs4", "expected mxbsN (N >= 1) but found 'mxil2048'"),
        ("Qwen2.5-0.5B-fp16-mxsl0-mxbs4-mxil2048", "expected mxslN (N >= 1) but found 'mxsl0'"),
        ("Qwen2.5-0.5B-fp16-mxsl04-mxbs4-mxil2048", "found 'mxsl04'"),
        ("fp16-mxsl4-mxbs4-mxil2", "is not a precision"),
        ("Qwen--x-fp16-mxsl4-mxbs4-mxil2", "empty '-'-separated part"),
    ],
)
def test_bad_ids_name_the_bad_part(text: str, needle: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        TestId.parse(text)
    assert needle in str(err.value)


def test_reserved_tokens_are_refused_in_names() -> None:
    with pytest.raises(ConfigurationError, match="reserve"):
        TestId("Foo-mxsl12", Precision.FP16, 8, 1, 8)
    with pytest.raises(ConfigurationError, match="reserve"):
        TestId("Foo-lmfp16", Precision.FP16, 8, 1, 8)
    with pytest.raises(ConfigurationError, match="'<precision>kv'"):
        TestId("Foo", Precision.FP16, 8, 1, 8, case="fp8kv-x")
    with pytest.raises(ConfigurationError, match="max_batch_size must be an integer >= 1"):
        TestId("Foo", Precision.FP16, 8, 0, 8)


_token = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._", min_size=1, max_size=8)
_name = st.lists(_token, min_size=1, max_size=5).map("-".join).filter(lambda n: model_name_problem(n) is None)
_case = st.lists(_token, min_size=1, max_size=3).map("-".join).filter(lambda c: case_name_problem(c) is None)
_prec = st.sampled_from(list(Precision))
_limit = st.integers(min_value=1, max_value=1_000_000)


@given(
    model=_name,
    precision=_prec,
    lm=st.none() | st.sampled_from(list(LMHeadPrecision)),
    kv=st.none() | st.sampled_from(list(KVCachePrecision)),
    limits=st.tuples(_limit, _limit, _limit),
    case=st.none() | _case,
)
def test_round_trip_property(model, precision, lm, kv, limits, case) -> None:
    tid = TestId(model, precision, *limits, lm_head_precision=lm, kv_cache_precision=kv, case=case)
    text = tid.format()
    assert TestId.parse(text) == tid
    assert TestId.parse(text).format() == text


@given(model=st.lists(st.sampled_from(["Qwen2.5", "0.5B", "Instruct", "7B", "v0.3", "fp16", "int4_awq", "3.2"]),
                      min_size=1, max_size=6).map("-".join), precision=_prec)
def test_round_trip_with_precision_like_model_tokens(model: str, precision: Precision) -> None:
    tid = TestId(model, precision, 4096, 4, 2048)
    assert TestId.parse(tid.format()) == tid
