"""The torch decoder reads safetensors directly and matches transformers' logits."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from edgellm.config import ModelConfig
from edgellm.errors import CheckpointError, UnsupportedError
from edgellm.models import family_for
from edgellm.models.decoder import Decoder
from edgellm.weights import load_weights

ALL = ["stories", "llama", "llama_rope3", "mistral", "qwen2", "qwen3", "qwen2_tied_bf16_sharded", "llama_fp16"]


def _decoder(ckpt_dir):
    cfg = ModelConfig.load(ckpt_dir)
    family = family_for(cfg)
    return Decoder.from_weights(cfg, family, load_weights(ckpt_dir, family, cfg)), cfg


@pytest.mark.parametrize("name", ALL)
def test_logits_match_transformers_fp32(ckpts, name):
    ckpt = getattr(ckpts, name)
    model, cfg = _decoder(ckpt)
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.randint(3, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    mask, pos = torch.ones(2, 48, dtype=torch.long), torch.arange(48)[None].expand(2, 48)
    with torch.no_grad():
        expected = ref(ids).logits
        full = model(ids, mask, pos, *model.empty_past(2))
        # the same positions computed incrementally through the KV cache
        first = model(ids[:, :40], mask[:, :40], pos[:, :40], *model.empty_past(2))
        rest = model(ids[:, 40:], mask, pos[:, 40:], *first[1:])
    assert (full[0] - expected).abs().max().item() < 5e-5
    assert (rest[0] - expected[:, 40:]).abs().max().item() < 5e-5
    assert full[1].shape == (2, cfg.num_key_value_heads, 48, cfg.head_dim)


def test_missing_and_misshaped_tensors_are_named(ckpts, tmp_path):
    ckpt = ckpts.copy("llama", tmp_path / "llama")
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, ckpt / "model.safetensors")
    cfg = ModelConfig.load(ckpt)
    with pytest.raises(CheckpointError) as err:
        load_weights(ckpt, family_for(cfg), cfg)
    msg = str(err.value)
    assert "missing tensor 'model.layers.1.mlp.up_proj.weight'" in msg
    assert "'model.norm.weight' has shape [3], expected [64]" in msg


@pytest.mark.parametrize("scaling, fragment", [
    ({"rope_type": "longrope", "factor": 4.0}, "rope_scaling type 'longrope' is not implemented"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "needs positive numbers for high_freq_factor"),
])
def test_unsupported_rope_scaling_is_refused(ckpts, tmp_path, scaling, fragment):
    ckpt = ckpts.copy("llama", tmp_path / "llama")
    data = json.loads((ckpt / "config.json").read_text())
    data.pop("rope_parameters", None)
    data["rope_scaling"] = scaling
    (ckpt / "config.json").write_text(json.dumps(data))
    with pytest.raises(UnsupportedError, match=fragment):
        family_for(ModelConfig.load(ckpt))


@pytest.mark.parametrize("name", ["stories", "qwen3"])
def test_the_export_ops_eager_forward_is_the_decoder_math(ckpts, name):
    """fp32 exports trace RotaryEmbedding / GroupQueryAttention / SkipSimplifiedLayerNormalization; their eager
    forward is the same decoder math (apply_rope, grouped_attention, rms_norm): same logits and presents over a
    left-padded batch, a prefill then a step over the past."""
    plain, cfg = _decoder(getattr(ckpts, name))
    fused, _ = _decoder(getattr(ckpts, name))
    fused.use_rotary_tables(cfg.max_position_embeddings)
    fused.use_fused_attention()
    ids = torch.randint(3, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        outs = []
        for model in (plain, fused):
            first = model(ids[:, :7], mask[:, :7], pos[:, :7], *model.empty_past(2))
            outs.append((first, model(ids[:, 7:], mask, pos[:, 7:], *first[1:])))
    (a, a2), (b, b2) = outs
    assert (a[0][0] - b[0][0]).abs().max() < 1e-5 and (a[0][1, 3:] - b[0][1, 3:]).abs().max() < 1e-5  # real rows
    assert (a2[0] - b2[0]).abs().max() < 1e-5
    assert all((x[:, :, 3:] - y[:, :, 3:]).abs().max() < 1e-5 for x, y in zip(a2[1:], b2[1:], strict=True))
