"""Quantized checkpoints from the real quantizer -> export -> ONNX Runtime engine: the integer kernels are in the
graph (counted by kind in the read-back), the engine computes what the checkpoint's dequantized arithmetic gives,
greedy generation runs, a build that loses quantized GEMMs fails, and refused methods say why (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edgellm.checkpoint.modelopt import read_quant_layout
from edgellm.cli import main
from edgellm.compiler.build import build_engine
from edgellm.compiler.quantized import load_quantized_decoder
from edgellm.config import ModelConfig
from edgellm.errors import TestFailure
from edgellm.models import family_for
from edgellm.runtime import Engine, GenerationRequest
from tests.fixtures.quantized import Quantized

PROMPT = "Once upon a time there was a little girl"
# (model, method) -> (ONNX op of the quantized GEMM, how many)
BUILDS = {("qwen3_128", "int4_awq"): ("MatMulNBits", 14), ("qwen3_128", "int8_sq"): ("MatMulIntegerToFloat", 14),
          ("qwen3_128", "fp8"): ("DequantizeLinear", 14), ("stories", "int4_awq"): ("MatMulNBits", 10)}
KIND = {"int4_awq": "int4", "int8_sq": "int8", "fp8": "fp8_emulated"}


@pytest.mark.parametrize(("model", "method"), sorted(BUILDS))
def test_engine_runs_the_integer_kernels(quantized: Quantized, model: str, method: str) -> None:
    op, n = BUILDS[(model, method)]
    onnx_dir, engine_dir = quantized.engine(model, method)
    export = json.loads((onnx_dir / "export_manifest.json").read_text())
    assert export["precision"] == method and export["activation_dtype"] == "fp32"
    assert export["quantization"]["quantized_gemms"] == {KIND[method]: n}
    manifest = json.loads((engine_dir / "engine_manifest.json").read_text())
    assert manifest["precision"] == method
    assert manifest["graph"]["quantized_gemms"] == {KIND[method]: n}
    emulated = method == "fp8"  # no fp8 GEMM on the CPU: fp8 weights, DequantizeLinear, float MatMul
    assert manifest["quantization"] == {"method": method, "declared_gemms": {KIND[method]: n}, "emulated": emulated}
    graph = onnx.load(str(engine_dir / "model.onnx"), load_external_data=False).graph
    ops = sum(node.op_type == op for node in graph.node)
    # fp8: a DequantizeLinear for the activation and one for the weight (ORT's QDQ propagation may add pairs);
    # int8_sq: ModelOpt gives the linears of one input one smoothing and input scale, so the export fuses q/k/v and
    # gate/up into one integer GEMM each (4 per layer), which the read-back above still counts as 7 linears
    layers = ModelConfig.load(engine_dir).num_hidden_layers
    assert ops >= 2 * n if emulated else ops == (4 * layers if method == "int8_sq" else n)
    if emulated:
        fp8 = [t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN and len(t.dims) == 2]
        assert len(fp8) == n
        assert export["onnx_opset"] == 19
    # no float copy of a quantized weight: the only float matrices are the embedding, lm_head, unquantized linears
    layout = read_quant_layout(quantized.get(model, method))
    float_linears = len(layout.linears) - len(layout.quantized)
    float_matmuls = sum(node.op_type in ("MatMul", "FusedMatMul") for node in graph.node)
    attention = 2 * ModelConfig.load(engine_dir).num_hidden_layers
    assert float_matmuls - (n if emulated else 0) <= float_linears + attention


@pytest.mark.parametrize(("model", "method"), [("qwen3_128", "int4_awq"), ("stories", "int4_awq"),
                                               ("qwen3_128", "int8_sq")])
def test_smoothing_folded_into_the_norms_computes_what_the_checkpoint_says(quantized: Quantized, model: str,
                                                                         method: str) -> None:
    """The export folds the q/k/v (gate/up) pre_quant_scale into the RMSNorm before them; the logits stay those of
    each linear multiplying by its own scale, as the checkpoint is written."""
    ckpt = quantized.get(model, method)
    cfg, layout = ModelConfig.load(ckpt), read_quant_layout(ckpt)
    folded = load_quantized_decoder(ckpt, cfg, family_for(cfg), layout)
    as_written = load_quantized_decoder(ckpt, cfg, family_for(cfg), layout, fold_input_smoothing=False)
    attn = [layer.self_attn for layer in folded.model.layers]
    if method == "int4_awq" and model == "qwen3_128":  # every linear quantized: the q scale is in the norm now
        assert all(a.q_proj.pre_quant_scale is None for a in attn)
        assert not torch.equal(folded.model.layers[0].input_layernorm.weight,
                               as_written.model.layers[0].input_layernorm.weight)
    ids = torch.arange(3, 40)[None]
    feeds = (ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    with torch.no_grad():
        got = folded(*feeds, *folded.empty_past(1))[0]
        want = as_written(*feeds, *as_written.empty_past(1))[0]
    # the folded activation is the same up to fp32 rounding, but MatMulNBits' accuracy level 4 (mirrored in eager)
    # then rounds it to int8 per block, where a value on a rounding edge may go the other way: a step is ~0.4% of
    # the block's range. A fold that lost a ratio or a scale moves logits by tens of percent.
    diff = float((got - want).abs().max())
    assert diff < 1e-2 * float(want.abs().max()), diff
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize(("model", "method"), sorted(BUILDS))
def test_engine_matches_the_dequantized_arithmetic(quantized: Quantized, model: str, method: str) -> None:
    """The ONNX Runtime kernels compute what the checkpoint's stored integers and scales mean (torch, eager)."""
    ckpt = quantized.get(model, method)
    _, engine_dir = quantized.engine(model, method)
    engine = Engine.open(engine_dir)
    ids = engine.encode(PROMPT)
    cfg = ModelConfig.load(ckpt)
    decoder = load_quantized_decoder(ckpt, cfg, family_for(cfg), read_quant_layout(ckpt))
    with torch.no_grad():
        ref = decoder(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.int64),
                      torch.arange(len(ids))[None], *decoder.empty_past(1))[0][0].numpy()
    got = engine.logits(ids)
    assert np.abs(got - ref).max() < 2e-3 * max(1.0, float(np.abs(ref).max())), np.abs(got - ref).max()
    out = engine.generate([GenerationRequest(id="g", input_ids=ids, max_new_tokens=16, temperature=0.0)])[0]
    assert len(out.output_ids) == 16 or out.finish_reason == "eos"
    assert out.output_ids[0] == int(np.argmax(got[-1]))


def test_stories_int4_greedy_text_via_cli(quantized: Quantized, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _, engine_dir = quantized.engine("stories", "int4_awq")
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"requests": [{"id": "r", "prompt": "Once upon a time", "max_new_tokens": 24}]}))
    assert main(["infer", "--engine-dir", str(engine_dir), "--input-file", str(req), "--output-file",
                 str(tmp_path / "out.json")]) == 0
    text = json.loads((tmp_path / "out.json").read_text())["responses"][0]["text"]
    assert len(text.split()) >= 8  # the trained model still writes words after int4 (accuracy is tested apart)


def test_build_with_fewer_quantized_gemms_than_declared_fails(quantized: Quantized, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    onnx_dir, _ = quantized.engine("qwen3_128", "int4_awq")
    bad = tmp_path / "onnx"
    shutil.copytree(onnx_dir, bad)
    manifest = json.loads((bad / "export_manifest.json").read_text())
    manifest["quantization"]["quantized_gemms"]["int4"] += 1  # the checkpoint declares one more than the graph has
    (bad / "export_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TestFailure, match="fewer quantized GEMMs than the checkpoint declares: int4 14 of 15"):
        build_engine(bad, tmp_path / "engine", "ort", max_batch_size=1, max_input_len=64, max_seq_len=128)
    assert not (tmp_path / "engine").exists()
    rc = main(["build", str(bad), str(tmp_path / "engine2"), "--max-seq-len", "128", "--max-input-len", "64"])
    err = capsys.readouterr().err
    assert rc == 1 and "int4 14 of 15" in err and "Traceback" not in err


def test_precision_mismatch_and_float_checkpoint_exit_2(quantized: Quantized, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["export", str(quantized.get("qwen3_128", "int4_awq")), str(tmp_path / "a"), "--precision", "fp16"])
    err = capsys.readouterr().err
    assert rc == 2 and "checkpoint is quantized int4_awq" in err and "--precision int4_awq" in err
    rc = main(["export", str(quantized.source("qwen3_128")), str(tmp_path / "b"), "--precision", "int8_sq"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs a checkpoint quantized with it" in err and "tensorrt-edgellm-quantize" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(("method", "reason"), [("nvfp4", "ONNX Runtime's CPU provider has no fp4 type or kernel"),
                                                ("mxfp8", "has no ONNX Runtime CPU kernel")])
def test_nvfp4_mxfp8_understood_by_inspect_refused_by_build(quantized: Quantized, method: str, reason: str,
                                                            tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = quantized.get("qwen3_128", method)
    layout = read_quant_layout(ckpt)
    assert layout.problems == [] and layout.precision_counts() == {method: 14, "fp16": 1}
    assert main(["inspect", str(ckpt)]) == 0
    assert f"quant       {method}, group size {16 if method == 'nvfp4' else 32}" in capsys.readouterr().out
    rc = main(["export", str(ckpt), str(tmp_path / "onnx")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{method} is refused on this platform" in err and reason in err
    assert "buildable here: int4_awq, int8_sq, fp8" in err and "Traceback" not in err
    assert not (tmp_path / "onnx").exists()


def test_quantized_kv_cache_refused_not_ignored(quantized: Quantized, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = quantized.copy("qwen3_128", "int8_sq", tmp_path / "ck")
    cfg = json.loads((ckpt / "hf_quant_config.json").read_text())
    cfg["quantization"]["kv_cache_quant_algo"] = "FP8"
    (ckpt / "hf_quant_config.json").write_text(json.dumps(cfg))
    rc = main(["export", str(ckpt), str(tmp_path / "onnx")])
    err = capsys.readouterr().err
    assert rc == 2 and "a fp8 KV cache (kv_cache_quant_algo) is not exported" in err and "Traceback" not in err
    assert not (tmp_path / "onnx").exists()


@pytest.mark.parametrize(("method", "kind"), [("int4_awq", "int4 (AWQ, MatMulNBits)"),
                                              ("int8_sq", "int8 (SmoothQuant)"), ("fp8", "fp8")])
def test_torch_cuda_refuses_quantized_exports_saying_why(quantized: Quantized, method: str, kind: str,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The precision is checked against the backend's declaration before whether it runs here: the same refusal on
    a CPU-only machine and on a GPU, never a silently dequantized float engine."""
    onnx_dir, _ = quantized.engine("qwen3_128", method)
    rc = main(["build", str(onnx_dir), str(tmp_path / "engine"), "--backend", "torch-cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and f"backend 'torch-cuda' does not build {method} engines" in err
    assert f"the torch-cuda runtime has no {kind} GEMM" in err and "--backend ort" in err
    assert "it builds fp32, fp16, bf16" in err and "not available on this machine" not in err
    assert not (tmp_path / "engine").exists()
