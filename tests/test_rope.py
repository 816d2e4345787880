"""RoPE scaling types (edgellm.models.rope) against transformers' own computation (modeling_rope_utils), and a
scaled checkpoint's fp32 export against transformers on ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.config import ModelConfig
from edgellm.models import family_for
from edgellm.models.rope import rope_parameters
from edgellm.runtime import Engine, GenerationRequest
from edgellm.synth import make_checkpoint

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_betas": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16,
                   "beta_slow": 2, "attention_factor": 1.3},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def _hf(rope_scaling: dict[str, object], **extra: object) -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                                    rope_scaling=rope_scaling, **extra)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_inv_freq_and_attention_scaling_equal_transformers(name: str) -> None:
    hf = _hf(dict(SCALINGS[name]))
    want, want_scale = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](hf, torch.device("cpu"))
    got = rope_parameters(ModelConfig.from_dict({**hf.to_dict(), "model_type": "llama"}))
    assert torch.equal(got.inv_freq, want.float()) and got.attention_scaling == pytest.approx(want_scale, abs=0)


@pytest.mark.parametrize("name", ["linear", "dynamic", "yarn"])
def test_scaled_llama_greedy_equals_transformers_on_onnx_runtime(tmp_path, name: str) -> None:
    ckpt = make_checkpoint(tmp_path / "ck", "llama", rope_scaling=dict(SCALINGS[name]))
    assert family_for(ModelConfig.load(ckpt)).name == "llama"
    export_checkpoint(ckpt, tmp_path / "onnx", "fp32")
    build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", max_batch_size=1, max_seq_len=128)
    engine = Engine.open(tmp_path / "engine")
    ids = [1, 40, 200, 7, 91, 3, 350, 12, 66, 8]
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].numpy()
        greedy = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    assert np.abs(engine.logits(ids) - logits).max() < 1e-4
    assert engine.generate([GenerationRequest(id="g", input_ids=ids, max_new_tokens=16)])[0].output_ids == greedy
