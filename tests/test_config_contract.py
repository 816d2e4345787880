"""The config contract (edgellm.models.contract): every config field that changes the maths is implemented by the
family or refused by name at inspect and export; sliding windows are implemented for every family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgellm.cli import main
from edgellm.models.base import registered_families
from edgellm.models.contract import MATH_FIELDS, SLIDING_FIELDS
from edgellm.synth import make_checkpoint

# A value that turns each field on (what published configs hold: Gemma-2's soft-caps, Phi-4-mini's partial rotary
# factor, Granite's multipliers, Gemma-3's layer types, SmolLM3's no-RoPE layers, Llama-4's qk norm).
ACTIVE = {
    "partial_rotary_factor": 0.75,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "query_pre_attn_scalar": 256,
    "attention_multiplier": 0.015625,
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "logits_scaling": 8.0,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window_pattern": 6,
    "use_sliding_window": True,
    "no_rope_layers": [1, 0],
    "use_qk_norm": True,
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("contract") / "llama", "llama")


def _with(src: Path, dest: Path, **keys: object) -> Path:
    dest.mkdir()
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(keys)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_every_math_field_has_an_active_value_here() -> None:
    assert sorted(ACTIVE) == sorted(f.key for f in MATH_FIELDS)


@pytest.mark.parametrize("key", [f.key for f in MATH_FIELDS if f.key not in SLIDING_FIELDS])
def test_a_field_the_family_does_not_implement_is_refused_by_name(llama, tmp_path, capsys, key) -> None:
    family = next(f for f in registered_families() if f.name == "llama")
    assert key not in family.implements  # when llama implements it, this case moves to the conformance matrix
    ckpt = _with(llama, tmp_path / "ck", **{key: ACTIVE[key]})
    assert main(["inspect", str(ckpt)]) == 2
    out = capsys.readouterr()
    assert f"{key} = {ACTIVE[key]!r}" in out.out + out.err and "not implemented" in out.out + out.err
    assert main(["export", str(ckpt), str(tmp_path / "onnx")]) == 2
    assert f"{key} = {ACTIVE[key]!r}" in capsys.readouterr().err
    assert not (tmp_path / "onnx").exists()


@pytest.mark.parametrize("key", ["partial_rotary_factor"])
def test_the_same_field_inside_rope_parameters_is_refused_too(llama, tmp_path, capsys, key) -> None:
    ckpt = _with(llama, tmp_path / "ck", rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          key: ACTIVE[key]})
    assert main(["inspect", str(ckpt)]) == 2
    out = capsys.readouterr()
    assert f"{key} = {ACTIVE[key]!r}" in out.out + out.err


@pytest.mark.parametrize("keys", [{"partial_rotary_factor": 1.0}, {"attention_multiplier": 1},
                                  {"layer_types": ["full_attention", "full_attention"]},
                                  {"use_sliding_window": False, "sliding_window": 4}])
def test_fields_at_their_neutral_value_change_nothing(llama, tmp_path, capsys, keys) -> None:
    ckpt = _with(llama, tmp_path / "ck", **keys)
    assert main(["inspect", str(ckpt)]) == 0
    assert "finding" not in capsys.readouterr().out


def test_a_window_shorter_than_the_context_is_implemented_not_a_finding(tmp_path, capsys) -> None:
    ckpt = make_checkpoint(tmp_path / "q", "qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    out = tmp_path / "inv.json"
    assert main(["inspect", str(ckpt), "--output", str(out)]) == 0
    inventory = json.loads(out.read_text())
    assert inventory["ok"] and inventory["findings"] == []
    assert main(["export", str(ckpt), str(tmp_path / "onnx")]) == 0
    assert main(["build", str(tmp_path / "onnx"), str(tmp_path / "engine"), "--max-seq-len", "64"]) == 0
