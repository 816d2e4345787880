"""export -> build on every family: manifests, read-back precision, logits and greedy tokens vs transformers,
and the clear errors of bad inputs (exit 2 from the CLI)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
import transformers

from edgellm.cli import main
from edgellm.compiler.files import sha256_file
from edgellm.runtime import Engine, GenerationRequest
from edgellm.synth import make_checkpoint
from tests.fixtures.engines import build

PROMPT = "Once upon a time"


def _reference(ckpt, ids, new_tokens=32):
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].numpy()
        greedy = ref.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0, len(ids):]
    return logits, greedy.tolist()


def test_export_manifest_and_graph(stories_engine):
    onnx_dir = stories_engine.onnx_dir
    manifest = json.loads((onnx_dir / "export_manifest.json").read_text())
    assert manifest["precision"] == "fp32" and manifest["onnx_opset"] == 17
    assert manifest["torch_version"] == torch.__version__
    assert {"model.onnx", "model.onnx.data", "config.json", "tokenizer.json", "edgellm_generation.json"} <= set(
        manifest["files"])
    for name, entry in manifest["files"].items():
        assert sha256_file(onnx_dir / name) == entry["sha256"]
    assert len(manifest["checkpoint"]["sha256"]) == 64
    assert "model.safetensors" in manifest["checkpoint"]["files"]
    onnx.checker.check_model(str(onnx_dir / "model.onnx"))
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False).graph
    names = [i.name for i in graph.input]
    assert names[:5] == ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key",
                         "past_key_values.0.value"]
    past = graph.input[3].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in past] == ["batch", 4, "past", 8]
    assert [o.name for o in graph.output][:2] == ["logits", "present.0.key"]
    assert names[-1] == "logits_positions" and len(names) == 3 + 2 * 5 + 1  # weights are initializers, not inputs
    # every weight stored once (stories260K ties lm_head to the embedding): the data file holds the checkpoint's
    # parameter bytes plus at most one alignment pad per tensor
    stored = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    stored_bytes = sum(4 * int(np.prod(t.dims)) for t in stored)
    assert stored_bytes <= manifest["checkpoint"]["files"]["model.safetensors"]["bytes"]  # a duplicate adds 131072
    assert (onnx_dir / "model.onnx.data").stat().st_size <= stored_bytes + 4096 * len(stored)
    assert [t.name for t in stored if "embed" in t.name or "lm_head" in t.name] == ["model.embed_tokens.weight"]
    # weights as the checkpoint holds them ([out, in]), read by FusedMatMul(transB=1): no Transpose of a weight;
    # projections of one input are one GEMM (then a Split), their rows one after the other
    shapes = {t.name: list(t.dims) for t in stored}
    assert shapes["model.layers.0.self_attn.q_proj+k_proj+v_proj.weight"] == [64 + 2 * 32, 64]
    assert shapes["model.layers.4.mlp.gate_proj+up_proj.weight"] == [2 * 172, 64]
    assert shapes["model.layers.4.mlp.down_proj.weight"] == [64, 172]
    gemms = [n for n in graph.node if n.op_type == "FusedMatMul"]
    assert len(gemms) == 5 * 4 + 1 and all(n.domain == "com.microsoft" for n in gemms)
    assert all([(a.name, a.i) for a in n.attribute] == [("transB", 1)] for n in gemms)
    stored_names = {t.name for t in stored}
    assert not [n for n in graph.node if n.op_type == "Transpose" and n.input[0] in stored_names]


def test_logits_positions_limit_the_lm_head(stories_engine):
    engine = Engine.open(stories_engine.engine_dir)
    ids = engine.encode("Lily and Tom went to the park")
    full = engine.step(np.asarray([ids]), engine.new_cache(1))
    last = engine.step(np.asarray([ids]), engine.new_cache(1), last_only=True)
    assert full.shape == (1, len(ids), 512) and last.shape == (1, 1, 512)
    np.testing.assert_allclose(last[0, 0], full[0, -1], rtol=0, atol=1e-5)


def test_engine_manifest(stories_engine, stories_engine_fp16):
    for built, precision in ((stories_engine, "fp32"), (stories_engine_fp16, "fp16")):
        m = json.loads((built.engine_dir / "engine_manifest.json").read_text())
        assert m["backend"] == "ort" and m["precision"] == precision
        assert m["graph"]["weight_bytes"].get("float16" if precision == "fp16" else "float32", 0) > 0
        assert m["build_params"] == {"max_batch_size": 4, "max_input_len": 512, "max_seq_len": 512}
        assert m["source_export"]["manifest_sha256"] == sha256_file(built.onnx_dir / "export_manifest.json")
        logits = next(o for o in m["io"]["outputs"] if o["name"] == "logits")
        assert logits["dtype"] == "float32" and logits["shape"] == ["batch", "logits_len", 512]
        positions = next(i for i in m["io"]["inputs"] if i["name"] == "logits_positions")
        assert positions["dtype"] == "int64" and positions["shape"] == ["logits_len"]
        # the weight matrices are not re-serialized: the engine's data file is the export's, copied as it is
        weights = m["backend_options"]["weights"]
        assert m["graph"]["op_counts"]["RotaryEmbedding"] == 2 * 5  # q and k, fused, in every layer
        # what ORT itself writes: only the rotary cos/sin tables [512 positions, head_dim / 2]
        assert weights["export_data"] == "copy"
        assert weights["engine_owned_bytes"] == 2 * 512 * 4 * (2 if precision == "fp16" else 4)
        assert weights["matrices_from_export"] == 1 + 5 * 4  # tied embedding + per layer qkv, o, gate+up, down
        assert [i["name"] for i in m["io"]["inputs"]][-1] == "logits_positions"
        assert m["files"]["model.onnx.data"]["sha256"] == sha256_file(built.onnx_dir / "model.onnx.data")
        assert (built.engine_dir / "model.engine.data").stat().st_size == weights["engine_owned_bytes"]
        past = next(i for i in m["io"]["inputs"] if i["name"] == "past_key_values.0.key")
        assert past["dtype"] == ("float16" if precision == "fp16" else "float32")
        for name, entry in m["files"].items():
            assert sha256_file(built.engine_dir / name) == entry["sha256"]


@pytest.mark.parametrize("name", ["llama", "llama_rope3", "mistral", "qwen2", "qwen3"])
def test_family_logits_and_greedy_match_transformers(ckpts, tmp_path, name):
    ckpt = getattr(ckpts, name)
    built = build(ckpt, tmp_path, "fp32")
    engine = Engine.open(built.engine_dir)
    ids = engine.encode("Lily and Tom went to the park. They saw a big dog and")
    assert len(ids) > 10
    ref_logits, ref_greedy = _reference(ckpt, ids)
    assert np.abs(engine.logits(ids) - ref_logits).max() < 1e-4
    out = engine.generate([GenerationRequest(id="g", input_ids=ids, max_new_tokens=32)])[0]
    assert out.output_ids == ref_greedy[: len(out.output_ids)]
    assert len(out.output_ids) == len(ref_greedy)


@pytest.mark.parametrize("name", ["qwen2_tied_bf16_sharded", "llama_fp16"])
def test_fp16_export_of_half_checkpoints(ckpts, tmp_path, name):
    ckpt = getattr(ckpts, name)
    built = build(ckpt, tmp_path, "fp16")
    engine = Engine.open(built.engine_dir)
    assert engine.precision == "fp16" and engine.new_cache(1).dtype == np.float16
    ids = engine.encode(PROMPT)
    ref_logits, _ = _reference(ckpt, ids)
    got = engine.logits(ids)
    assert got.dtype == np.float32
    assert np.abs(got - ref_logits).max() < 2e-2 * max(1.0, float(np.abs(ref_logits).max()))


def test_fp16_stories_is_close_to_fp32(stories_engine, stories_engine_fp16):
    e32, e16 = Engine.open(stories_engine.engine_dir), Engine.open(stories_engine_fp16.engine_dir)
    ids = e32.encode(PROMPT)
    l32, l16 = e32.logits(ids), e16.logits(ids)
    assert np.abs(l32 - l16).max() < 0.1
    assert (l32.argmax(-1) == l16.argmax(-1)).mean() > 0.75


def test_cli_export_build_round_trip_and_overwrite(ckpts, tmp_path, capsys):
    onnx_dir, engine_dir = tmp_path / "onnx", tmp_path / "engine"
    assert main(["export", str(ckpts.qwen3), str(onnx_dir), "--precision", "fp16", "--lm-head-precision", "fp16",
                 "--kv-cache-precision", "fp16"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["precision"], printed["lm_head_precision"], printed["kv_cache_precision"]) == ("fp16",) * 3
    manifest = json.loads((onnx_dir / "export_manifest.json").read_text())
    assert (manifest["lm_head_precision"], manifest["kv_cache_precision"]) == ("fp16", "fp16")
    assert main(["build", str(onnx_dir), str(engine_dir), "--backend", "ort", "--max-batch-size", "2",
                 "--max-input-len", "16", "--max-seq-len", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["max_seq_len"] == 64
    assert main(["export", str(ckpts.qwen3), str(onnx_dir)]) == 2
    assert "not empty; pass --overwrite" in capsys.readouterr().err
    assert main(["export", str(ckpts.qwen3), str(onnx_dir), "--overwrite"]) == 0
    assert json.loads((onnx_dir / "export_manifest.json").read_text())["precision"] == "fp32"


@pytest.mark.parametrize("precision, fragment", [
    ("int4_awq", "precision int4_awq needs a checkpoint quantized with it (this one is not quantized): run "
                 "tensorrt-edgellm-quantize --quantization int4_awq first"),
    ("nvfp4", "precision 'nvfp4' is not supported by export (NVFP4 (e2m1 weights with fp8 block scales) needs "
              "Blackwell tensor cores"),
    ("int4_gptq", "precision 'int4_gptq' is not supported by export; supported: fp32, fp16, bf16, int4_awq, int8_sq, "
                  "fp8"),
    ("fp64", "unknown precision 'fp64'; valid: fp32, fp16"),
])
def test_export_rejects_precisions(ckpts, tmp_path, capsys, precision, fragment):
    assert main(["export", str(ckpts.llama), str(tmp_path / "o"), "--precision", precision]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_export_unsupported_rope_scaling_exit_2(ckpts, tmp_path, capsys):
    ckpt = ckpts.copy("llama", tmp_path / "ck")
    data = json.loads((ckpt / "config.json").read_text())
    data["rope_parameters"] = {"rope_type": "longrope", "factor": 2.0, "rope_theta": 10000.0}
    (ckpt / "config.json").write_text(json.dumps(data))
    assert main(["export", str(ckpt), str(tmp_path / "o")]) == 2
    assert ("rope_scaling type 'longrope' is not implemented; supported: default, llama3, linear, dynamic, yarn"
            in capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def test_build_refuses_tampered_export(stories_engine, tmp_path, capsys):
    import shutil

    onnx_dir = tmp_path / "onnx"
    shutil.copytree(stories_engine.onnx_dir, onnx_dir)
    with open(onnx_dir / "model.onnx.data", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02\x03")
    assert main(["build", str(onnx_dir), str(tmp_path / "engine")]) == 2
    err = capsys.readouterr().err
    assert "model.onnx.data: sha256" in err and "does not match export_manifest.json" in err
    assert not (tmp_path / "engine").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["onnx"]  # no half-written temp dir left behind


def test_build_unknown_backend_and_bad_limits(stories_engine, tmp_path, capsys):
    assert main(["build", str(stories_engine.onnx_dir), str(tmp_path / "e"), "--backend", "tvm"]) == 2
    assert "unknown backend 'tvm'; registered: ort, torch-cuda" in capsys.readouterr().err
    assert main(["build", str(stories_engine.onnx_dir), str(tmp_path / "e"), "--max-seq-len", "1024"]) == 2
    assert "max_seq_len 1024 exceeds the model's max_position_embeddings 512" in capsys.readouterr().err
    assert main(["build", str(stories_engine.onnx_dir), str(tmp_path / "e"), "--max-input-len", "64",
                 "--max-seq-len", "32"]) == 2
    assert "max_input_len 64 must be <= max_seq_len 32" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_mistral_sliding_window_builds_past_the_window(tmp_path, capsys):
    """Windows are implemented (tests/test_sliding_window.py checks the tokens): an engine longer than the window
    builds, and the manifests say which window its layers use."""
    ckpt = make_checkpoint(tmp_path / "ck", "mistral", sliding_window=64)
    assert main(["export", str(ckpt), str(tmp_path / "onnx")]) == 0
    assert main(["build", str(tmp_path / "onnx"), str(tmp_path / "e1")]) == 0
    manifest = json.loads((tmp_path / "e1" / "engine_manifest.json").read_text())
    assert manifest["build_params"]["max_seq_len"] == 256 and manifest["model"]["sliding_window"] == 64


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_mha_checkpoint_exports_at_fp32_and_matches_transformers(tmp_path, dtype):
    """Without key/value groups (num_key_value_heads == num_attention_heads) the fp32 export's fused attention broke
    TorchScript's peephole pass from 0f37df0 on ("Argument passed to at() was not in the map"): a 4-layer bf16
    sharded Llama, as published, exported only at bf16."""
    ckpt = make_checkpoint(tmp_path / "ck", "llama", dtype=dtype, num_hidden_layers=4, num_key_value_heads=4,
                           max_shard_size="40KB")
    built = build(ckpt, tmp_path, "fp32")
    engine = Engine.open(built.engine_dir)
    ids = engine.encode("Lily and Tom went to the park. They saw a big dog and")
    _, ref_greedy = _reference(ckpt, ids, new_tokens=16)
    out = engine.generate([GenerationRequest(id="g", input_ids=ids, max_new_tokens=16)])[0]
    assert out.output_ids == ref_greedy
