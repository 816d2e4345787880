"""Accuracy checks against hostile metrics (issue 24): a non-finite metric never passes a check, and an engine whose
outputs are not finite fails its eval whatever the limits say (a catalog's ``top1_min_agreement: 0.0`` included)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgefarm.test_lists.catalog import Catalog
from edgellm.accuracy import _check, _make_checks
from edgellm.thresholds import resolve_thresholds
from edgellm.types import Precision

NON_FINITE = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=str)
@pytest.mark.parametrize("op", ["<=", ">="])
def test_a_non_finite_metric_never_passes(op: str, value: float) -> None:
    """``value <= limit`` and ``value >= limit`` are false for NaN; written as ``not value > limit`` they would let
    it pass. No metric is infinite when the engine worked (an infinite one came from non-finite outputs): it fails
    on either side of its limit too."""
    check = _check("m", value, 0.5, op)
    assert check.passed is False
    assert check.to_json()["value"] == str(value)  # JSON has no NaN: kept as text, never as a passing number


def _metrics(*, max_abs: float = 0.0, cos: float = 1.0, ppl_rel: float = 0.0, ppl_engine: float = 5.0,
             top1: float = 1.0, fraction: float = 1.0, margin: float = 0.0,
             finite: bool = True) -> dict[str, Any]:
    return {"logits": {"max_abs_diff": max_abs, "min_cosine": cos, "per_prompt": []},
            "greedy": [{"fraction": fraction, "matched": 4, "total": 4, "divergence_margin": margin,
                        "margin_exact": True}],
            "ppl": {"engine": ppl_engine, "reference": 5.0, "tokens": 10, "top1_agreement": top1,
                    "rel_diff": ppl_rel, "finite": finite},
            "tokenizer_ok": True, "tok_detail": ""}


@given(metric=st.sampled_from(["max_abs", "cos", "ppl_rel", "top1", "fraction", "margin"]),
       value=st.sampled_from(NON_FINITE))
def test_every_metric_check_fails_on_a_non_finite_value(metric: str, value: float) -> None:
    """fp32's limits enable every metric; a non-finite value in any one of them fails that check."""
    limits = resolve_thresholds(Precision.FP32).replace(greedy_max_divergence_margin=0.25)
    checks = _make_checks(limits, **_metrics(**{metric: value}))
    failed = [c.name for c in checks if not c.passed and c.name != "outputs_finite"]
    assert len(failed) == 1, failed


def test_non_finite_outputs_fail_under_the_catalogs_loosest_limits() -> None:
    """tiny-qwen3-128's catalog limits for int4_awq (top-1 0.0 over the method's defaults, and with perplexity
    switched off too): an engine whose logits hold NaN or inf fails, by a check no threshold disables."""
    catalog = Catalog.load().get("tiny-qwen3-128").thresholds[Precision.INT4_AWQ]
    assert catalog == {"top1_min_agreement": 0.0}
    for overrides in (catalog, {**catalog, "ppl_max_rel_diff": None}):
        limits = resolve_thresholds(Precision.INT4_AWQ, None, overrides)
        healthy = _make_checks(limits, **_metrics(top1=0.6))
        assert all(c.passed for c in healthy)
        # logits NaN on the fixed prompts; on the text windows the engine's perplexity came out NaN (or it did not,
        # an argmax over NaN rows still agrees somewhere: top-1 0.29 passes a limit of 0.0)
        broken = _make_checks(limits, **_metrics(max_abs=math.nan, cos=math.nan, ppl_engine=math.nan,
                                                 ppl_rel=math.nan, top1=0.29, finite=False))
        assert "outputs_finite" in [c.name for c in broken if not c.passed]
        windows_only = _make_checks(limits, **_metrics(top1=0.29, finite=False))
        assert [c.name for c in windows_only if not c.passed] == ["outputs_finite"]


@given(margins=st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=4),
       at=st.integers(min_value=0, max_value=4), bad=st.sampled_from(NON_FINITE))
def test_tensorrt_edgellm_text_check_fails_on_a_non_finite_margin_in_any_prompt(margins: list[float], at: int,
                                                                                bad: float) -> None:
    """The worst margin over the prompts was ``max(...)``: a NaN after the first prompt compared false and was
    dropped, so the check passed on it."""
    from edgefarm.toolchains.tensorrt_edgellm.accuracy import TextLimits, judge

    margins = [*margins[:at], bad, *margins[at:]]
    per_prompt = [{"divergence_margin": m, "fraction": 1.0} for m in margins]
    report = judge(per_prompt, TextLimits(max_divergence_margin=1.0, min_match_fraction=None))
    assert report["passed"] is False and report["failed_checks"] == ["greedy_divergence_margin"], report
