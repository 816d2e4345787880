"""The torch-CUDA backend: what needs no GPU runs everywhere (the weight table read from the export, the decoder
math and the GPU sampler on the CPU, the refusal without CUDA); ``@pytest.mark.gpu`` tests need an NVIDIA GPU
(``make test`` deselects them; run them with ``pytest -m gpu`` on a GPU machine).

Self-contained (no conftest fixtures) so the GPU machine can run it with ``--noconftest``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from edgellm import BUNDLED_MODEL_DIR
from edgellm.backends.base import BuildParams
from edgellm.backends.torch_cuda import (
    WEIGHT_TABLE,
    TorchCudaBackend,
    check_precision,
    check_table,
    read_table,
    table_precision,
    weight_table,
)
from edgellm.backends.torch_cuda.backend import _members
from edgellm.backends.torch_cuda.decoder import GpuDecoder, load_parameters
from edgellm.backends.torch_cuda.session import sample
from edgellm.cli import main
from edgellm.compiler.build import applied_precision
from edgellm.compiler.export import export_checkpoint, input_names
from edgellm.config import ModelConfig
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.models import family_for
from edgellm.synth import make_checkpoint
from edgellm.weights import load_weights


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (checkpoint, fp32 export): the trained stories260K (tied), qwen2 (q/k/v bias, untied), qwen3 (q/k
    norm, explicit head_dim, tied)."""
    root = tmp_path_factory.mktemp("torch_cuda_exports")
    ckpts = {"stories": BUNDLED_MODEL_DIR,
             "qwen2": make_checkpoint(root / "qwen2", "qwen2"),
             "qwen3": make_checkpoint(root / "qwen3", "qwen3", tie_word_embeddings=True)}
    out = {}
    for name, ckpt in ckpts.items():
        export_checkpoint(ckpt, root / f"onnx_{name}", "fp32")
        out[name] = (ckpt, root / f"onnx_{name}")
    return out


@pytest.fixture(scope="module")
def bf16_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stories260K exported at bf16 (the precision only torch-cuda builds)."""
    out = tmp_path_factory.mktemp("torch_cuda_bf16") / "onnx"
    export_checkpoint(BUNDLED_MODEL_DIR, out, "bf16")
    return out


# --- no GPU needed ---------------------------------------------------------------------------------------------

def test_weight_table_gives_back_every_checkpoint_tensor(exports, bf16_export) -> None:
    for name, (ckpt, onnx_dir) in {**exports, "stories_bf16": (BUNDLED_MODEL_DIR, bf16_export)}.items():
        cfg = ModelConfig.load(onnx_dir)
        table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
        assert data_file == onnx_dir / "model.onnx.data"
        assert any(len(t["members"]) > 1 for t in table), f"{name}: the export fuses q/k/v and gate/up"
        params = load_parameters(data_file, table, torch.device("cpu"))
        source = load_weights(ckpt, family_for(cfg), cfg)
        assert set(params) == set(source), name
        dtype = torch.bfloat16 if name.endswith("bf16") else torch.float32
        assert table_precision(table)[0] == ("bf16" if name.endswith("bf16") else "fp32")
        for k, v in source.items():
            assert params[k].dtype == dtype and torch.equal(params[k], v.to(dtype)), f"{name}: {k} differs"


def test_bf16_build_reads_its_precision_back_and_open_refuses_a_manifest_that_disagrees(bf16_export,
                                                                                       tmp_path) -> None:
    """The torch-cuda build needs no GPU itself (the engine is the export's data plus a weight table): its precision
    is read back from the table the runtime loads, checked against the export's, and checked again at open."""
    onnx_dir = bf16_export
    export = json.loads((onnx_dir / "export_manifest.json").read_text())
    assert (export["precision"], export["lm_head_precision"], export["kv_cache_precision"]) == ("bf16",) * 3
    out = tmp_path / "engine"
    out.mkdir()
    built = TorchCudaBackend().build(onnx_dir / "model.onnx", out, BuildParams(2, 64, 128))
    assert built["precision"] == built["graph"]["precision"] == "bf16"
    assert set(built["graph"]["weight_bytes"]) == {"bfloat16"}
    kv = {s["dtype"] for s in built["io"]["inputs"] if s["name"].startswith("past_key_values")}
    assert kv == {"bfloat16"}
    # the export's signature, every input (Engine.open refuses an engine without logits_positions)
    cfg = ModelConfig.load(onnx_dir)
    assert [s["name"] for s in built["io"]["inputs"]] == input_names(cfg.num_hidden_layers)
    assert applied_precision(export, built, "here") == "bf16"
    with pytest.raises(TestFailure, match="holds bf16 weights but the export is fp16: the backend did not apply"):
        applied_precision({**export, "precision": "fp16"}, built, "here")
    table = read_table(out / WEIGHT_TABLE)
    check_precision(table, {"precision": "bf16"}, out)
    (out / "config.json").write_bytes((onnx_dir / "config.json").read_bytes())
    manifest = {"precision": "fp16", "build_params": {"max_batch_size": 2, "max_seq_len": 128}, "io": built["io"],
                "backend_options": built["options"]}
    with pytest.raises(ConfigurationError, match=r"states precision 'fp16' but torch_cuda_weights\.json holds bf16"):
        TorchCudaBackend().open(out, manifest)


def test_ort_refuses_a_bf16_export_saying_why(bf16_export, tmp_path, capsys) -> None:
    assert main(["build", str(bf16_export), str(tmp_path / "engine"), "--backend", "ort"]) == 2
    err = capsys.readouterr().err
    assert "backend 'ort' does not build bf16 engines (ONNX Runtime's CPU execution provider has no bf16" in err
    assert "--backend torch-cuda" in err and "Traceback" not in err
    assert not (tmp_path / "engine").exists()


def test_bf16_decoder_math_tracks_transformers_fp32_on_the_cpu(bf16_export) -> None:
    """The same math in bf16 (the weights exactly the checkpoint's rounded to bf16): close to the fp32 reference
    by bf16's rounding."""
    import transformers

    ckpt, onnx_dir = BUNDLED_MODEL_DIR, bf16_export
    cfg = ModelConfig.load(onnx_dir)
    table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
    model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=1,
                       max_seq_len=64, device=torch.device("cpu"))
    assert model.dtype == torch.bfloat16 and model.kv[0].dtype == torch.bfloat16
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 33, 70, 100, 4, 8, 200, 13, 17, 42]])
    with torch.no_grad():
        ref = hf(ids).logits[0].float()
        got = model.prefill(ids, torch.arange(12)[None], 0, torch.ones(1, 12, dtype=torch.bool), 0,
                            causal_only=True)[0]
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert float(cos.min()) > 0.999 and float((got - ref).abs().max()) < 0.5
    assert float((got - ref).abs().max()) > 1e-3  # really computed in bf16, not fp32


def test_fused_names_map_back_to_the_family_parameters() -> None:
    cfg = ModelConfig.load(BUNDLED_MODEL_DIR)
    expected = family_for(cfg).expected_parameters(cfg)
    p = "model.layers.3.self_attn."
    assert _members(p + "q_proj+k_proj+v_proj.weight.T", expected) == [
        p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"]
    assert _members("model.layers.0.mlp.gate_proj+up_proj.weight.T", expected) == [
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    assert _members("model.layers.0.mlp.gate_proj+nope.weight.T", expected) is None
    assert _members("model.layers.99.mlp.down_proj.weight.T", expected) is None


def test_weight_table_refuses_a_wrong_shape_or_a_missing_parameter(exports) -> None:
    _, onnx_dir = exports["stories"]
    cfg = ModelConfig.load(onnx_dir)
    table, _ = weight_table(onnx_dir / "model.onnx", cfg)
    bad = [dict(t) for t in table]
    bad[0] = {**bad[0], "shape": [int(bad[0]["shape"][0]) + 1]}
    with pytest.raises(ConfigurationError, match=rf"tensor {bad[0]['name']!r} has shape"):
        check_table(bad, cfg)
    with pytest.raises(ConfigurationError, match=rf"no stored tensor holds {table[0]['members'][0]['param']}"):
        check_table(table[1:], cfg)


def test_decoder_math_matches_transformers_on_the_cpu(exports) -> None:
    """The GPU runtime's math (prefill with and without left padding, then decode steps on the preallocated
    cache) equals transformers' fp32 forward pass; here on the CPU, on the GPU in the gpu tests below."""
    import transformers

    for name, (ckpt, onnx_dir) in exports.items():
        cfg = ModelConfig.load(onnx_dir)
        table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
        model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=2,
                           max_seq_len=32, device=torch.device("cpu"))
        hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        ids = torch.tensor([[1, 5, 9, 33, 70, 100, 4, 8]])
        pos = torch.arange(8)[None]
        with torch.no_grad():
            ref = hf(ids).logits[0].float()
            whole = model.prefill(ids, pos, 0, torch.ones(1, 8, dtype=torch.bool), 0, causal_only=True)[0]
            model.prefill(ids[:, :6], pos[:, :6], 0, torch.ones(1, 6, dtype=torch.bool), 5, causal_only=True)
            step6 = model.decode(ids[0, 6:7], pos[0, 6:7], torch.tensor([6]))[0]
            step7 = model.decode(ids[0, 7:8], pos[0, 7:8], torch.tensor([7]))[0]
            padded_ids = torch.stack([torch.cat([torch.zeros(2, dtype=torch.long), ids[0, :6]]), ids[0]])
            mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8], dtype=torch.bool)
            padded = model.prefill(padded_ids, (mask.long().cumsum(1) - 1).clamp_min(0), 0, mask, 0,
                                   causal_only=False)
        for what, got, want in (("prefill", whole, ref), ("decode 6", step6, ref[6]), ("decode 7", step7, ref[7]),
                                ("left-padded row", padded[0, 2:], ref[:6]), ("full row", padded[1], ref)):
            assert float((got - want).abs().max()) < 1e-4, f"{name}: {what}"


def test_the_runtime_runs_the_exported_decoder_layers(exports) -> None:
    """One decoder: the torch-cuda runtime drives the export's own layer modules (edgellm.models.decoder) with its
    Linear (weights [in, out], q/k/v and gate/up fused) around its preallocated cache; its decode steps give the
    logits of the export's decoder over an explicit past."""
    from edgellm.models.decoder import ColumnLinear, Decoder, Layer

    ckpt, onnx_dir = exports["qwen3"]  # q/k norm: every branch of Attention.project
    cfg = ModelConfig.load(onnx_dir)
    table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
    model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=1,
                       max_seq_len=16, device=torch.device("cpu"))
    assert all(type(layer) is Layer for layer in model.layers)
    assert isinstance(model.layers[0].self_attn.qkv_proj, ColumnLinear)
    export = Decoder.from_weights(cfg, family_for(cfg), load_weights(ckpt, family_for(cfg), cfg))
    ids = torch.tensor([[7, 3, 99, 12, 5, 41]])
    with torch.no_grad():
        past = export(ids[:, :4], torch.ones(1, 4, dtype=torch.long), torch.arange(4)[None], *export.empty_past(1))
        want = export(ids[:, 4:], torch.ones(1, 6, dtype=torch.long), torch.arange(4, 6)[None], *past[1:])[0][0]
        model.prefill(ids[:, :4], torch.arange(4)[None], 0, torch.ones(1, 4, dtype=torch.bool), 3, causal_only=True)
        got = torch.stack([model.decode(ids[0, i:i + 1], torch.tensor([i]), torch.tensor([i]))[0] for i in (4, 5)])
    assert float((got - want).abs().max()) < 1e-5


def test_gpu_sampler_is_greedy_at_zero_and_samples_the_filtered_distribution() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 40
    logits = torch.randn(3, vocab, generator=gen) * 2
    temperature, top_k, top_p = torch.tensor([0.0, 1.0, 0.8]), torch.tensor([0, 0, 4]), torch.tensor([1.0, 0.9, 1.0])
    seeds = torch.tensor([11, 12, 13])
    counts: list[Counter[int]] = [Counter(), Counter(), Counter()]
    n = 4000
    for step in range(n):
        out = sample(logits, temperature, top_k, top_p, seeds, torch.full((3,), step))
        for row in range(3):
            counts[row][int(out[row])] += 1
    assert counts[0] == Counter({int(logits[0].argmax()): n})
    probs = torch.softmax(logits[1], -1)
    sp, si = probs.sort(descending=True)
    kept = (sp.cumsum(0) - sp) < 0.9
    want = torch.zeros(vocab)
    want[si[kept]] = sp[kept] / sp[kept].sum()
    got = torch.tensor([counts[1][i] for i in range(vocab)]) / n
    assert float((got - want).abs().max()) < 0.03  # ~4 sigma at n = 4000
    assert set(counts[2]) <= set(logits[2].topk(4).indices.tolist())
    again = sample(logits, temperature, top_k, top_p, seeds, torch.full((3,), 7))
    assert torch.equal(again, sample(logits, temperature, top_k, top_p, seeds, torch.full((3,), 7)))
    # a row's draw does not depend on the rows beside it
    alone = sample(logits[1:2], temperature[1:2], top_k[1:2], top_p[1:2], seeds[1:2], torch.full((1,), 7))
    assert int(alone[0]) == int(again[1])


def test_build_without_cuda_is_refused_in_one_line(exports, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, onnx_dir = exports["stories"]
    code = main(["build", str(onnx_dir), str(tmp_path / "engine"), "--backend", "torch-cuda"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "backend 'torch-cuda' is not available on this machine" in err
    assert "needs" in err and "GPU" in err
    assert not (tmp_path / "engine").exists()


def test_env_reports_the_gpu_or_why_there_is_none(capsys, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["env"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu"] is None
    assert "torch-cuda" not in report["backends"]
    assert "GPU" in report["gpu_unavailable_reason"]


# --- on an NVIDIA GPU ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_engines(exports, bf16_export, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Path]]:
    """name -> (checkpoint, torch-cuda engine, ORT engine) for stories260K fp32, fp16 and bf16 (ORT builds no bf16:
    its slot holds the fp32 ORT engine)."""
    from edgellm.compiler.build import build_engine

    root = tmp_path_factory.mktemp("torch_cuda_engines")
    ckpt, onnx32 = exports["stories"]
    export_checkpoint(ckpt, root / "onnx16", "fp16")
    out = {}
    for name, onnx_dir in (("fp32", onnx32), ("fp16", root / "onnx16"), ("bf16", bf16_export)):
        cuda, ort = root / f"cuda_{name}", root / f"ort_{name}"
        build_engine(onnx_dir, cuda, "torch-cuda", max_batch_size=4, max_seq_len=256)
        if name != "bf16":
            build_engine(onnx_dir, ort, "ort", max_batch_size=4, max_seq_len=256)
        out[name] = (ckpt, cuda, ort if name != "bf16" else root / "ort_fp32")
    return out


@pytest.mark.gpu
def test_engine_manifest_reuses_the_export_weights(cuda_engines) -> None:
    _, engine_dir, _ = cuda_engines["fp16"]
    manifest = json.loads((engine_dir / "engine_manifest.json").read_text())
    assert manifest["backend"] == "torch-cuda"
    assert manifest["precision"] == "fp16"
    export = json.loads((Path(manifest["source_export"]["path"]) / "export_manifest.json").read_text())
    assert manifest["files"]["model.onnx.data"]["sha256"] == export["files"]["model.onnx.data"]["sha256"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_eval_passes_against_transformers_on_the_same_gpu(cuda_engines, precision, tmp_path) -> None:
    """The reference runs where the engine runs (transformers fp32 on this GPU, TF32 off), with the CPU's checks
    and thresholds of the engine's precision."""
    from edgellm.thresholds import DEFAULTS
    from edgellm.types import Precision

    ckpt, engine_dir, _ = cuda_engines[precision]
    out = tmp_path / "eval.json"
    assert main(["eval", "--engine-dir", str(engine_dir), "--checkpoint", str(ckpt), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["precision"] == precision
    assert report["reference_device"] == {"device": "cuda", "name": torch.cuda.get_device_name(0), "dtype": "fp32",
                                          "chosen_as": "where the torch-cuda engine runs"}
    assert report["thresholds"] == DEFAULTS[Precision(precision)].enabled()
    # the numbers, for the log (pytest -rA shows a passing test's output)
    print("EVAL", json.dumps({"precision": precision, "perplexity_ratio": report["perplexity_ratio"],
                              **{k: c["value"] for k, c in report["checks"].items()}}))


@pytest.mark.gpu
def test_bf16_engine_states_and_computes_in_bf16(cuda_engines) -> None:
    from edgellm.runtime import Engine, GenerationRequest

    _, cuda_dir, _ = cuda_engines["bf16"]
    manifest = json.loads((cuda_dir / "engine_manifest.json").read_text())
    assert (manifest["precision"], manifest["export_precision"]) == ("bf16", "bf16")
    engine = Engine.open(cuda_dir)
    session = engine.session
    assert session.model.dtype == torch.bfloat16 and session.model.kv[0].dtype == torch.bfloat16
    weights = [*session.model.decoder.parameters(), session.model.lm_w, session.model.embed]
    assert len(weights) > 5 and {t.dtype for t in weights} == {torch.bfloat16}
    cfg = engine.config
    ids = np.array([engine.encode("Once upon a time there was a")], dtype=np.int64)
    n = ids.shape[1]
    empty = np.zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim), dtype=np.float32)
    past = {f"past_key_values.{i}.{kv}": empty for i in range(cfg.num_hidden_layers) for kv in ("key", "value")}
    out = session.run({"input_ids": ids, "attention_mask": np.ones((1, n), dtype=np.int64),
                       "position_ids": np.arange(n)[None], **past})
    assert out["present.0.key"].dtype == np.float32  # numpy has no bf16: the cache crosses as float32, exactly
    key = out["present.0.key"]
    assert np.array_equal(torch.from_numpy(key).to(torch.bfloat16).float().numpy(), key)  # bf16 values, exactly
    whole = engine.logits(ids[0].tolist())
    np.testing.assert_allclose(out["logits"][0], whole, atol=1e-2)
    res = engine.generate([GenerationRequest(id="g", prompt="Once upon a time", max_new_tokens=24)])[0]
    assert len(res.output_ids) == 24 or res.finish_reason == "eos"


@pytest.mark.gpu
def test_greedy_generation_equals_the_ort_engine_and_ignores_batching(cuda_engines) -> None:
    from edgellm.runtime import Engine, GenerationRequest

    _, cuda_dir, ort_dir = cuda_engines["fp32"]
    prompts = ["Once upon a time", "The little dog", "Lily and Tom went to the park to"]
    reqs = [GenerationRequest(id=str(i), prompt=p, max_new_tokens=40) for i, p in enumerate(prompts)]
    cuda, ort = Engine.open(cuda_dir), Engine.open(ort_dir)
    batched = cuda.generate(reqs)
    assert [r.output_ids for r in batched] == [r.output_ids for r in ort.generate(reqs)]
    assert [r.output_ids for r in batched] == [cuda.generate([r])[0].output_ids for r in reqs]
    assert all(r.ttft_ms > 0 for r in batched)


@pytest.mark.gpu
def test_sampling_is_reproducible_per_seed_whatever_the_batch(cuda_engines) -> None:
    from edgellm.runtime import Engine, GenerationRequest

    _, cuda_dir, _ = cuda_engines["fp16"]
    engine = Engine.open(cuda_dir)

    def req(i: int, seed: int) -> GenerationRequest:
        return GenerationRequest(id=str(i), prompt="Once upon a time", max_new_tokens=24, temperature=0.9,
                                 top_k=50, top_p=0.95, seed=seed)

    alone = engine.generate([req(0, 7)])[0].output_ids
    together = engine.generate([req(0, 7), req(1, 8), req(2, 7)])
    assert together[0].output_ids == alone == together[2].output_ids
    assert together[1].output_ids != alone


@pytest.mark.gpu
def test_graphed_decode_step_equals_a_prefill_of_the_same_positions(cuda_engines) -> None:
    from edgellm.runtime import Engine

    _, cuda_dir, _ = cuda_engines["fp32"]
    engine = Engine.open(cuda_dir)
    ids = np.array([engine.encode("Once upon a time there was a")], dtype=np.int64)
    whole = engine.logits(ids[0].tolist())
    cache = engine.new_cache(1)
    engine.step(ids[:, :-2], cache)
    stepped = [engine.step(ids[:, i:i + 1], cache)[0, 0] for i in (ids.shape[1] - 2, ids.shape[1] - 1)]
    assert cache.length == ids.shape[1]
    np.testing.assert_allclose(np.stack(stepped), whole[-2:], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(("fused", "compile_decode"), [(True, False), (False, False), (False, True)],
                         ids=["fused_kernels", "layer_modules_graph_only", "layer_modules_compiled"])
def test_every_decode_variant_captures_and_equals_a_prefill(cuda_engines, fused: bool, compile_decode: bool) -> None:
    """The decode step captured as a CUDA graph through the fused kernels and through the layer modules, with and
    without torch.compile (bench_gpu's variant): nothing in it may copy a CPU tensor in during capture (the mask
    value once did), and each gives a prefill's logits."""
    from edgellm.backends.torch_cuda import ENGINE_DATA, WEIGHT_TABLE, read_table
    from edgellm.backends.torch_cuda.session import TorchCudaSession
    from edgellm.runtime import Engine

    _, cuda_dir, _ = cuda_engines["fp32"]
    engine = Engine.open(cuda_dir)
    manifest = json.loads((cuda_dir / "engine_manifest.json").read_text())
    engine.session = TorchCudaSession(cuda_dir / ENGINE_DATA, read_table(cuda_dir / WEIGHT_TABLE), engine.config,
                                      io=manifest["io"], max_batch_size=2, max_seq_len=64,
                                      compile_decode=compile_decode, fused=fused)
    assert engine.session.model.fused is fused
    assert set(engine.session._graphs) == {(1, True), (2, True)}  # captured at open: batch 1 and max_batch_size
    ids = np.array([engine.encode("Once upon a time there was a")], dtype=np.int64)
    whole = engine.logits(ids[0].tolist())
    cache = engine.new_cache(1)
    engine.step(ids[:, :-2], cache)
    stepped = [engine.step(ids[:, i:i + 1], cache)[0, 0] for i in (ids.shape[1] - 2, ids.shape[1] - 1)]
    np.testing.assert_allclose(np.stack(stepped), whole[-2:], atol=1e-4)


@pytest.mark.gpu
def test_fused_kernels_equal_the_layer_modules_on_the_gpu(exports) -> None:
    """kernels.py (RMSNorm, RoPE + cache write, decode attention, SiLU * up) against the layer modules on the GPU in
    fp32, for every family branch (q/k/v bias: qwen2; q/k norm and explicit head_dim: qwen3): prefill, a
    left-padded batch, and decode steps of both rows over that padded cache."""
    dev = torch.device("cuda")
    for name, (_, onnx_dir) in exports.items():
        cfg = ModelConfig.load(onnx_dir)
        table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
        outs = {}
        for fused in (False, True):
            model = GpuDecoder(cfg, load_parameters(data_file, table, dev), max_batch_size=2, max_seq_len=32,
                               device=dev, fused=fused)
            ids = torch.tensor([[1, 5, 9, 33, 70, 100, 4, 8]], device=dev)
            pos = torch.arange(8, device=dev)[None]
            padded_ids = torch.stack([torch.cat([torch.zeros(2, dtype=torch.long, device=dev), ids[0, :6]]), ids[0]])
            mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8], dtype=torch.bool, device=dev)
            ppos = (mask.long().cumsum(1) - 1).clamp_min(0)
            with torch.no_grad():
                whole = model.prefill(ids, pos, 0, torch.ones(1, 8, dtype=torch.bool, device=dev), 0,
                                      causal_only=True)[0]
                padded = model.prefill(padded_ids, ppos, 0, mask, 0, causal_only=False)
                steps = [model.decode(torch.tensor([3 + i, 4 + i], device=dev), ppos[:, -1] + 1 + i,
                                      torch.tensor([8 + i], device=dev)) for i in range(3)]
            outs[fused] = (whole, padded[0, 2:], padded[1], *steps)
        for i, (want, got) in enumerate(zip(*outs.values(), strict=True)):
            assert float((got - want).abs().max()) < 1e-4, f"{name}: output {i}"


@pytest.mark.gpu
def test_infer_and_bench_cli_run_unchanged(cuda_engines, tmp_path, capsys) -> None:
    _, cuda_dir, _ = cuda_engines["fp16"]
    requests = tmp_path / "req.json"
    requests.write_text(json.dumps({"requests": [
        {"id": "a", "prompt": "Once upon a time", "max_new_tokens": 16},
        {"id": "b", "prompt": "The cat", "max_new_tokens": 8, "temperature": 0.8, "seed": 3}]}))
    assert main(["infer", "--engine-dir", str(cuda_dir), "--input-file", str(requests),
                 "--output-file", str(tmp_path / "out.json")]) == 0
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert [len(r["output_ids"]) for r in responses] == [16, 8] or any(r["finish_reason"] == "eos" for r in responses)
    capsys.readouterr()
    assert main(["bench", "--engine-dir", str(cuda_dir), "--mode", "decode", "--batch-size", "4",
                 "--past-len", "64", "--iterations", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens_per_step"] == 4 and report["tokens_per_s"] > 0


@pytest.mark.gpu
def test_env_reports_the_gpu_and_its_sm(capsys) -> None:
    assert main(["env"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "torch-cuda" in report["backends"]
    major, minor = (int(x) for x in report["gpu"]["sm"].split("."))
    assert (major, minor) == torch.cuda.get_device_capability(0)



@pytest.mark.gpu
def test_session_run_takes_the_export_signature(cuda_engines) -> None:
    """``run`` (numpy past in, present out, like the ORT session) gives the logits of a whole-sequence prefill."""
    from edgellm.runtime import Engine

    _, cuda_dir, _ = cuda_engines["fp32"]
    engine = Engine.open(cuda_dir)
    cfg = engine.config
    ids = np.array([engine.encode("Once upon a time there was a")], dtype=np.int64)
    n = ids.shape[1]
    whole = engine.logits(ids[0].tolist())
    empty = np.zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim), dtype=np.float32)
    past = {f"past_key_values.{i}.{kv}": empty for i in range(cfg.num_hidden_layers) for kv in ("key", "value")}
    first = engine.session.run({"input_ids": ids[:, :-1], "attention_mask": np.ones((1, n - 1), dtype=np.int64),
                                "position_ids": np.arange(n - 1)[None], **past})
    present = {f"past_key_values.{i}.{kv}": first[f"present.{i}.{kv}"]
               for i in range(cfg.num_hidden_layers) for kv in ("key", "value")}
    assert first["present.0.key"].shape == (1, cfg.num_key_value_heads, n - 1, cfg.head_dim)
    last = engine.session.run({"input_ids": ids[:, -1:], "attention_mask": np.ones((1, n), dtype=np.int64),
                               "position_ids": np.array([[n - 1]]), "logits_positions": np.array([0]), **present})
    np.testing.assert_allclose(first["logits"][0], whole[:-1], atol=1e-4)
    np.testing.assert_allclose(last["logits"][0, 0], whole[-1], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gemv_with_dependent_launch_and_prefetch_equals_without_and_torch(dtype: torch.dtype) -> None:
    """kernels.gemv at the Qwen2.5-0.5B decode shapes (q/k/v, o_proj and down split along K into partial sums;
    gate/up with SiLU * up), one and sixteen rows: launched as programmatic dependent launches with the weight slice
    prefetched into L2 (Hopper and newer), and without the prefetch, the result is bit for bit the plain launch's (the
    wait comes before x is read; the prefetch only moves weights closer), and all equal torch's product."""
    from edgellm.backends.torch_cuda import kernels

    dev = torch.device("cuda")
    shipped, shipped_prefetch = kernels.PDL, kernels.PDL_PREFETCH
    kernels.PDL = True
    try:
        assert kernels.pdl(dev) is (torch.cuda.get_device_capability() >= (9, 0))
    finally:
        kernels.PDL = shipped
    gen = torch.Generator(device=dev).manual_seed(0)
    for k, n, silu, partial in ((896, 1152, False, True), (896, 896, False, True), (896, 2 * 4864, True, False),
                                (4864, 896, False, True), (896, 8, False, False)):
        w = (torch.randn((k, n), generator=gen, device=dev) / k**0.5).to(dtype)
        for m in (1, 16):
            x = torch.randn((m, k), generator=gen, device=dev).to(dtype)
            got = {}
            for on, prefetch in ((True, True), (True, False), (False, True)):
                kernels.PDL, kernels.PDL_PREFETCH = on, prefetch
                try:
                    got[on, prefetch] = kernels.gemv(x, w, silu=silu, partial=partial)
                finally:
                    kernels.PDL, kernels.PDL_PREFETCH = shipped, shipped_prefetch
            plain = got[False, True]
            assert torch.equal(got[True, True], plain), (k, n, silu, partial, m)
            assert torch.equal(got[True, False], plain), (k, n, silu, partial, m, "no prefetch")
            out = plain.sum(0) if partial else plain
            ref = x.float() @ w.float()
            if silu:
                gate, up = ref[:, : n // 2].to(dtype).float(), ref[:, n // 2:].to(dtype).float()
                ref = (gate / (1 + torch.exp(-gate))).to(dtype).float() * up
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            assert float((out.float() - ref).abs().max()) < tol, (k, n, silu, partial, m)


@pytest.mark.gpu
def test_the_decode_graph_gives_the_same_logits_with_and_without_dependent_launch(cuda_engines) -> None:
    """The bf16 engine's captured decode step with every kernel a programmatic dependent launch (Hopper and newer;
    shipped on, without the GEMVs' prefetch) against the plain launch: the same logits, bit for bit, step after step
    at batch 1 and batch 3."""
    from edgellm.backends.torch_cuda import kernels
    from edgellm.runtime import Engine

    _, cuda_dir, _ = cuda_engines["bf16"]
    ids = np.array([Engine.open(cuda_dir).encode("Once upon a time there was a little")], dtype=np.int64)
    runs = {}
    shipped = kernels.PDL
    for mode in (True, False):
        kernels.PDL = mode
        try:
            engine = Engine.open(cuda_dir)
            got = []
            for batch in (1, 3):
                cache = engine.new_cache(batch)
                rows = np.repeat(ids, batch, axis=0)
                engine.step(rows[:, :4], cache)
                got += [engine.step(rows[:, i:i + 1], cache) for i in range(4, rows.shape[1])]
            runs[mode] = got
        finally:
            kernels.PDL = shipped
    assert len(runs[True]) == len(runs[False]) > 4
    for step, (got, want) in enumerate(zip(runs[True], runs[False], strict=True)):
        assert np.array_equal(got, want), step

@pytest.mark.gpu
def test_a_prompt_shape_seen_twice_prefills_from_a_graph_with_the_eager_logits_and_cache(cuda_engines,
                                                                                         monkeypatch) -> None:
    """The second request of a prompt shape captures its prefill as a CUDA graph, later ones replay it: logits and
    the cache's keys and values are bit for bit the eager prefill's, for new token ids each time; a shape seen
    once stays eager; at most PREFILL_GRAPHS shapes are kept, the least recently used dropped."""
    from edgellm.backends.torch_cuda import session as session_module
    from edgellm.runtime import Engine, GenerationRequest

    monkeypatch.setattr(session_module, "PREFILL_GRAPHS", 2)
    _, cuda_dir, _ = cuda_engines["bf16"]
    engine = Engine.open(cuda_dir)
    sess = engine.session
    assert not sess._prefill_graphs and not sess._prefill_seen  # the warm-up prefills count for nothing
    rng = np.random.default_rng(0)
    d = sess.device

    def prefill(ids: np.ndarray, *, eager: bool) -> tuple[np.ndarray, list[torch.Tensor]]:
        s = ids.shape[1]
        with torch.cuda.stream(sess.stream):
            if eager:
                out = sess.model.prefill(torch.from_numpy(ids).to(d), torch.arange(s, device=d)[None], 0,
                                         torch.ones((1, s), dtype=torch.bool, device=d), s - 1, causal_only=True)
            else:
                out = sess._prefill(ids, np.arange(s)[None], np.ones((1, s), dtype=np.int64), 0, s - 1)
            logits = out.cpu().numpy()
            cache = [kv[:, :1, :, :s].clone() for kv in sess.model.kv]
        sess.stream.synchronize()
        return logits, cache

    for s in (24, 40):
        for call in range(4):  # eager; captured and replayed; replayed twice
            ids = rng.integers(3, engine.config.vocab_size, size=(1, s), dtype=np.int64)
            got, got_cache = prefill(ids, eager=False)
            assert ((1, s, s - 1) in sess._prefill_graphs) is (call >= 1), (s, call)
            want, want_cache = prefill(ids, eager=True)
            assert np.array_equal(got, want), (s, call)
            assert all(torch.equal(a, b) for a, b in zip(got_cache, want_cache, strict=True)), (s, call)
    for _ in range(2):  # a third shape: the least recently used (24) goes
        prefill(rng.integers(3, engine.config.vocab_size, size=(1, 56), dtype=np.int64), eager=False)
    assert list(sess._prefill_graphs) == [(1, 40, 39), (1, 56, 55)]
    outs = [engine.generate([GenerationRequest(id="a", prompt="Once upon a time", max_new_tokens=8)])[0].output_ids
            for _ in range(3)]
    assert outs[0] == outs[1] == outs[2]  # eager, captured, replayed: one answer
