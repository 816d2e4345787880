from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgellm import BUNDLED_MODEL_DIR
from edgellm.config import MODELOPT_ALGOS, ModelConfig, QuantConfig, read_json_object
from edgellm.errors import ConfigurationError, UnsupportedError
from edgellm.types import QuantMethod

STORIES = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())


def cfg(**over: Any) -> ModelConfig:
    data = {**STORIES, **over}
    return ModelConfig.from_dict({k: v for k, v in data.items() if v is not ...})


def test_stories_config_loads() -> None:
    c = ModelConfig.load(BUNDLED_MODEL_DIR)
    assert (c.model_type, c.hidden_size, c.num_hidden_layers, c.head_dim) == ("llama", 64, 5, 8)
    assert (c.num_key_value_heads, c.tie_word_embeddings, c.dtype, c.eos_token_ids) == (4, True, "fp32", (2,))
    assert c.rope_scaling is None and c.rope_theta == 10000.0


@pytest.mark.parametrize(("over", "needle"), [
    ({"hidden_size": ...}, "missing required key 'hidden_size'"),
    ({"model_type": ...}, "missing required key 'model_type'"),
    ({"hidden_size": "64"}, "key 'hidden_size' = '64': expected an integer >= 1"),
    ({"num_hidden_layers": 0}, "key 'num_hidden_layers' = 0: expected an integer >= 1"),
    ({"vocab_size": True}, "key 'vocab_size' = True"),
    ({"rms_norm_eps": -1}, "key 'rms_norm_eps' = -1: expected a number > 0"),
    ({"tie_word_embeddings": "yes"}, "key 'tie_word_embeddings' = 'yes': expected true or false"),
    ({"torch_dtype": "int8"}, "key 'torch_dtype' = 'int8': expected one of float32, float16, bfloat16"),
    ({"num_key_value_heads": 3}, "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
    ({"hidden_size": 60}, "hidden_size 60 is not divisible by num_attention_heads 8"),
    ({"eos_token_id": [True]}, "key 'eos_token_id' = [True]"),
    ({"rope_scaling": {"factor": 2.0}}, "key 'rope_scaling.rope_type' = None"),
    ({"rope_parameters": "x"}, "key 'rope_parameters' = 'x': expected an object"),
])
def test_bad_or_missing_key_is_named(over: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        cfg(**over)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_every_problem_in_one_message() -> None:
    with pytest.raises(ConfigurationError) as info:
        cfg(hidden_size=..., vocab_size=-3, hidden_act=7)
    msg = str(info.value)
    assert "'hidden_size'" in msg and "'vocab_size' = -3" in msg and "'hidden_act' = 7" in msg


def test_null_means_default() -> None:
    # A null num_key_value_heads (older configs) means "same as num_attention_heads", not "missing".
    assert cfg(num_key_value_heads=None).num_key_value_heads == 8
    c = cfg(torch_dtype=None, dtype="bfloat16")
    assert c.dtype == "bf16"


def test_rope_layouts() -> None:
    old = cfg(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0})
    new = cfg(rope_theta=..., rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                              "low_freq_factor": 1.0})
    for c in (old, new):
        assert c.rope_theta == 5e5
        assert c.rope_scaling is not None and c.rope_scaling.rope_type == "llama3" and c.rope_scaling.factor == 8.0
        assert c.rope_scaling.params == {"low_freq_factor": 1.0}
    assert cfg(rope_parameters={"rope_type": "default", "rope_theta": 1e6}).rope_scaling is None


def test_read_json_object_rejects_bad_files(tmp_path: Path) -> None:
    cases = {"missing.json": None, "list.json": b"[1]", "bad.json": b"{", "deep.json": b"[" * 100_000,
             "latin1.json": b'{"a": "\xff"}'}
    for name, body in cases.items():
        if body is not None:
            (tmp_path / name).write_bytes(body)
        with pytest.raises(ConfigurationError) as info:
            read_json_object(tmp_path / name, what="config.json")
        assert name in str(info.value)


# --- quantization -----------------------------------------------------------------------------------------------


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_not_quantized(tmp_path: Path) -> None:
    write(tmp_path / "config.json", STORIES)
    q = QuantConfig.load(tmp_path)
    assert q.method is QuantMethod.NONE and not q.is_quantized


def test_modelopt_layout(tmp_path: Path) -> None:
    write(tmp_path / "config.json", STORIES)
    write(tmp_path / "hf_quant_config.json", {
        "producer": {"name": "modelopt", "version": "0.19"},
        "quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": "FP8", "group_size": 128,
                         "exclude_modules": ["lm_head"]},
    })
    q = QuantConfig.load(tmp_path)
    assert (q.method, q.kv_cache, q.group_size, q.exclude_modules, q.producer) == (
        QuantMethod.INT4_AWQ, "fp8", 128, ("lm_head",), "modelopt")
    assert q.is_quantized and q.source.endswith("hf_quant_config.json")


def test_kv_cache_only_is_not_weight_quantized() -> None:
    q = QuantConfig.from_modelopt({"quantization": {"kv_cache_quant_algo": "FP8"}}, source="s")
    assert q.method is QuantMethod.NONE and q.kv_cache == "fp8" and not q.is_quantized


@pytest.mark.parametrize(("qc", "method", "group"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, QuantMethod.INT4_AWQ, 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, QuantMethod.INT4_GPTQ, None),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, QuantMethod.FP8, None),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, QuantMethod.NVFP4, 16),
])
def test_quantization_config_in_config_json(tmp_path: Path, qc: dict[str, Any], method: QuantMethod,
                                            group: int | None) -> None:
    write(tmp_path / "config.json", {**STORIES, "quantization_config": qc})
    q = QuantConfig.load(tmp_path)
    assert (q.method, q.group_size) == (method, group)
    assert "quantization_config" in q.source


@pytest.mark.parametrize(("data", "needle"), [
    ({"quantization": {"quant_algo": "W3A5"}}, "unknown quant_algo 'W3A5'; known: "),
    ({"quantization": {"quant_algo": ["FP8"]}}, "unknown quant_algo ['FP8']; known: "),
    ({"quantization": {"kv_cache_quant_algo": "INT2"}}, "unknown kv_cache_quant_algo 'INT2'; known: FP8, INT8, NVFP4"),
])
def test_modelopt_unknown_algorithm_lists_known(tmp_path: Path, data: dict[str, Any], needle: str) -> None:
    write(tmp_path / "config.json", STORIES)
    write(tmp_path / "hf_quant_config.json", data)
    with pytest.raises(UnsupportedError) as info:
        QuantConfig.load(tmp_path)
    msg = str(info.value)
    assert needle in msg and "hf_quant_config.json" in msg
    if needle.startswith("unknown quant_algo"):
        assert all(algo in msg for algo in MODELOPT_ALGOS)


@pytest.mark.parametrize("qc", [
    {"quant_method": "bitsandbytes", "bits": 4},
    {"quant_method": "awq", "bits": 3},
    {"quant_method": ["awq"], "bits": 4},
    {"quant_method": "gptq", "bits": [4]},
])
def test_hf_unknown_method_lists_known(tmp_path: Path, qc: dict[str, Any]) -> None:
    write(tmp_path / "config.json", {**STORIES, "quantization_config": qc})
    with pytest.raises(UnsupportedError) as info:
        QuantConfig.load(tmp_path)
    msg = str(info.value)
    assert "unknown quantization_config quant_method=" in msg
    assert "known: awq (bits=4), fp8, gptq (bits=4), modelopt" in msg


@pytest.mark.parametrize(("files", "needle"), [
    ({"hf_quant_config.json": {"quantization": "FP8"}}, "key 'quantization' must be an object"),
    ({"hf_quant_config.json": {"quantization": {}}}, "neither quant_algo nor kv_cache_quant_algo"),
    ({"hf_quant_config.json": {"quantization": {"quant_algo": "FP8", "group_size": 0}}}, "group_size 0"),
    ({"hf_quant_config.json": {"quantization": {"quant_algo": "FP8", "exclude_modules": "lm_head"}}},
     "exclude_modules must be a list of strings"),
    ({"config.json": {**STORIES, "quantization_config": "awq"}}, "quantization_config must be an object"),
    ({"config.json": {**STORIES, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": "128"}}},
     "group_size '128' must be an integer"),
])
def test_malformed_quant_config(tmp_path: Path, files: dict[str, Any], needle: str) -> None:
    write(tmp_path / "config.json", STORIES)
    for name, data in files.items():
        write(tmp_path / name, data)
    with pytest.raises(ConfigurationError) as info:
        QuantConfig.load(tmp_path)
    assert needle in str(info.value)
