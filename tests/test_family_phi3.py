"""Phi-3 / Phi-4-mini (model_type phi3, edgellm/models/phi3.py): the fused ``qkv_proj`` and ``gate_up_proj`` reconciled
as the checkpoint stores them, partial rotary (Phi-4-mini's 0.75), longrope's short factors and attention scaling,
a sliding window: the fp32 export's greedy continuation over 16 tokens from a prompt longer than the window equal to
transformers' on ONNX Runtime, and the torch-cuda decoder's math on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from edgellm.backends.torch_cuda import weight_table
from edgellm.backends.torch_cuda.decoder import GpuDecoder, load_parameters
from edgellm.checkpoint import Checkpoint
from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.config import ModelConfig
from edgellm.errors import UnsupportedError
from edgellm.models import family_for
from edgellm.models.phi3 import Phi3
from edgellm.models.rope import length_limit, rope_parameters
from edgellm.runtime import Engine, GenerationRequest
from edgellm.synth import make_checkpoint

PROMPT = [1, 17, 300, 45, 9, 88, 123, 7, 260, 33, 5, 71, 402, 18]  # longer than the window (8)
CASES = {
    "phi4_mini_like": {**Phi3.conformance_features["partial_rotary"], **Phi3.conformance_features["sliding_window"]},
    "longrope": Phi3.conformance_features["longrope"],
}


@pytest.fixture(scope="module")
def phis(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("phi3")
    out = {}
    for name, overrides in CASES.items():
        ckpt = make_checkpoint(root / name, "phi3", **overrides)
        export_checkpoint(ckpt, root / f"onnx_{name}", "fp32")
        out[name] = (ckpt, root / f"onnx_{name}")
    return out


def test_fused_tensors_reconcile_as_stored(phis) -> None:
    ckpt, _ = phis["phi4_mini_like"]
    ck = Checkpoint.open(ckpt)
    cfg = ModelConfig.load(ckpt)
    names = family_for(cfg).expected_parameters(cfg)
    assert not ck.problems and sorted(ck.reconciliation.matched) == sorted(names)
    assert names["model.layers.0.self_attn.qkv_proj.weight"] == (128 + 2 * 64, 128)
    assert names["model.layers.0.mlp.gate_up_proj.weight"] == (2 * 256, 128)
    assert not any("q_proj" in n or "gate_proj" in n for n in names)
    assert family_for(cfg).layer_windows(cfg) == (8, 8) and rope_parameters(cfg).rotary_dim == 24


def test_greedy_past_the_window_equals_transformers_on_onnx_runtime(phis, tmp_path) -> None:
    for name, (ckpt, onnx_dir) in phis.items():
        build_engine(onnx_dir, tmp_path / name, "ort", max_batch_size=2, max_seq_len=64)
        engine = Engine.open(tmp_path / name)
        ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = ref(torch.tensor([PROMPT])).logits[0].numpy()
            want = [ref.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False)[0, len(p):].tolist()
                    for p in (PROMPT, PROMPT[:10])]
        assert np.abs(engine.logits(PROMPT) - logits).max() < 1e-4, name
        out = engine.generate([GenerationRequest(id=str(i), input_ids=p, max_new_tokens=16)
                               for i, p in enumerate((PROMPT, PROMPT[:10]))])
        assert [r.output_ids for r in out] == want, name


def test_torch_cuda_decoder_matches_transformers_on_the_cpu(phis) -> None:
    n = len(PROMPT)
    for name, (ckpt, onnx_dir) in phis.items():
        cfg = ModelConfig.load(onnx_dir)
        table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
        model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=1,
                           max_seq_len=32, device=torch.device("cpu"))
        hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        ids, pos = torch.tensor([PROMPT]), torch.arange(n)[None]
        with torch.no_grad():
            ref = hf(ids).logits[0]
            whole = model.prefill(ids, pos, 0, torch.ones(1, n, dtype=torch.bool), 0, causal_only=True)[0]
            model.prefill(ids[:, :6], pos[:, :6], 0, torch.ones(1, 6, dtype=torch.bool), 5, causal_only=True)
            steps = torch.stack([model.decode(ids[0, i:i + 1], pos[0, i:i + 1], torch.tensor([i]))[0]
                                 for i in range(6, n)])
        assert float((whole - ref).abs().max()) < 1e-4, name
        assert float((steps - ref[6:]).abs().max()) < 1e-4, name


def test_longrope_short_factors_and_its_length_limit() -> None:
    hf = transformers.Phi3Config(hidden_size=128, num_attention_heads=4, max_position_embeddings=256,
                                 original_max_position_embeddings=64, partial_rotary_factor=0.75, pad_token_id=0,
                                 rope_scaling={"rope_type": "longrope", "short_factor": [1.1] * 12,
                                               "long_factor": [3.0] * 12})
    want, want_scale = ROPE_INIT_FUNCTIONS["longrope"](hf, torch.device("cpu"))
    cfg = ModelConfig.from_dict({**hf.to_dict(), "model_type": "phi3"})
    got = rope_parameters(cfg)
    assert got.rotary_dim == 24 and torch.equal(got.inv_freq, want) and got.attention_scaling == want_scale
    assert want_scale > 1
    assert length_limit(cfg) == (64, "longrope scaling switches to long_factor past original_max_position_embeddings "
                                     "64 (not implemented: transformers' Phi-3 generation then recomputes the whole "
                                     "cache with the long factors)")


def test_a_build_past_longrope_original_length_is_refused_by_name(tmp_path) -> None:
    ckpt = make_checkpoint(tmp_path / "ck", "phi3", partial_rotary_factor=0.75, original_max_position_embeddings=64,
                           rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 12,
                                         "long_factor": [2.0] * 12})
    export_checkpoint(ckpt, tmp_path / "onnx", "fp32")
    with pytest.raises(UnsupportedError, match="max_seq_len 256: longrope scaling switches to long_factor past "
                                               "original_max_position_embeddings 64"):
        build_engine(tmp_path / "onnx", tmp_path / "engine", "ort")
    manifest = build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", max_seq_len=64)
    assert manifest["build_params"]["max_seq_len"] == 64


def test_a_quantized_phi3_checkpoint_is_refused_at_export_by_name(tmp_path) -> None:
    from edgellm.synth_quant import calibration_ids, quantize_rtn

    src = make_checkpoint(tmp_path / "ck", "phi3")
    q = quantize_rtn(src, tmp_path / "q", "int4_awq", calibration_ids(src), group_size=32)
    with pytest.raises(UnsupportedError, match=r"phi3: a quantized checkpoint's fused linears \(qkv_proj, "
                                               r"gate_up_proj\) are not exported"):
        export_checkpoint(q, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
