"""Compact test ids: the format, including model names that contain '-', and one id per test."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgefarm.test_lists.ids import TestId, case_name_problem, model_name_problem
from edgellm.errors import ConfigurationError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision

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
def test_examples_format(text: str) -> None:
    assert EXAMPLES[text].format() == text
    assert str(EXAMPLES[text]) == text


def test_different_tests_never_share_an_id() -> None:
    """Every combination of parts chosen to collide if the grammar were ambiguous (model and case tokens that look
    like precisions, KV-cache tokens inside a case) formats to an id of its own."""
    models = ["a", "fp16", "a-fp16", "a-fp16-fp16", "a-int4_awq", "fp8-a", "a-fp8kv"]
    cases = [None, "a", "fp16", "a-fp16", "a-fp8kv", "fp16-a", "mxsl4"]
    seen: dict[str, TestId] = {}
    for model, precision, lm, kv, case, limits in itertools.product(
        models, Precision, [None, *LMHeadPrecision], [None, *KVCachePrecision], cases, [(4, 1, 2), (4, 12, 1)]
    ):
        tid = TestId(model, precision, *limits, lm_head_precision=lm, kv_cache_precision=kv, case=case)
        text = tid.format()
        assert seen.setdefault(text, tid) == tid, f"{tid} and {seen[text]} share the id {text}"
    assert len(seen) == len(models) * len(Precision) * (len(LMHeadPrecision) + 1) * (len(KVCachePrecision) + 1) \
        * len(cases) * 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"model": "Foo-mxsl12"}, "reserve"),
        ({"model": "Foo-lmfp16"}, "reserve"),
        ({"model": "Qwen--x"}, "empty '-'-separated part"),
        ({"model": "Qwen/x"}, "characters outside letters"),
        ({"case": "fp8kv-x"}, "'<precision>kv'"),
        ({"case": "a--b"}, "empty '-'-separated part"),
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, got 0"),
        ({"max_seq_len": True}, "max_seq_len must be an integer >= 1, got True"),
    ],
)
def test_parts_an_id_cannot_hold_are_refused_naming_them(kwargs: dict[str, object], needle: str) -> None:
    parts: dict[str, object] = {"model": "Foo", "precision": Precision.FP16, "max_seq_len": 8,
                                "max_batch_size": 1, "max_input_len": 8, **kwargs}
    with pytest.raises(ConfigurationError) as err:
        TestId(**parts)  # type: ignore[arg-type]
    assert needle in str(err.value)


_token = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._", min_size=1, max_size=8)
_name = st.lists(_token, min_size=1, max_size=5).map("-".join).filter(lambda n: model_name_problem(n) is None)
_case = st.lists(_token, min_size=1, max_size=3).map("-".join).filter(lambda c: case_name_problem(c) is None)
_limit = st.integers(min_value=1, max_value=1_000_000)


@given(
    model=_name,
    precision=st.sampled_from(list(Precision)),
    lm=st.none() | st.sampled_from(list(LMHeadPrecision)),
    kv=st.none() | st.sampled_from(list(KVCachePrecision)),
    limits=st.tuples(_limit, _limit, _limit),
    case=st.none() | _case,
)
def test_the_limits_token_follows_exactly_the_model_and_precision(model, precision, lm, kv, limits, case) -> None:
    """The first ``mxslN`` token of any id comes right after the model, the precision and the LM head, whatever
    the model is called: that is what keeps the parts apart."""
    tid = TestId(model, precision, *limits, lm_head_precision=lm, kv_cache_precision=kv, case=case)
    tokens = tid.format().split("-")
    anchor = next(i for i, t in enumerate(tokens) if t.startswith("mxsl") and t[4:].isdigit())
    head = [model, precision.value] if lm is None else [model, precision.value, f"lm{lm.value}"]
    assert "-".join(tokens[:anchor]) == "-".join(head)
    assert tokens[anchor:anchor + 3] == [f"mxsl{limits[0]}", f"mxbs{limits[1]}", f"mxil{limits[2]}"]
