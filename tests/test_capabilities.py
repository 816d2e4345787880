"""``edgellm capabilities``: one answer, asked of export and of each backend class, that the farm plans with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefarm.test_lists.capability import capability
from edgefarm.toolchains.base import Variant, driver
from edgellm.backends.base import registered_backends
from edgellm.backends.ort import OrtBackend
from edgellm.capabilities import capabilities
from edgellm.cli import main
from edgellm.types import Precision

STORIES = Path(__file__).resolve().parents[1] / "edgellm" / "assets" / "stories260K"


def test_capabilities_json_names_precisions_backends_and_why_absent(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "caps.json"
    assert main(["capabilities", "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) == capabilities()
    assert printed["export_precisions"] == ["fp32", "fp16", "bf16"]
    assert printed["export_variants"]["fp16"] == {"lm_head_precision": "fp16", "kv_cache_precision": "fp16"}
    assert printed["export_variants"]["bf16"] == {"lm_head_precision": "bf16", "kv_cache_precision": "bf16"}
    # the ORT backend also builds ModelOpt-quantized exports (issue 10); the farm plans those through quantize.
    # bf16 is exported for torch-cuda; ORT's CPU provider has no bf16 kernels, and says so
    ort = printed["backends"]["ort"]
    assert {k: ort[k] for k in ("available", "reason", "precisions")} == {
        "available": True, "reason": None, "precisions": ["fp32", "fp16", "int4_awq", "int8_sq", "fp8"]}
    assert list(ort["refused"]) == ["bf16"] and "no bf16 kernels" in ort["refused"]["bf16"]
    cuda = printed["backends"]["torch-cuda"]
    assert cuda["precisions"] == ["fp32", "fp16", "bf16"]
    assert sorted(cuda["refused"]) == ["fp8", "int4_awq", "int8_sq"]
    assert all("has no" in why and "--backend ort" in why for why in cuda["refused"].values())
    assert sorted(printed["backends"]) == ["ort", "torch-cuda"]  # what is implemented, nothing more
    assert main(["env"]) == 0
    assert json.loads(capsys.readouterr().out)["capabilities"] == printed  # `edgellm env` carries the same


class EchoOrtBackend(OrtBackend):
    """A backend defined only here (README "Extending the farm": a backend is one module): ONNX Runtime again."""

    backend = "echo-ort"


def test_a_backend_is_one_module_the_registry_names_everywhere(stories_engine, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """No hand-kept list of backends: the registry is the vocabulary. A class registered here is listed by
    capabilities, builds an engine through the CLI and runs it (the manifest names it; the runtime opens it)."""
    from edgellm.backends.base import BACKENDS, register_backend

    assert sorted(registered_backends()) == ["ort", "torch-cuda"]  # what is implemented, no stub
    register_backend(EchoOrtBackend)
    try:
        assert "echo-ort" in capabilities()["backends"]
        engine_dir = tmp_path / "engine"
        assert main(["build", str(stories_engine.onnx_dir), str(engine_dir), "--backend", "echo-ort"]) == 0
        assert json.loads((engine_dir / "engine_manifest.json").read_text())["backend"] == "echo-ort"
        requests = tmp_path / "r.json"
        requests.write_text(json.dumps({"requests": [{"id": "a", "prompt": "Once upon", "max_new_tokens": 4}]}))
        assert main(["infer", "--engine-dir", str(engine_dir), "--input-file", str(requests),
                     "--output-file", str(tmp_path / "o.json")]) == 0
        assert len(json.loads((tmp_path / "o.json").read_text())["responses"][0]["output_ids"]) == 4
    finally:
        BACKENDS.remove("echo-ort")
    capsys.readouterr()
    assert main(["build", str(stories_engine.onnx_dir), str(tmp_path / "gone"), "--backend", "echo-ort"]) == 2
    assert "unknown backend 'echo-ort'; registered: ort, torch-cuda" in capsys.readouterr().err


def test_the_backend_class_is_the_one_home_of_what_it_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OrtBackend, "precisions", (Precision.FP32,))
    assert capabilities()["backends"]["ort"]["precisions"] == ["fp32"]
    assert driver("edgellm-ort").precisions() == (Precision.FP32,)  # the farm's plan asks the same declaration
    found = capability("x86-cpu", "edgellm-ort", Variant(Precision.FP16))
    assert not found and found.reason == "toolchain edgellm-ort cannot produce fp16 (produces: fp32)"


def test_each_backend_builds_the_export_precisions_it_declares() -> None:
    """What the farm plans (buildable) is the export's precisions intersected with the backend's declaration, plus
    the quantized precisions the backend builds from the farm quantizer's checkpoints."""
    assert driver("edgellm-ort").precisions() == (Precision.FP32, Precision.FP16, Precision.INT4_AWQ,
                                                  Precision.INT8_SQ, Precision.FP8)
    assert driver("edgellm-torch-cuda").precisions() == (Precision.FP32, Precision.FP16, Precision.BF16)
    found = capability("x86-h200", "edgellm-torch-cuda", Variant(Precision.FP8))
    assert not found and "toolchain edgellm-torch-cuda cannot produce fp8" in found.reason


def test_export_refuses_an_lm_head_it_cannot_make_before_reading_anything(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", str(STORIES), str(tmp_path / "onnx"), "--precision", "fp16", "--lm-head-precision", "fp32"])
    assert code == 2
    err = capsys.readouterr().err
    assert "LM-head precision 'fp32' is not supported by export at fp16; supported: fp16" in err
    assert main(["export", str(STORIES), str(tmp_path / "onnx"), "--kv-cache-precision", "int3"]) == 2
    assert "unknown KV-cache precision 'int3'; valid: fp32, fp16, bf16, fp8, int8, nvfp4" in capsys.readouterr().err
    assert not (tmp_path / "onnx").exists()
