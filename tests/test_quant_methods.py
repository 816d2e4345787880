"""A quantization method is one module (edgellm/quant): the vocabulary, the checkpoint reader, export, the backends
and the thresholds all ask the registry. A toy method defined in this file, and registered from outside edgellm/quant,
is named by ``Precision``, read from its checkpoint, listed by ``edgellm capabilities``, exported, built and run by
ONNX Runtime, and has default thresholds: nothing else in edgellm names it.

This module imports no ``edgellm.types`` at its top (a subprocess imports it to register the toy method before the
vocabulary is built).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from edgellm.errors import BugError
from edgellm.quant.base import GemmKind, QuantizationMethod, Scale, StoredFormat, register_method

REPO = Path(__file__).resolve().parents[1]
BLOCK = 32


class ToyW8(QuantizationMethod):
    """int8 weights, one scale per 32 inputs, float activations: ONNX Runtime's MatMulNBits with 8 bits."""

    name = "toy_w8"
    order = 1000
    modelopt_algos = ("TOY_W8",)
    stored = StoredFormat(("I8",), lambda o, i: (o, i),
                          {"weight_scale": Scale(lambda o, i, g: (o, math.ceil(i / BLOCK)))})
    gemm = GemmKind.INT8
    thresholds: ClassVar[dict[str, float]] = {"ppl_max_rel_diff": 0.02, "top1_min_agreement": 0.5}

    @classmethod
    def ort_linear(cls, layer: Any, tensors: Mapping[str, Any], layout: Any) -> Any:
        import torch

        from edgellm.compiler.quantized import MatMulNBits, QuantLinear, param

        class ToyLinear(QuantLinear):
            def __init__(self) -> None:
                super().__init__(layer, tensors)
                q = tensors["weight"].to(torch.int16) + 128  # [N, K], K a multiple of BLOCK here
                self.qweight = param(q.to(torch.uint8).reshape(self.out_features, -1, BLOCK).contiguous())
                self.scales = param(tensors["weight_scale"].float().reshape(-1).contiguous())

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self._bias(MatMulNBits.apply(x, self.qweight, self.scales, self.in_features,
                                                    self.out_features, BLOCK, 8))

        return ToyLinear()


def make_toy_checkpoint(src: Path, out: Path) -> Path:
    """``src`` (a float checkpoint) with every linear but the LM head stored the toy way."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if name.endswith("_proj.weight"):
            w = t.float().reshape(t.shape[0], -1, BLOCK)
            scale = (w.abs().amax(dim=2) / 127).clamp_min(1e-12)  # [out, in / BLOCK]
            q = torch.clamp(torch.round(w / scale[..., None]), -127, 127).to(torch.int8).reshape(t.shape)
            tensors[name], tensors[name.replace(".weight", ".weight_scale")] = q, scale.contiguous()
        else:
            tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    quant = {"quant_algo": "TOY_W8", "exclude_modules": ["lm_head", "model.embed_tokens"]}
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "toy"}, "quantization": quant}))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out / name)
    return out


def test_the_vocabulary_and_every_table_derive_from_the_method_modules() -> None:
    from edgellm.backends.ort import OrtBackend
    from edgellm.backends.torch_cuda import TorchCudaBackend
    from edgellm.checkpoint.reconcile import quant_suffixes
    from edgellm.compiler.export import quantized_export_precisions
    from edgellm.config import HF_QUANT_METHODS, MODELOPT_ALGOS
    from edgellm.quant import exported, methods
    from edgellm.thresholds import DEFAULTS
    from edgellm.types import UNQUANTIZED, Precision, QuantMethod

    names = [m.name for m in methods()]
    assert [p.value for p in Precision if p not in UNQUANTIZED] == names == [m.value for m in QuantMethod][1:]
    assert [p.value for p in UNQUANTIZED | {Precision.FP32}] and QuantMethod.NONE.value == "none"
    assert Precision.INT4_AWQ.value == "int4_awq" and Precision.parse("FP8") is Precision.FP8
    assert {a: QuantMethod(m.name) for m in methods() for a in m.modelopt_algos} == MODELOPT_ALGOS
    assert set(HF_QUANT_METHODS) == {k for m in methods() for k in m.hf_quant_methods}
    lowered = [Precision(m.name) for m in exported()]
    assert list(quantized_export_precisions()) == lowered == [Precision.INT4_AWQ, Precision.INT8_SQ, Precision.FP8]
    assert OrtBackend.precisions == (Precision.FP32, Precision.FP16, *lowered)
    assert list(TorchCudaBackend.refused) == lowered
    assert {p for p in DEFAULTS if p not in UNQUANTIZED} == {Precision(m.name) for m in methods() if m.thresholds}
    assert {f".{s}" for m in methods() if m.stored for s in m.stored.scales} <= set(quant_suffixes())
    # one module, one method: each module of edgellm/quant but base registers exactly one class, defined there
    modules = sorted(p.stem for p in (REPO / "edgellm" / "quant").glob("*.py") if p.stem not in ("__init__", "base"))
    assert sorted(m.__module__.rpartition(".")[2] for m in methods()) == modules


def test_registering_after_the_vocabulary_is_built_is_a_bug() -> None:
    import edgellm.types  # noqa: F401 - builds the vocabulary

    with pytest.raises(BugError, match=r"'toy_w8' registered after edgellm\.types built the vocabulary"):
        register_method(ToyW8)

    class NoGemm(ToyW8):
        gemm = None

    with pytest.raises(BugError, match="set gemm exactly when ort_linear is implemented"):
        register_method(NoGemm)


TOY_RUN = """
import json, sys
from pathlib import Path
from edgellm.quant.base import register_method
from tests.test_quant_methods import ToyW8, make_toy_checkpoint
register_method(ToyW8)  # before anything builds the vocabulary

import numpy as np
import torch
from edgellm.cli import main
from edgellm.config import ModelConfig, QuantConfig
from edgellm.models import family_for
from edgellm.models.decoder import Decoder
from edgellm.runtime import Engine
from edgellm.thresholds import resolve_thresholds
from edgellm.types import Precision, QuantMethod
from edgellm.weights import load_weights

src, work = Path(sys.argv[1]), Path(sys.argv[2])
ckpt = make_toy_checkpoint(src, work / "toy")
out = {"vocabulary": [p.value for p in Precision], "parsed": Precision.parse("TOY_W8").value,
       "quant_method": QuantMethod.TOY_W8.value,
       "from_modelopt": QuantConfig.from_modelopt({"quantization": {"quant_algo": "TOY_W8"}}, source="s").method.value,
       "thresholds": resolve_thresholds(Precision.TOY_W8).enabled()}
out["inspect_rc"] = main(["inspect", str(ckpt)])
out["capabilities_rc"] = main(["capabilities", "--output", str(work / "caps.json")])
out["export_rc"] = main(["export", str(ckpt), str(work / "onnx")])
out["build_rc"] = main(["build", str(work / "onnx"), str(work / "engine"), "--max-seq-len", "64"])
out["cuda_build_rc"] = main(["build", str(work / "onnx"), str(work / "cuda"), "--backend", "torch-cuda"])
engine = Engine.open(work / "engine")
ids = [1, 5, 9, 33, 70, 100, 4, 8, 200, 13]
got = engine.logits(ids)
cfg = ModelConfig.load(src)
ref = Decoder.from_weights(cfg, family_for(cfg), load_weights(src, family_for(cfg), cfg))
with torch.no_grad():
    want = ref(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), torch.arange(len(ids))[None],
               *ref.empty_past(1))[0][0].numpy()
cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
out["min_cosine"], out["max_abs_diff"] = float(cos.min()), float(np.abs(got - want).max())
print("TOY " + json.dumps(out))
"""


def test_a_toy_method_defined_here_is_named_read_listed_exported_built_and_run(tmp_path: Path) -> None:
    from edgellm.synth import make_checkpoint

    src = make_checkpoint(tmp_path / "src", "qwen3")  # every linear width a multiple of 32
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", TOY_RUN, str(src), str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("TOY ")), None)
    assert done.returncode == 0 and line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(line[4:])
    assert out["vocabulary"][-1] == out["parsed"] == out["quant_method"] == out["from_modelopt"] == "toy_w8"
    assert out["thresholds"] == {"ppl_max_rel_diff": 0.02, "top1_min_agreement": 0.5, "tokenizer_match": True}
    assert (out["inspect_rc"], out["capabilities_rc"], out["export_rc"], out["build_rc"]) == (0, 0, 0, 0)
    caps = json.loads((tmp_path / "caps.json").read_text())
    # ONNX Runtime lists it by its GEMM kind: with int8_sq
    assert caps["backends"]["ort"]["precisions"] == ["fp32", "fp16", "int4_awq", "int8_sq", "toy_w8", "fp8"]
    assert "no int8 GEMM" in caps["backends"]["torch-cuda"]["refused"]["toy_w8"]
    assert out["cuda_build_rc"] == 2  # refused by the backend's declaration, with the method's reason
    export = json.loads((tmp_path / "onnx" / "export_manifest.json").read_text())
    engine = json.loads((tmp_path / "engine" / "engine_manifest.json").read_text())
    assert export["precision"] == engine["precision"] == "toy_w8"
    assert export["quantization"]["quantized_gemms"] == engine["graph"]["quantized_gemms"] == {"int8": 14}
    assert out["min_cosine"] > 0.999 and out["max_abs_diff"] < 0.05, out
