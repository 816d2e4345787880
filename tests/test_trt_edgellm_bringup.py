"""Bring-up rungs 3 and 4 against NVIDIA's real tensorrt-edgellm 0.11.0 (its own environment, never imported here):
the registry check (registered, default-fallback accepted only for a family declared layout-identical, unsupported)
and the reconciliation of a checkpoint with the toolchain's own model built on the meta device; the few-layer export
(``--num-decoder-layer``) checked structurally; the same checks of our own toolchain through edgellm.

Each probe of the toolchain's environment takes 10-20 s on 2 cores (importing torch and the toolchain).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from edgefarm.toolchains.base import NotOffered, RegistryStatus, driver
from edgefarm.toolchains.parts import HostStages
from edgefarm.toolchains.tensorrt_edgellm.layouts import DEFAULT_MODEL, LAYOUT_IDENTICAL_FAMILIES
from edgellm.errors import CheckpointError, ConfigurationError
from edgellm.synth import make_checkpoint
from tests.helpers.toolchain_env import link_real_toolchain

TRT = "tensorrt-edgellm"
RENAMED = ("model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.upp_proj.weight")
NARROWED = "model.layers.0.self_attn.o_proj.weight"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def trt(trt_env: Path, tmp_path_factory: pytest.TempPathFactory) -> HostStages:
    """The farm's tensorrt-edgellm driver's host stages (its bring-up checks) over a data dir that holds the real
    0.11.0 environment."""
    data_dir = tmp_path_factory.mktemp("bringup-data")
    link_real_toolchain(data_dir, trt_env)
    return driver(TRT, data_dir).host()


def _edit_config(ckpt: Path, **changes: object) -> Path:
    path = ckpt / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return ckpt


def _renamed(src: Path, dest: Path) -> Path:
    """A copy with one tensor renamed (up_proj -> upp_proj) and one narrowed (o_proj's input half gone)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    tensors = load_file(dest / "model.safetensors")
    tensors[RENAMED[1]] = tensors.pop(RENAMED[0])
    tensors[NARROWED] = tensors[NARROWED][:, :32].contiguous()
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def _foreign(src: Path, dest: Path) -> Path:
    """Llama's tensors under a model_type no registry of ours or NVIDIA's knows."""
    shutil.copytree(src, dest)
    return _edit_config(dest, model_type="mollama", architectures=["MollamaForCausalLM"])


def test_qwen3_falls_back_to_the_declared_default_model_and_reconciles_cleanly(trt: HostStages, ckpts) -> None:
    check = trt.registry_check(ckpts.qwen3)
    # 0.11.0 registers no class of its own for qwen3: its default model takes it, as declared in layouts.py
    assert check.status is RegistryStatus.DEFAULT_FALLBACK and check.ok and check.problem is None
    assert check.model_class == check.default_class == DEFAULT_MODEL and check.layout_family == "qwen3"
    found = check.to_json()
    assert found["toolchain_version"] == "0.11.0" and found["status"] == "default-fallback" and found["ok"]
    assert found["architectures"] == ["Qwen3ForCausalLM"] and found["model_type"] == "qwen3"

    rec = trt.reconcile(ckpts.qwen3)
    assert rec.ok, rec.problems
    assert rec.model == DEFAULT_MODEL and rec.expected == rec.matched == 25  # 2 layers x 11 (q/k norms) + 3
    assert rec.missing == {} and rec.unexpected == () and rec.shape_mismatches == ()
    assert set(rec.to_json()) == {"toolchain", "toolchain_version", "model", "expected", "matched", "missing",
                                  "unexpected", "shape_mismatches", "tied", "ignored", "defaulted", "problems",
                                  "ok"}


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2_tied_bf16_sharded"])
def test_every_declared_family_reconciles_cleanly_with_the_default_model(trt: HostStages, ckpts,
                                                                        name: str) -> None:
    """The evidence behind layouts.LAYOUT_IDENTICAL_FAMILIES (qwen3: the test above)."""
    rec = trt.reconcile(getattr(ckpts, name))
    assert rec.ok, rec.problems
    assert rec.model == DEFAULT_MODEL and rec.matched == rec.expected > 0
    if name == "qwen2_tied_bf16_sharded":  # q/k/v biases fill the bias slots; the head is the embedding's
        assert rec.tied == {"lm_head.weight": "model.embed_tokens.weight"}
        assert "model.layers.0.self_attn.q_proj.bias" not in rec.missing
    assert {"llama", "mistral", "qwen2", "qwen3"} == LAYOUT_IDENTICAL_FAMILIES


def test_a_modelopt_int8_sq_checkpoint_reconciles_with_its_quantized_linears(trt: HostStages, ckpts,
                                                                             tmp_path: Path) -> None:
    """Per-tensor scales are stored as scalars ([]) and declared [1] by the toolchain's linears: the same to it.
    (The real quantizer's fp8, nvfp4, int4_awq and int8_sq checkpoints of tiny-qwen3-128 reconcile cleanly too.)"""
    from edgellm.synth_quant import quantize_rtn

    quantized = quantize_rtn(ckpts.qwen3, tmp_path / "int8_sq", "int8_sq", list(range(1, 40)), group_size=32)
    rec = trt.reconcile(quantized)
    assert rec.ok, rec.problems
    assert rec.matched == rec.expected == 25 + 14 * 3  # each linear: int8 weight, weight_scale, input_scale
    assert rec.missing == {} and rec.unexpected == ()


def test_a_model_type_only_the_default_model_would_take_stops_at_the_registry_check(trt: HostStages, ckpts,
                                                                                     tmp_path: Path) -> None:
    foreign = _foreign(ckpts.llama, tmp_path / "mollama")
    check = trt.registry_check(foreign)
    assert check.status is RegistryStatus.DEFAULT_FALLBACK and not check.ok and check.layout_family is None
    assert check.model_class == DEFAULT_MODEL
    assert "'mollama'" in check.problem and "declared: llama, mistral, qwen2, qwen3" in check.problem
    assert check.to_json()["ok"] is False
    # the weights alone would not stop it: the default model takes llama's tensors without a complaint
    assert trt.reconcile(foreign).ok


def test_a_renamed_and_a_narrowed_tensor_fail_reconciliation_naming_them(trt: HostStages, ckpts,
                                                                         tmp_path: Path) -> None:
    rec = trt.reconcile(_renamed(ckpts.qwen3, tmp_path / "renamed"))
    assert not rec.ok
    assert rec.missing == {RENAMED[0]: (128, 64)} and rec.unexpected == (RENAMED[1],)
    (mismatch,) = rec.shape_mismatches
    assert (mismatch.tensor, mismatch.expected, mismatch.found) == (NARROWED, (64, 128), (64, 32))
    text = "\n".join(rec.problems)
    assert len(rec.problems) == 3 and all(name in text for name in (*RENAMED, NARROWED))
    assert "CausalLM of tensorrt-edgellm 0.11.0" in text
    assert rec.to_json()["shape_mismatches"] == [{"name": NARROWED, "target": NARROWED, "expected": [64, 128],
                                                  "found": [64, 32]}]


def test_a_registered_model_type_is_registered_with_its_own_class(trt: HostStages, tmp_path: Path) -> None:
    import torch
    import transformers

    cfg = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                      num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp_path / "moe")
    check = trt.registry_check(tmp_path / "moe")
    assert check.status is RegistryStatus.REGISTERED and check.ok and check.layout_family is None
    assert check.model_class == "tensorrt_edgellm.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeCausalLM"


@pytest.mark.parametrize(("change", "named"), [
    ({"hidden_size": None}, "missing required key 'hidden_size'"),
    ({"num_attention_heads": "four"}, "num_attention_heads"),
])
def test_a_broken_config_is_refused_before_the_toolchain_reads_it(trt: HostStages, ckpts, tmp_path: Path,
                                                                  change: dict[str, object], named: str) -> None:
    """The toolchain's own reader would take a config without hidden_size as hidden size 4096."""
    broken = _edit_config(ckpts.copy("llama", tmp_path / "broken"), **change)
    for check in (trt.registry_check, trt.reconcile):
        with pytest.raises(ConfigurationError, match=named) as err:
            check(broken)
        assert "config.json" in str(err.value)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match=re.escape("config.json is not valid JSON")):
        trt.registry_check(broken)


def test_a_checkpoint_without_safetensors_is_refused_naming_what_is_read(trt: HostStages, ckpts,
                                                                         tmp_path: Path) -> None:
    bare = ckpts.copy("llama", tmp_path / "bare")
    (bare / "model.safetensors").rename(bare / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=re.escape("no model.safetensors or model.safetensors.index.json")):
        trt.reconcile(bare)


def test_without_its_environment_the_checks_name_the_install_command(tmp_path: Path, ckpts) -> None:
    with pytest.raises(ConfigurationError, match=re.escape("edgefarm toolchains install tensorrt-edgellm==0.11.0")):
        driver(TRT, tmp_path).host().registry_check(ckpts.qwen3)


# --- the few-layer export ---------------------------------------------------------------------------------------

def test_a_one_layer_export_of_a_two_layer_qwen3_has_one_layer(trt: HostStages, tmp_path: Path) -> None:
    qwen3 = make_checkpoint(tmp_path / "qwen3", "qwen3", dtype="bf16")  # the exporter refuses fp32 Qwen checkpoints
    done = trt.export_layers(qwen3, tmp_path / "x1", 1)
    assert done.ok, done.problems
    onnx = done.evidence["onnx"]
    assert done.layers == onnx["layers"] == onnx["attention_plugins"] == 1
    assert [n for n in onnx["inputs"] if n.startswith("past_key_values_")] == ["past_key_values_0"]
    assert done.evidence["export"]["argv"][-2:] == ["--num-decoder-layer", "1"]
    assert json.loads((done.out_dir / "config.json").read_text())["num_hidden_layers"] == 1
    assert done.to_json()["ok"] is True and done.toolchain_version == "0.11.0"
    with pytest.raises(ConfigurationError, match=r"layers 3 is not an integer in 1\.\.2"):
        trt.export_layers(qwen3, tmp_path / "x3", 3)


# --- our own toolchain, and one that offers none of it -----------------------------------------------------------

def test_our_toolchain_answers_from_its_family_registry_and_reconciliation(ckpts, tmp_path: Path) -> None:
    ours = driver("edgellm-ort")
    check = ours.host().registry_check(ckpts.qwen3)
    assert check.status is RegistryStatus.REGISTERED and check.ok and check.model_class == "edgellm.models.qwen3.Qwen3"
    foreign = ours.host().registry_check(_foreign(ckpts.llama, tmp_path / "mollama"))
    assert foreign.status is RegistryStatus.UNSUPPORTED and not foreign.ok
    assert "'mollama'" in foreign.problem
    assert "registered: gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3" in foreign.problem

    assert ours.host().reconcile(ckpts.qwen3).ok
    rec = ours.host().reconcile(_renamed(ckpts.qwen3, tmp_path / "renamed"))
    assert rec.missing == {RENAMED[0]: (128, 64)} and rec.unexpected == (RENAMED[1],)
    assert [m.tensor for m in rec.shape_mismatches] == [NARROWED]
    assert all(any(name in p for p in rec.problems) for name in (*RENAMED, NARROWED))


def test_a_toolchain_without_the_checks_says_which_offer_them(ckpts) -> None:
    with pytest.raises(NotOffered, match=r"onnxruntime-genai offers no registry check .*tensorrt-edgellm"):
        driver("onnxruntime-genai").host().registry_check(ckpts.qwen3)
    with pytest.raises(NotOffered, match=r"no few-layer export \(toolchains that do: tensorrt-edgellm\)"):
        driver("edgellm-ort").host().export_layers(ckpts.qwen3, Path("unused"), 1)
