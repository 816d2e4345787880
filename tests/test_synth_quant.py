"""Synthetic (round-to-nearest) ModelOpt checkpoints are laid out exactly as the real quantizer's and build like
them; an LM head quantized at export (--lm-head-precision int8_wo / int4_wo) runs on MatMulNBits and computes what
its eager arithmetic gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from edgellm import BUNDLED_TEXT_FILE
from edgellm.checkpoint.modelopt import read_quant_layout
from edgellm.cli import main
from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.compiler.quantized import load_quantized_decoder
from edgellm.config import ModelConfig
from edgellm.errors import UnsupportedError
from edgellm.models import family_for
from edgellm.runtime import Engine
from edgellm.synth import make_checkpoint
from edgellm.synth_quant import quantize_rtn
from tests.fixtures.quantized import Quantized

TIED_QWEN2 = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=1024, tie_word_embeddings=True)


def _ids(ckpt: Path, n: int = 64) -> list[int]:
    return Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(BUNDLED_TEXT_FILE.read_text()).ids[:n]


def _layout(path: Path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(str(path), framework="pt") as f:
        return {k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118


@pytest.mark.parametrize("method", ["int4_awq", "int8_sq"])
def test_synthetic_checkpoint_is_laid_out_as_the_real_quantizers(quantized: Quantized, tmp_path: Path,
                                                                 method: str, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    real = quantized.get("qwen3_128", method)
    src = quantized.source("qwen3_128")
    syn = quantize_rtn(src, tmp_path / "syn", method, _ids(src))
    assert sorted(p.name for p in syn.iterdir()) == sorted(p.name for p in real.iterdir())
    assert _layout(syn / "model.safetensors") == _layout(real / "model.safetensors")
    assert (json.loads((syn / "hf_quant_config.json").read_text())["quantization"]
            == json.loads((real / "hf_quant_config.json").read_text())["quantization"])
    qc_syn, qc_real = (json.loads((d / "config.json").read_text())["quantization_config"] for d in (syn, real))
    assert {k: v for k, v in qc_syn.items() if k != "producer"} == {k: v for k, v in qc_real.items()
                                                                     if k != "producer"}
    assert qc_syn["producer"]["name"] == "edgellm.synth_quant"
    layout_syn, layout_real = read_quant_layout(syn), read_quant_layout(real)
    assert not layout_syn.problems
    assert layout_syn.to_json() == layout_real.to_json()
    assert main(["inspect", str(syn)]) == 0
    capsys.readouterr()
    export_checkpoint(syn, tmp_path / "onnx")
    built = build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", max_batch_size=1, max_input_len=64,
                         max_seq_len=96)
    assert built["precision"] == method
    assert built["graph"]["quantized_gemms"] == {"int4_awq": {"int4": 14}, "int8_sq": {"int8": 14}}[method]


def test_synthetic_int8_shares_smoothing_like_modelopt(quantized: Quantized, tmp_path: Path) -> None:
    """ModelOpt's int8_sq export gives the linears of one input (q/k/v, gate/up) one pre_quant_scale and
    input_scale; int4_awq one per linear."""
    src = quantized.source("qwen3_128")
    for method, shared in (("int8_sq", True), ("int4_awq", False)):
        with safe_open(str(quantize_rtn(src, tmp_path / method, method, _ids(src)) / "model.safetensors"),
                       framework="pt") as f:
            q, k = (f.get_tensor(f"model.layers.0.self_attn.{m}.pre_quant_scale") for m in ("q_proj", "k_proj"))
            assert torch.equal(q, k) is shared


@pytest.mark.parametrize(("head", "bits"), [("int8_wo", 8), ("int4_wo", 4)])
def test_lm_head_quantized_at_export(tmp_path: Path, head: str, bits: int) -> None:
    """Tied embedding: the LM head becomes a MatMulNBits of its own, the lookup keeps the checkpoint's fp16 table
    (exact); the engine computes what the eager arithmetic gives and stays close to the float LM head."""
    src = make_checkpoint(tmp_path / "src", "qwen2", **TIED_QWEN2)
    ckpt = quantize_rtn(src, tmp_path / "int4", "int4_awq", _ids(src))
    ids = _ids(src, 48)
    logits = {}
    for h in ("fp32", head):
        manifest = export_checkpoint(ckpt, tmp_path / f"{h}-onnx", lm_head_precision=h)
        assert manifest["lm_head_precision"] == h
        built = build_engine(tmp_path / f"{h}-onnx", tmp_path / f"{h}-engine", "ort", max_batch_size=1,
                             max_input_len=64, max_seq_len=96)
        logits[h] = Engine.open(tmp_path / f"{h}-engine").logits(ids)
    assert built["graph"]["quantized_gemms"] == ({"int4": 14, "int8": 1} if bits == 8 else {"int4": 15})
    assert built["graph"]["weight_bytes"]["float16"] == TIED_QWEN2["vocab_size"] * TIED_QWEN2["hidden_size"] * 2
    cfg = ModelConfig.load(ckpt)
    decoder = load_quantized_decoder(ckpt, cfg, family_for(cfg), read_quant_layout(ckpt), lm_head=head)
    with torch.no_grad():
        ref = decoder(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.int64), torch.arange(len(ids))[None],
                      *decoder.empty_past(1))[0][0].numpy()
    # int8 activation rounding (MatMulNBits accuracy_level 4) can flip at a half step where the two computations
    # differ by 1e-6, hence a tolerance of a few activation quanta, not fp32 rounding
    assert np.abs(logits[head] - ref).max() < 1e-2 * max(1.0, float(np.abs(ref).max()))
    agree = (logits[head].argmax(-1) == logits["fp32"].argmax(-1)).mean()
    assert agree >= (0.95 if bits == 8 else 0.85), agree


def test_lm_head_precision_refused_for_float_exports(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "qwen2", **TIED_QWEN2)
    with pytest.raises(UnsupportedError, match=r"supported: fp32$"):
        export_checkpoint(src, tmp_path / "onnx", lm_head_precision="int8_wo")
