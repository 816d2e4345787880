"""Reconciliation explanations (tied, ignored), index parsing rules and name patterns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgellm.checkpoint import Checkpoint, name_patterns, read_index
from edgellm.checkpoint.index import plain_file_name_problem
from edgellm.checkpoint.inventory import collapse_ranges
from tests.fixtures.checkpoints import Ckpts


def add_tensors(d: Path, extra: dict[str, torch.Tensor]) -> None:
    tensors = load_file(d / "model.safetensors")
    tensors.update(extra)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def test_tied_alias_and_ignored_buffer_are_explained(ckpts: Ckpts, tmp_path: Path) -> None:
    d = ckpts.copy("stories", tmp_path / "s")
    emb = load_file(d / "model.safetensors")["model.embed_tokens.weight"]
    inv_freq = "model.layers.0.self_attn.rotary_emb.inv_freq"
    add_tensors(d, {"lm_head.weight": emb.clone(), inv_freq: torch.ones(4)})
    ck = Checkpoint.open(d)
    assert ck.problems == []
    rec = ck.reconciliation
    assert rec.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    assert rec.ignored == {inv_freq: "rotary inv_freq buffer (recomputed from rope_theta)"}
    assert ck.parameter_count == 260032  # aliases and buffers are not parameters


def test_tied_alias_with_wrong_shape_is_a_problem(ckpts: Ckpts, tmp_path: Path) -> None:
    d = ckpts.copy("stories", tmp_path / "s")
    add_tensors(d, {"lm_head.weight": torch.zeros(512, 32)})
    msgs = [str(p) for p in Checkpoint.open(d).problems]
    assert msgs == ["model.safetensors: tensor 'lm_head.weight': tied to 'model.embed_tokens.weight' but shape "
                    "[512, 32] != [512, 64]"]


def test_fp8_declaration_over_float_weights_with_scales(ckpts: Ckpts, tmp_path: Path) -> None:
    d = ckpts.copy("stories", tmp_path / "s")
    scales = {f"model.layers.{i}.{m}.weight_scale": torch.ones(())
              for i in range(5) for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    add_tensors(d, scales)
    (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    ck = Checkpoint.open(d)
    msgs = [str(p) for p in ck.problems]
    # every linear (the tied lm_head is the embedding) is named: declared fp8 but stored as float
    assert len(msgs) == 35 and all("declared fp8-quantized" in m and "unpacked float F32" in m for m in msgs)
    assert len(ck.reconciliation.quantization_tensors) == 35


@pytest.mark.parametrize(("body", "needle"), [
    (b"{", "index is not valid UTF-8 JSON"),
    (b"[]", "index must be a JSON object, got list"),
    (b'{"metadata": {}}', "index lacks a 'weight_map' object"),
    (b'{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}',
     "tensor 'a': tensor mapped twice in weight_map (to 'x.safetensors' and 'y.safetensors')"),
    (b'{"weight_map": {"a": 3}}', "tensor 'a': weight_map value 3 must be a shard file name"),
    (b'{"weight_map": {"a": "x.bin"}}', "shard name 'x.bin' does not end in .safetensors"),
    (b'{"weight_map": {"a": "sub\\\\x.safetensors"}}', "is not a plain file name"),
])
def test_index_rules(tmp_path: Path, body: bytes, needle: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_bytes(body)
    msgs = [str(p) for p in read_index(tmp_path).problems]
    assert any(needle in m and m.startswith("model.safetensors.index.json: ") for m in msgs), msgs


@pytest.mark.parametrize("name", ["../a.safetensors", "/abs.safetensors", "..", ".", "", "a/b.safetensors",
                                  "~x.safetensors", "a\x00.safetensors"])
def test_plain_file_names(name: str) -> None:
    assert plain_file_name_problem(name)
    assert plain_file_name_problem("model-00001-of-00002.safetensors") is None


def test_name_patterns_collapse_indices(ckpts: Ckpts) -> None:
    assert collapse_ranges([5, 0, 1, 2, 7, 8]) == "0..2,5,7..8"
    ck = Checkpoint.open(ckpts.stories)
    tensors = {n: t for n, t in ck.tensors.items() if not n.startswith("model.layers.3.")}
    pats = {p["pattern"]: p for p in name_patterns(tensors)}
    assert pats["model.layers.{0..2,4}.self_attn.q_proj.weight"]["count"] == 4
    assert pats["model.norm.weight"]["count"] == 1
