"""Accuracy of quantized engines against their float source (Hugging Face transformers on the unquantized
checkpoint): perplexity ratio and teacher-forced top-1 agreement within the per-method defaults of
``edgellm.thresholds`` (whose comment holds the measurements behind them), on the trained stories260K."""

from __future__ import annotations

import pytest

from edgellm.accuracy import EvalOptions, run_eval
from edgellm.thresholds import DEFAULTS
from edgellm.types import Precision
from tests.fixtures.quantized import Quantized


@pytest.mark.parametrize("method", ["int4_awq", "int8_sq", "fp8"])
def test_stories_quantized_within_thresholds(quantized: Quantized, method: str) -> None:
    _, engine_dir = quantized.engine("stories", method)
    report = run_eval(EvalOptions(engine_dir=engine_dir, checkpoint=quantized.source("stories")))
    limits = DEFAULTS[Precision(method)]
    assert report["precision"] == method
    assert report["thresholds"] == limits.enabled()
    assert set(report["checks"]) == {"outputs_finite", "tokenizer_match", "perplexity_rel_diff", "top1_agreement"}
    assert report["passed"], report["checks"]
    assert abs(report["perplexity_ratio"] - 1) == pytest.approx(report["checks"]["perplexity_rel_diff"]["value"])
    # quantization costs something: an engine identical to the float model would mean the quantized layers were lost
    assert report["checks"]["top1_agreement"]["value"] < 1.0 or report["perplexity_ratio"] != 1.0
