"""Gemma-3 text and Gemma-2 (one module each: edgellm/models/gemma3.py, gemma2.py): reconciled tensor by tensor,
their fp32 export's greedy continuation over 16 tokens from a prompt longer than the window equal to transformers'
on ONNX Runtime, and the torch-cuda decoder's math past the window on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from edgellm.backends.torch_cuda import weight_table
from edgellm.backends.torch_cuda.decoder import GpuDecoder, load_parameters
from edgellm.checkpoint import Checkpoint
from edgellm.checkpoint.closest import closest_family
from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.config import ModelConfig
from edgellm.errors import UnsupportedError
from edgellm.models import family_for
from edgellm.runtime import Engine, GenerationRequest
from edgellm.synth import make_checkpoint

PROMPT = [1, 17, 300, 45, 9, 88, 123, 7, 260, 33, 5, 71, 402, 18]  # longer than every window below (8, 4)
CASES = {
    "gemma3": ("gemma3_text", {}),  # local, local, global (sliding_window_pattern 3), window 8
    # 4B-like: linear scaling of the global layers' RoPE, a shorter window, final soft-capping
    "gemma3_scaled": ("gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 4,
                                      "final_logit_softcapping": 30.0, "tie_word_embeddings": True}),
    "gemma2": ("gemma2", {}),  # local, global; attention and final soft-capping
    "gemma2_window4": ("gemma2", {"sliding_window": 4, "num_hidden_layers": 3}),
}


@pytest.fixture(scope="module")
def gemmas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("gemma")
    out = {}
    for name, (family, overrides) in CASES.items():
        ckpt = make_checkpoint(root / name, family, **overrides)
        export_checkpoint(ckpt, root / f"onnx_{name}", "fp32")
        out[name] = (ckpt, root / f"onnx_{name}")
    return out


def test_reconciled_tensor_by_tensor(gemmas) -> None:
    ckpt, _ = gemmas["gemma3"]
    ck = Checkpoint.open(ckpt)
    rec = ck.reconciliation
    cfg = ModelConfig.load(ckpt)
    family = family_for(cfg)
    names = family.expected_parameters(cfg)
    assert not ck.problems and rec.family == "gemma3_text" and sorted(rec.matched) == sorted(names)
    assert not rec.missing and not rec.unexpected and not rec.shape_mismatches
    for i in range(cfg.num_hidden_layers):
        for part in ("pre_feedforward_layernorm", "post_feedforward_layernorm", "self_attn.q_norm",
                     "self_attn.k_norm"):
            assert f"model.layers.{i}.{part}.weight" in names
    assert family.layer_windows(cfg) == (8, 8, None)
    found = closest_family(ckpt)  # bring-up's rung 2: every field the config sets is one the family reads
    assert (found["family"], found["classification"], found["registered"]) == (
        "gemma3_text", "configuration-only variant", True)
    g2 = ModelConfig.load(gemmas["gemma2"][0])
    assert family_for(g2).layer_windows(g2) == (8, None)
    assert "model.layers.0.self_attn.q_norm.weight" not in family_for(g2).expected_parameters(g2)


def test_greedy_past_the_window_equals_transformers_on_onnx_runtime(gemmas, tmp_path) -> None:
    for name, (ckpt, onnx_dir) in gemmas.items():
        build_engine(onnx_dir, tmp_path / name, "ort", max_batch_size=2, max_seq_len=64)
        engine = Engine.open(tmp_path / name)
        ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = ref(torch.tensor([PROMPT])).logits[0].numpy()
            want = [ref.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False)[0, len(p):].tolist()
                    for p in (PROMPT, PROMPT[:10])]
        assert np.abs(engine.logits(PROMPT) - logits).max() < 1e-4, name
        out = engine.generate([GenerationRequest(id=str(i), input_ids=p, max_new_tokens=16)
                               for i, p in enumerate((PROMPT, PROMPT[:10]))])  # left-padded batch
        assert [r.output_ids for r in out] == want, name
        assert len(want[0]) == 16, name


def test_torch_cuda_decoder_past_the_window_matches_transformers_on_the_cpu(gemmas) -> None:
    n = len(PROMPT)
    for name, (ckpt, onnx_dir) in gemmas.items():
        cfg = ModelConfig.load(onnx_dir)
        table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
        model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=1,
                           max_seq_len=32, device=torch.device("cpu"))
        hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        ids = torch.tensor([PROMPT])
        pos = torch.arange(n)[None]
        with torch.no_grad():
            ref = hf(ids).logits[0]
            whole = model.prefill(ids, pos, 0, torch.ones(1, n, dtype=torch.bool), 0, causal_only=True)[0]
            model.prefill(ids[:, :6], pos[:, :6], 0, torch.ones(1, 6, dtype=torch.bool), 5, causal_only=True)
            steps = torch.stack([model.decode(ids[0, i:i + 1], pos[0, i:i + 1], torch.tensor([i]))[0]
                                 for i in range(6, n)])
        assert float((whole - ref).abs().max()) < 1e-4, name
        assert float((steps - ref[6:]).abs().max()) < 1e-4, name


def test_gemma3_refuses_bidirectional_attention_and_attention_softcapping(tmp_path) -> None:
    base = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 512, "hidden_activation": "gelu_pytorch_tanh"}
    with pytest.raises(UnsupportedError, match="use_bidirectional_attention = true"):
        family_for(ModelConfig.from_dict({**base, "use_bidirectional_attention": True}))
    with pytest.raises(UnsupportedError, match=r"attn_logit_softcapping = 50\.0"):
        family_for(ModelConfig.from_dict({**base, "attn_logit_softcapping": 50.0}))


@pytest.mark.parametrize("method", ["int4_awq", "int8_sq"])
def test_a_quantized_gemma_export_is_the_quantized_decoder_math(tmp_path, method: str) -> None:
    """Gemma's (1 + w) norms take no folded smoothing scale: each quantized linear keeps its own, and the engine
    computes what the quantized decoder computes."""
    from edgellm.compiler.quantized import load_quantized_decoder
    from edgellm.synth_quant import calibration_ids, quantize_rtn

    src = make_checkpoint(tmp_path / "ck", "gemma3_text")
    q = quantize_rtn(src, tmp_path / "q", method, calibration_ids(src), group_size=32)
    cfg = ModelConfig.load(q)
    decoder = load_quantized_decoder(q, cfg, family_for(cfg), Checkpoint.open(q).reconciliation.quant_layout,
                                     fold_input_smoothing=False)
    export_checkpoint(q, tmp_path / "onnx")
    build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", max_seq_len=64)
    n = len(PROMPT)
    with torch.no_grad():
        want = decoder(torch.tensor([PROMPT]), torch.ones(1, n, dtype=torch.long), torch.arange(n)[None],
                       *decoder.empty_past(1))[0][0].numpy()
    assert np.abs(Engine.open(tmp_path / "engine").logits(PROMPT) - want).max() < 1e-4
    if method == "int8_sq":  # u8 x u8 integer GEMMs: exact on every x86 CPU (u8 x s8 saturates without VNNI)
        import onnx

        graph = onnx.load(str(next((tmp_path / "onnx").glob("*.onnx"))), load_external_data=False).graph
        dtypes = {t.name: t.data_type for t in graph.initializer}
        gemms = [n for n in graph.node if n.op_type == "MatMulIntegerToFloat"]
        assert gemms and {dtypes.get(n.input[1]) for n in gemms} == {onnx.TensorProto.UINT8}
        constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                     if n.op_type == "Constant"}
        assert {(constants[n.input[5]].dtype.name, int(constants[n.input[5]])) for n in gemms} == {("uint8", 128)}
