"""``edgellm inspect`` / ``read_quant_layout`` on checkpoints the real quantizer wrote, and on corrupted copies of
them (exit 2, one line per problem, no traceback)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgellm.checkpoint.modelopt import read_quant_layout
from edgellm.cli import main
from edgellm.types import Precision, QuantMethod
from tests.fixtures.quantized import Quantized

Q = "model.layers.0.self_attn.q_proj"
ST = "model.safetensors"


def inspect(capsys: pytest.CaptureFixture[str], ckpt: Path, out: Path) -> tuple[int, str, str, dict[str, Any]]:
    rc = main(["inspect", str(ckpt), "--output", str(out)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, json.loads(out.read_text())


@pytest.mark.parametrize(("method", "precision", "group"), [
    ("int4_awq", Precision.INT4_AWQ, 128), ("int8_sq", Precision.INT8_SQ, None), ("fp8", Precision.FP8, None)])
def test_qwen3_128_every_linear_quantized(quantized: Quantized, method: str, precision: Precision,
                                          group: int | None, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = quantized.get("qwen3_128", method)
    layout = read_quant_layout(ckpt)
    assert layout.problems == []
    assert layout.method is QuantMethod(method) and layout.group_size == group
    # 2 layers x 7 linears quantized; the untied lm_head stays fp16 (the tool excludes it by default)
    assert layout.precision_counts() == {method: 14, "fp16": 1}
    assert layout.linears["lm_head"].precision is Precision.FP16
    assert layout.linears[Q].precision is precision and layout.linears[Q].out_features == 256
    rc, out, err, inv = inspect(capsys, ckpt, tmp_path / "inv.json")
    assert (rc, err) == (0, ""), err
    q = inv["quantization"]
    assert q["method"] == method and q["layout"]["quantized_linears"] == 14
    assert {"module": "model.layers.{0..1}.self_attn.q_proj", "precision": method, "count": 2} in q["layer_table"]
    assert f"quant       {method}" in out and "14/15 linears quantized" in out
    assert "  model.layers.{0..1}.mlp.down_proj" in out


def test_stories_int4_awq_is_mixed_precision(quantized: Quantized, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    layout = read_quant_layout(quantized.get("stories", "int4_awq"))
    assert layout.problems == []
    # hidden 64 < block 128: q/o (width 64 in and out) are quantized; k/v (32 out) and the MLP (172) stay fp16
    assert layout.precision_counts() == {"int4_awq": 10, "fp16": 25}
    assert {m.rsplit(".", 1)[-1] for m in (lin.module for lin in layout.quantized)} == {"q_proj", "o_proj"}
    assert layout.to_json()["unquantized_share"] == round(25 / 35, 4)
    rc, out, _, _ = inspect(capsys, quantized.get("stories", "int4_awq"), tmp_path / "inv.json")
    assert rc == 0 and "10/35 linears quantized, fp16 25, int4_awq 10" in out
    assert "model.layers.{0..4}.mlp.gate_proj" in out and "model.layers.{0..4}.self_attn.o_proj" in out


def _resave(d: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(d / ST)
    edit(tensors)
    save_file(tensors, d / ST, metadata={"format": "pt"})


def _quant_config(d: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    cfg = json.loads((d / "hf_quant_config.json").read_text())
    edit(cfg["quantization"])
    (d / "hf_quant_config.json").write_text(json.dumps(cfg))


def _float_under_quant_declaration(quantized: Quantized, d: Path) -> None:
    """The float source checkpoint with the int4_awq checkpoint's declaration copied over it."""
    import shutil

    shutil.rmtree(d)
    shutil.copytree(quantized.source("qwen3_128"), d)
    shutil.copyfile(quantized.get("qwen3_128", "int4_awq") / "hf_quant_config.json", d / "hf_quant_config.json")


# case -> (method, corruption, needles in the problem lines)
CORRUPTIONS: dict[str, tuple[str, Callable[[Quantized, Path], None], list[str]]] = {
    "awq_scale_missing": ("int4_awq", lambda q, d: _resave(d, lambda t: t.pop(f"{Q}.weight_scale")),
                          [f"tensor '{Q}.weight': declared int4_awq-quantized but its scales are missing: "
                           f"{Q}.weight_scale"]),
    "awq_pre_quant_scale_missing": ("int4_awq", lambda q, d: _resave(d, lambda t: t.pop(f"{Q}.pre_quant_scale")),
                                    [f"its scales are missing: {Q}.pre_quant_scale"]),
    "awq_scale_shape": ("int4_awq", lambda q, d: _resave(d, lambda t: t.update(
        {f"{Q}.weight_scale": torch.ones(256, 2)})),
        [f"tensor '{Q}.weight_scale': scale shape [256, 2] does not fit the [256, 128] weight and group_size 128; "
         "int4_awq needs [256, 1]"]),
    "awq_group_size_disagrees": ("int4_awq", lambda q, d: _quant_config(d, lambda c: c.update(group_size=32)),
                                 ["scale shape [256, 1] does not fit the [256, 128] weight and group_size 32; "
                                  "int4_awq needs [256, 4]"]),
    "sq_input_scale_missing": ("int8_sq", lambda q, d: _resave(d, lambda t: t.pop(f"{Q}.input_scale")),
                               [f"declared int8_sq-quantized but its scales are missing: {Q}.input_scale"]),
    "sq_weight_scale_per_tensor": ("int8_sq", lambda q, d: _resave(d, lambda t: t.update(
        {f"{Q}.weight_scale": torch.ones(())})), ["scale shape [] does not fit the [256, 128] weight; int8_sq "
                                                  "needs [256]"]),
    "fp8_weight_scale_per_channel": ("fp8", lambda q, d: _resave(d, lambda t: t.update(
        {f"{Q}.weight_scale": torch.ones(256)})), ["scale shape [256] does not fit the [256, 128] weight; fp8 needs "
                                                   "[] (scalar)"]),
    "unknown_quant_algo": ("int4_awq", lambda q, d: _quant_config(d, lambda c: c.update(quant_algo="W3A5")),
                           ["hf_quant_config.json: unknown quant_algo 'W3A5'; known: FP8, INT8_SQ, MXFP8, NVFP4, "
                            "W4A16, W4A16_AWQ"]),
    "float_weights_declared_quantized": ("int4_awq", _float_under_quant_declaration,
                                         [f"tensor '{Q}.weight': declared int4_awq-quantized", "but stored as "
                                          "unpacked float F32 [256, 128]; int4_awq stores weight U8 [128, 128], "
                                          "weight_scale [256, 1], pre_quant_scale [128]"]),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_quantized_checkpoint_exit_2(case: str, quantized: Quantized, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    method, corrupt, needles = CORRUPTIONS[case]
    d = quantized.copy("qwen3_128", method, tmp_path / "ck")
    corrupt(quantized, d)
    rc, _, err, inv = inspect(capsys, d, tmp_path / "inv.json")
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    problems = [ln for ln in lines if ln.startswith("problem: ")]
    assert problems and len(problems) == len(lines) - 1, err
    for needle in needles:
        assert any(needle in ln for ln in problems), f"{needle!r} not in:\n{err}"
    assert inv["ok"] is False
