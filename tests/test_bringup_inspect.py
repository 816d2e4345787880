"""Bring-up rungs 1 and 2 (issue 21): a family-free inventory (``edgellm inspect`` on any model_type, "no registered
family" a finding unless ``--require-family``) and the closest family (``edgellm closest``, ``inspect --closest``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from edgellm.checkpoint.closest import ALIAS, NEW_STRUCTURE, VARIANT, closest_family
from edgellm.cli import main
from tests.fixtures.checkpoints import Ckpts
from tests.helpers.foreign import make_olmo2
from tests.st_helpers import set_field

REGISTERED = "registered: gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3"
Q1 = "model.layers.1.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_olmo2(tmp_path_factory.mktemp("olmo2") / "ck")


def _inspect(capsys: pytest.CaptureFixture[str], ckpt: Path, out: Path, *flags: str) -> tuple[int, str, str, Any]:
    rc = main(["inspect", str(ckpt), "--output", str(out), *flags])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, json.loads(out.read_text())


def _edit_config(d: Path, **keys: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(keys)
    (d / "config.json").write_text(json.dumps(cfg))


def test_unregistered_family_is_inventoried_with_a_finding(foreign: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err, inv = _inspect(capsys, foreign, tmp_path / "inv.json")
    assert (rc, err) == (0, ""), err
    assert inv["ok"] is True and inv["problems"] == [] and inv["family"] is None and inv["reconciliation"] is None
    assert [f["kind"] for f in inv["findings"]] == ["no_registered_family"]
    assert "unknown model_type 'olmo2'" in inv["findings"][0]["message"]
    assert REGISTERED in inv["findings"][0]["message"]
    stored = load_file(foreign / "model.safetensors")
    assert inv["tensor_count"] == len(stored) and inv["parameters"] == sum(t.numel() for t in stored.values())
    assert inv["dtypes"] == {"F32": {"tensors": len(stored), "parameters": inv["parameters"],
                                     "bytes": sum(t.numel() * 4 for t in stored.values())}}
    patterns = {p["pattern"]: p for p in inv["patterns"]}
    assert patterns["model.layers.{0}.post_feedforward_layernorm.weight"]["shapes"] == [[64]]
    assert patterns["model.layers.{0}.self_attn.q_norm.weight"]["shapes"] == [[64]]  # the whole projection
    assert inv["shards"] == [{"file": "model.safetensors", "readable": True, "tensors": len(stored),
                              "header_bytes": inv["shards"][0]["header_bytes"],
                              "file_bytes": (foreign / "model.safetensors").stat().st_size}]
    assert inv["config"]["model_type"] == "olmo2" and inv["config"]["head_dim"] == 16
    assert inv["quantization"]["method"] == "none" and inv["quantization"]["is_quantized"] is False
    assert "finding: no_registered_family: unknown model_type 'olmo2'" in out
    assert "status      OK, 1 finding(s)" in out


def test_require_family_makes_it_an_error(foreign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err, inv = _inspect(capsys, foreign, tmp_path / "inv.json", "--require-family")
    assert rc == 2
    assert f"problem: unknown model_type 'olmo2'; {REGISTERED} (--require-family)" in err
    assert inv["ok"] is False and inv["findings"][0]["kind"] == "no_registered_family"
    assert inv["tensor_count"] == 14  # the inventory is still whole


def test_registered_family_with_require_family_still_passes(ckpts: Ckpts, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err, inv = _inspect(capsys, ckpts.qwen3, tmp_path / "inv.json", "--require-family")
    assert (rc, err) == (0, "") and inv["family"] == "qwen3" and inv["findings"] == []


def test_family_free_inventory_reports_the_quantization_block(foreign: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = shutil.copytree(foreign, tmp_path / "q")
    (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    rc, _, _, inv = _inspect(capsys, d, tmp_path / "a.json")
    q = inv["quantization"]
    assert rc == 0 and (q["method"], q["kv_cache"], q["exclude_modules"], q["producer"]) == (
        "fp8", "fp8", ["lm_head"], "modelopt") and q["source"].endswith("hf_quant_config.json")
    (d / "hf_quant_config.json").unlink()
    _edit_config(d, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    rc, _, _, inv = _inspect(capsys, d, tmp_path / "b.json")
    assert rc == 0 and (inv["quantization"]["method"], inv["quantization"]["group_size"]) == ("int4_gptq", 128)
    _edit_config(d, quantization_config={"quant_method": "bitsy", "bits": 3})
    rc, _, err, _ = _inspect(capsys, d, tmp_path / "c.json")
    assert rc == 2 and "unknown quantization_config quant_method='bitsy' bits=3; known: " in err


def test_family_free_inventory_keeps_the_header_hardening(foreign: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    d = shutil.copytree(foreign, tmp_path / "bad")
    name = "model.layers.0.self_attn.q_proj.weight"
    set_field(d / "model.safetensors", name, "dtype", "F12")
    rc, _, err, inv = _inspect(capsys, d, tmp_path / "inv.json")
    assert rc == 2
    assert f"problem: model.safetensors: tensor '{name}': unknown dtype 'F12'; known: " in err
    assert inv["ok"] is False and inv["findings"][0]["kind"] == "no_registered_family"
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    rc, _, err, inv = _inspect(capsys, d, tmp_path / "inv2.json")
    assert rc == 2 and "found pytorch_model.bin: only safetensors is supported" in err and inv["ok"] is False


def test_family_free_inventory_keeps_the_index_hardening(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = make_olmo2(tmp_path / "sharded", max_shard_size="100KB")
    rc, _, err, inv = _inspect(capsys, d, tmp_path / "ok.json")
    assert (rc, err) == (0, "") and inv["sharded"] is True and len(inv["shards"]) > 1 and inv["tensor_count"] == 14
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name = "model.norm.weight"
    index["weight_map"][name] = "../" + index["weight_map"][name]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    rc, _, err, inv = _inspect(capsys, d, tmp_path / "bad.json")
    assert rc == 2 and f"tensor '{name}': shard name '../model-0000" in err
    assert "is not a plain file name inside the checkpoint directory" in err and inv["family"] is None


def test_a_config_edgellm_cannot_read_is_a_finding_too(foreign: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    d = shutil.copytree(foreign, tmp_path / "gpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"] = cfg.pop("hidden_size")
    cfg["model_type"] = "gpt9"
    (d / "config.json").write_text(json.dumps(cfg))
    rc, _, err, inv = _inspect(capsys, d, tmp_path / "inv.json")
    assert (rc, err) == (0, "")
    assert [f["kind"] for f in inv["findings"]] == ["no_registered_family", "config_not_read"]
    assert "missing required key 'hidden_size'" in inv["findings"][1]["message"]
    assert inv["config"] is None and inv["config_json"]["n_embd"] == 64 and inv["tensor_count"] == 14
    res = closest_family(d)
    assert res["classification"] == NEW_STRUCTURE and "missing required key 'hidden_size'" in res["config_problem"]
    assert "n_embd" in res["deciding"]
    assert any(x.startswith("config refused: ") and "hidden_size" in x for x in res["deciding"])
    (d / "config.json").write_text("{")
    rc, _, err, _ = _inspect(capsys, d, tmp_path / "inv2.json")
    assert rc == 2 and "config.json is not valid JSON" in err


# --- closest family ----------------------------------------------------------------------------------------------
def test_olmo2_is_a_new_structure_closest_to_llama(foreign: Path) -> None:
    res = closest_family(foreign)
    assert (res["family"], res["classification"], res["registered"]) == ("llama", NEW_STRUCTURE, False)
    assert res["deciding"] == ["missing tensor model.layers.{i}.input_layernorm.weight",
                               "unexpected tensor model.layers.{i}.post_feedforward_layernorm.weight",
                               "unexpected tensor model.layers.{i}.self_attn.k_norm.weight",
                               "unexpected tensor model.layers.{i}.self_attn.q_norm.weight"]
    by = {c["family"]: c for c in res["candidates"]}
    assert set(by) == {"gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3"}
    assert "wrong-shape tensor model.layers.{i}.self_attn.q_norm.weight" in by["qwen3"]["deciding"]
    assert "missing tensor model.layers.{i}.self_attn.q_proj.bias" in by["qwen2"]["deciding"]


@pytest.mark.parametrize("name,family", [("stories", "llama"), ("llama", "llama"), ("mistral", "mistral"),
                                         ("qwen2", "qwen2"), ("qwen3", "qwen3")])
def test_a_registered_checkpoint_is_a_variant_of_its_own_family(name: str, family: str, ckpts: Ckpts) -> None:
    res = closest_family(getattr(ckpts, name))
    assert (res["family"], res["classification"], res["registered"]) == (family, VARIANT, True)
    assert "hidden_size" in res["deciding"]  # tiny, unlike the family's known config
    own = res["candidates"][0]
    assert own["names"] == [] and own["unread_fields"] == {} and own["tensors"] == {
        "missing": [], "unexpected": [], "shape_mismatches": []}
    hidden = next(h for h in own["hyperparameters"] if h["field"] == "hidden_size")
    assert hidden["checkpoint"] == 64 and hidden["family"] > 64


def test_a_renamed_model_type_is_an_alias(ckpts: Ckpts, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ckpts.copy("llama", tmp_path / "ck")
    _edit_config(d, model_type="llama_custom", architectures=["LlamaCustomForCausalLM"])
    res = closest_family(d)
    assert (res["family"], res["classification"], res["deciding"]) == ("llama", ALIAS, ["model_type",
                                                                                        "architectures"])
    assert res["candidates"][0]["names"][0] == {"field": "model_type", "checkpoint": "llama_custom",
                                                "family": ["llama"]}
    rc, out, err, inv = _inspect(capsys, d, tmp_path / "inv.json", "--closest")
    assert (rc, err) == (0, "") and inv["closest_family"]["classification"] == ALIAS
    assert "closest     llama: alias (deciding: model_type, architectures)" in out


def test_a_renamed_tensor_is_caught_by_reconciliation(ckpts: Ckpts, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    d = ckpts.copy("llama", tmp_path / "ck")
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.1.self_attn.query.weight"] = tensors.pop(Q1)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    rc, _, err, inv = _inspect(capsys, d, tmp_path / "inv.json", "--closest")
    assert rc == 2
    assert f"problem: tensor '{Q1}': missing: family llama needs it with shape [64, 64]" in err
    assert "problem: model.safetensors: tensor 'model.layers.1.self_attn.query.weight': unexplained tensor" in err
    res = inv["closest_family"]
    assert (res["family"], res["classification"]) == ("llama", NEW_STRUCTURE)
    assert res["deciding"] == ["missing tensor model.layers.{i}.self_attn.q_proj.weight",
                               "unexpected tensor model.layers.{i}.self_attn.query.weight"]


def test_a_config_a_family_refuses_decides_new_structure(ckpts: Ckpts, tmp_path: Path) -> None:
    d = ckpts.copy("llama", tmp_path / "ck")
    _edit_config(d, hidden_act="gelu")
    own = next(c for c in closest_family(d)["candidates"] if c["family"] == "llama")
    assert own["classification"] == NEW_STRUCTURE
    assert own["deciding"] == ["config refused: llama: hidden_act 'gelu' is not implemented; supported: silu"]


def test_closest_cli_json_and_bad_input(foreign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["closest", str(foreign), "--output", str(tmp_path / "c.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "c.json").read_text())
    assert printed["schema"] == "edgellm.closest/1" and printed["classification"] == NEW_STRUCTURE
    assert main(["closest", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'}: checkpoint directory not found" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "olmo2"}))
    assert main(["closest", str(empty)]) == 2
    assert "no model.safetensors or model.safetensors.index.json" in capsys.readouterr().err


