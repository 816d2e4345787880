"""A model family is one module: a family defined in this test module alone is registered, gets a synthetic
checkpoint from the tiny config on its class, exports, builds and runs (nothing else edited)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.models.base import ARCHITECTURES, FAMILIES, ModelFamily, family_named, register_family
from edgellm.runtime import Engine
from edgellm.synth import make_checkpoint


class Ministral(ModelFamily):
    """transformers' Ministral: the Llama layout; with full-attention layers and a window as long as the
    context, every position attends to every earlier one (the runtime implements full attention)."""

    name = "ministral"
    model_types = ("ministral",)
    architectures = ("MinistralForCausalLM",)
    hf_config = "MinistralConfig"
    tiny_config: ClassVar[dict[str, Any]] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=256, sliding_window=256, head_dim=16,
        layer_types=["full_attention"] * 2)


@pytest.fixture
def ministral(monkeypatch: pytest.MonkeyPatch) -> type[ModelFamily]:
    """Register the family above for this test only (other tests see the shipped families)."""
    family_named("llama")  # the shipped families are discovered first
    for registry in (FAMILIES, ARCHITECTURES):
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    return register_family(Ministral)


def test_a_family_defined_in_one_module_is_exported_built_and_run(ministral: type[ModelFamily],
                                                                  tmp_path: Path) -> None:
    import torch
    import transformers

    assert family_named("ministral") is ministral
    ckpt = make_checkpoint(tmp_path / "ckpt", "ministral", seed=3)
    manifest = export_checkpoint(ckpt, tmp_path / "onnx", "fp32")
    assert manifest["model"]["family"] == "ministral"
    build_engine(tmp_path / "onnx", tmp_path / "engine", max_batch_size=1, max_input_len=16, max_seq_len=32)
    engine = Engine.open(tmp_path / "engine")
    ids = engine.encode("Once upon a time")
    ours = engine.logits(ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - theirs).max() < 1e-3  # the same model, not just a graph that runs
