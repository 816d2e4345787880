"""``edgellm capabilities``: one answer, asked of export and of each backend class, that the farm plans with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgellm.backends.ort import OrtBackend
from edgellm.capabilities import capabilities
from edgellm.cli import main
from edgellm.types import Precision
from toolchains.base import require

STORIES = Path(__file__).resolve().parents[1] / "edgellm" / "assets" / "stories260K"


def test_capabilities_json_names_precisions_backends_and_why_absent(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "caps.json"
    assert main(["capabilities", "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) == capabilities()
    assert printed["export_precisions"] == ["fp32", "fp16"]
    assert printed["export_variants"]["fp16"] == {"lm_head_precision": "fp16", "kv_cache_precision": "fp16"}
    ort = printed["backends"]["ort"]
    assert (ort["available"], ort["reason"]) == (True, None)
    assert ort["precisions"] == [p.value for p in OrtBackend.precisions]  # the class's own declaration
    assert {"fp32", "fp16"} <= set(ort["precisions"])
    trt = printed["backends"]["tensorrt"]
    assert trt["available"] is False and "TensorRT" in trt["reason"] and trt["precisions"] == []
    assert main(["env"]) == 0
    assert json.loads(capsys.readouterr().out)["capabilities"] == printed  # `edgellm env` carries the same


def test_the_backend_class_is_the_one_home_of_what_it_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OrtBackend, "precisions", (Precision.FP32,))
    assert capabilities()["backends"]["ort"]["precisions"] == ["fp32"]
    assert require("edgellm-ort").precisions() == (Precision.FP32,)  # the farm's plan asks the same declaration
    ok, why = require("edgellm-ort").accepts(Precision.FP16)
    assert not ok and why == "toolchain edgellm-ort cannot produce fp16 yet (produces: fp32)"


def test_export_refuses_an_lm_head_it_cannot_make_before_reading_anything(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", str(STORIES), str(tmp_path / "onnx"), "--precision", "fp16", "--lm-head-precision", "fp32"])
    assert code == 2
    err = capsys.readouterr().err
    assert "LM-head precision 'fp32' is not supported by export at fp16; supported: fp16" in err
    assert main(["export", str(STORIES), str(tmp_path / "onnx"), "--kv-cache-precision", "int3"]) == 2
    assert "unknown KV-cache precision 'int3'; valid: fp32, fp16, bf16, fp8, int8, nvfp4" in capsys.readouterr().err
    assert not (tmp_path / "onnx").exists()
