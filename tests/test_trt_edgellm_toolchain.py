"""NVIDIA's real tensorrt-edgellm quantizer and exporter on CPU, with the shipped calibration text and no hub.

Each (model, method) is quantized and exported once per session (10-25 s each on 2 cores) and shared by the tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from edgefarm.test_lists.catalog import Catalog
from edgefarm.toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE, ExportResult, export
from edgefarm.toolchains.tensorrt_edgellm.onnx_check import check_onnx
from edgefarm.toolchains.tensorrt_edgellm.quantize import (
    METHODS,
    NotApplicable,
    QuantizeResult,
    has_chat_template,
    preconditions,
    quant_report,
    quantize,
)
from edgellm import BUNDLED_MODEL_DIR
from edgellm.errors import ConfigurationError, TestFailure
from tests.fixtures.toolchain_runs import ToolchainRuns

NUM_SAMPLES = 16
TINY = "tiny-qwen3-128"
TINY_LINEARS = 14  # 2 layers x (q, k, v, o, gate, up, down); lm_head stays fp16 by design


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny128(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Catalog.load().get(TINY).locate(tmp_path_factory.mktemp("catalog"))


@pytest.fixture(scope="session")
def quantized(trt_env: Path, tiny128: Path, tmp_path_factory: pytest.TempPathFactory,
              toolchain_runs: ToolchainRuns) -> Callable[[str], tuple[QuantizeResult, ExportResult]]:
    """method -> (quantize result, export result) of tiny-qwen3-128, each made once per session (the quantizer's
    runs are the session's: tests/fixtures/quantized.py makes the same ones)."""
    done: dict[str, tuple[QuantizeResult, ExportResult]] = {}
    root = tmp_path_factory.mktemp("trt")

    def get(method: str) -> tuple[QuantizeResult, ExportResult]:
        if method not in done:
            q = toolchain_runs.quantize(trt_env, tiny128, root / f"q-{method}", method,
                                        chat_template=DEFAULT_CHAT_TEMPLATE, num_samples=NUM_SAMPLES)
            done[method] = (q, export(trt_env, q.checkpoint, root / f"x-{method}"))
        return done[method]

    return get


@pytest.mark.parametrize("method", [m.value for m in METHODS])
def test_every_method_quantizes_and_exports_tiny_qwen3_128(quantized, method: str) -> None:
    q, x = quantized(method)
    report = q.report
    assert len(report.quantized) == TINY_LINEARS and report.unquantized == []
    assert set(report.checked.values()) == {METHODS[report.method].stored}
    assert report.by_design == ["lm_head"] and report.linears["lm_head"] == "fp16"
    assert report.quant_algo == METHODS[report.method].quant_algo
    assert q.wall_s > 0 and q.peak_rss_bytes > 100 * 2**20 and q.size_bytes > 0
    assert q.argv[q.argv.index("--device") + 1] == "cpu"
    recorded = json.loads((q.checkpoint.parent / "quantize.json").read_text())
    assert recorded["report"]["quantized"] == TINY_LINEARS and recorded["toolchain_version"] == "0.11.0"
    assert x.toolchain_version == q.toolchain_version == "0.11.0"

    onnx = check_onnx(x.onnx_dir, expected_quantized=len(report.quantized))
    assert onnx.problems == []
    assert onnx.attention_plugins == onnx.layers == 2
    assert onnx.quantized_linears == report.quantized
    assert onnx.float_linears == ["lm_head"]
    assert x.chat_template == str(DEFAULT_CHAT_TEMPLATE)
    assert (x.onnx_dir / "chat_template.jinja").read_text() == DEFAULT_CHAT_TEMPLATE.read_text()
    assert "trt_edgellm" in onnx.ops_by_domain


def test_onnx_check_catches_a_quantized_count_that_disagrees(quantized) -> None:
    _, x = quantized("int4_awq")
    onnx = check_onnx(x.onnx_dir, expected_quantized=TINY_LINEARS - 1)
    expected = f"{TINY_LINEARS} linear.s. read quantized weights .* counts {TINY_LINEARS - 1}"
    with pytest.raises(TestFailure, match=expected):
        onnx.raise_problems()
    assert onnx.ops_by_domain["trt_edgellm"]["Int4GroupwiseGemmPluginV2"] == TINY_LINEARS


def test_unquantized_export_has_no_quantized_gemm(trt_env: Path, tiny128: Path, tmp_path: Path) -> None:
    assert not has_chat_template(tiny128)
    x = export(trt_env, tiny128, tmp_path / "x")
    onnx = check_onnx(x.onnx_dir, expected_quantized=0)
    assert onnx.problems == [] and onnx.quantized_linears == []
    # every GEMM reads a float weight (the exporter fuses q/k/v and names float weights val_N: count, not names)
    assert len(onnx.float_linears) == sum(onnx.ops_by_domain["ai.onnx"][op] for op in ("MatMul", "Gemm"))
    assert "lm_head" in onnx.float_linears
    assert not (tiny128 / "chat_template.jinja").exists()  # the source checkpoint is never modified


def test_stories260k_int4_awq_fallback_layers_are_caught(trt_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "q"
    with pytest.raises(TestFailure, match=r"int4_awq: 25 of 35 linear layers stayed unquantized"):
        quantize(trt_env, BUNDLED_MODEL_DIR, out, "int4_awq", chat_template=DEFAULT_CHAT_TEMPLATE,
                 num_samples=NUM_SAMPLES)
    report = quant_report(out / "checkpoint", "int4_awq")
    assert len(report.unquantized) == 25 and len(report.quantized) == 10
    assert all(report.linears[n] == "fp16" for n in report.unquantized)
    assert json.loads((out / "quantize.json").read_text())["report"]["unquantized_share"] == round(25 / 35, 4)
    report.check(max_unquantized_share=0.75)  # a configured share above 25/35 lets it pass


def test_stories260k_nvfp4_is_refused_before_the_tool_runs(trt_env: Path, tmp_path: Path) -> None:
    reason = preconditions(BUNDLED_MODEL_DIR, "nvfp4", chat_template=DEFAULT_CHAT_TEMPLATE)
    assert reason is not None and "divisible by its block of 16" in reason and "172" in reason
    with pytest.raises(NotApplicable) as caught:
        quantize(trt_env, BUNDLED_MODEL_DIR, tmp_path / "q", "nvfp4", chat_template=DEFAULT_CHAT_TEMPLATE)
    assert str(caught.value) == reason
    assert list(tmp_path.iterdir()) == []  # the tool never ran: no output, no work dir, no log


def test_preconditions_name_the_problem(tiny128: Path, tmp_path: Path) -> None:
    assert preconditions(tiny128, "mxfp8", chat_template=DEFAULT_CHAT_TEMPLATE) is None
    reason = preconditions(tiny128, "fp8", chat_template=None)
    assert reason is not None and "no chat template" in reason
    valid = "valid: fp8, int4_awq, int8_sq, nvfp4, mxfp8"
    with pytest.raises(ConfigurationError, match=f"cannot quantize with 'int4_gptq'; {valid}"):
        preconditions(tiny128, "int4_gptq", chat_template=DEFAULT_CHAT_TEMPLATE)
    with pytest.raises(ConfigurationError, match=r"'bogus'; valid: "):
        quantize(tmp_path, tiny128, tmp_path / "q", "bogus", chat_template=DEFAULT_CHAT_TEMPLATE)
