"""Sliding-window attention on every backend: each layer's window from the config (``layer_types``,
``sliding_window_pattern``, ``max_window_layers``, ``use_sliding_window``), correct past the window — a prompt
longer than it and a generation going on past it — against transformers: the fp32 export on ONNX Runtime (greedy
over 16 tokens, left-padded batches too) and the torch-cuda decoder's math on the CPU (logits of prefill and
decode steps). The same on CUDA is ``@pytest.mark.gpu`` (a GPU machine runs it with ``pytest -m gpu``).

The KV cache of a windowed layer holds its last ``window`` positions only (the window of its last query), on both
backends: ONNX Runtime's host caches (the in-place ``KVBuffer`` and the growing ``KVCache``) and the torch-cuda
decoder's ring; full-attention layers hold every position. Such a cache steps back over one decode step (a
benchmark's rewind) and refuses to go further back than it holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from edgellm.backends.torch_cuda import weight_table
from edgellm.backends.torch_cuda.decoder import GpuDecoder, load_parameters
from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.config import ModelConfig
from edgellm.models import family_for
from edgellm.runtime import Engine, GenerationRequest, KVBuffer, KVCache
from edgellm.synth import make_checkpoint

PROMPT = [1, 17, 300, 45, 9, 88, 123, 7, 260, 33, 5, 71, 402, 18]  # 14 tokens, the windows are 4 and 5
WINDOWED = {
    # Mistral: every layer windowed
    "mistral": ("mistral", dict(sliding_window=4)),
    # Qwen2: layers from max_window_layers on windowed (transformers writes the layer_types it derives)
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    # Qwen3: explicit layer_types, full then windowed
    "qwen3": ("qwen3", dict(use_sliding_window=True, sliding_window=5,
                            layer_types=["full_attention", "sliding_attention"])),
}


def _reference(ckpt: Path, prompts: list[list[int]], new: int = 16) -> list[list[int]]:
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            greedy = ref.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)
            out.append(greedy[0, len(ids):].tolist())
    return out


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (checkpoint, fp32 export) of each windowed config."""
    root = tmp_path_factory.mktemp("windowed")
    out = {}
    for name, (family, overrides) in WINDOWED.items():
        ckpt = make_checkpoint(root / name, family, **overrides)
        export_checkpoint(ckpt, root / f"onnx_{name}", "fp32")
        out[name] = (ckpt, root / f"onnx_{name}")
    return out


def test_each_layer_takes_the_window_transformers_gives_it() -> None:
    def windows(family: str, **raw: object) -> tuple[int | None, ...]:
        base = {"model_type": family, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                "num_attention_heads": 4, "vocab_size": 512}
        cfg = ModelConfig.from_dict({**base, **raw})
        return family_for(cfg).layer_windows(cfg)

    assert windows("mistral", sliding_window=8) == (8, 8, 8, 8)
    assert windows("mistral", sliding_window=None) == (None,) * 4
    assert windows("qwen2", sliding_window=8, use_sliding_window=False, max_window_layers=1) == (None,) * 4
    assert windows("qwen2", sliding_window=8, use_sliding_window=True, max_window_layers=2) == (None, None, 8, 8)
    assert windows("qwen3", sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2) == (
        8, None, 8, None)
    assert windows("llama", sliding_window=8, sliding_window_pattern=2) == (8, None, 8, None)
    for name, (family, overrides) in WINDOWED.items():  # what transformers' own config derives
        hf = getattr(transformers, family_for(ModelConfig.from_dict(
            {"model_type": family, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 512})).hf_config)(num_hidden_layers=2, **overrides)
        types = getattr(hf, "layer_types", None) or ["sliding_attention"] * 2
        cfg = ModelConfig.from_dict({**hf.to_dict(), "model_type": family})
        assert family_for(cfg).layer_types(cfg) == tuple(types), name


def test_greedy_past_the_window_equals_transformers_on_onnx_runtime(windowed, tmp_path) -> None:
    """A prompt longer than the window, 16 tokens generated past it; a left-padded batch of two prompts (the
    window counts cache positions, padding included, as transformers' mask does)."""
    prompts = [PROMPT, PROMPT[:9]]
    for name, (ckpt, onnx_dir) in windowed.items():
        build_engine(onnx_dir, tmp_path / name, "ort", max_batch_size=2, max_seq_len=64)
        engine = Engine.open(tmp_path / name)
        want = _reference(ckpt, prompts)
        alone = engine.generate([GenerationRequest(id="a", input_ids=PROMPT, max_new_tokens=16)])[0]
        assert alone.output_ids == want[0], name
        batch = engine.generate([GenerationRequest(id=str(i), input_ids=p, max_new_tokens=16)
                                 for i, p in enumerate(prompts)])
        assert [r.output_ids for r in batch] == want, name


@pytest.fixture(scope="module")
def ort_engines(windowed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> ONNX Runtime engine of the fp32 export (GroupQueryAttention) of each windowed config."""
    root = tmp_path_factory.mktemp("windowed_engines")
    for name, (_, onnx_dir) in windowed.items():
        build_engine(onnx_dir, root / name, "ort", max_batch_size=2, max_seq_len=64)
    return {name: root / name for name in windowed}


def _held(cache) -> list[int]:
    return [int(k.shape[2]) for k in cache.keys] + [int(v.shape[2]) for v in cache.values]


def _window_bound(cache, windows: tuple[int | None, ...]) -> list[int]:
    """What each layer's cache may hold: every position, or a windowed layer's last ``window``."""
    return [cache.length if w is None else min(cache.length, w) for w in windows] * 2


@pytest.mark.parametrize("in_place", [True, False], ids=["KVBuffer", "KVCache"])
def test_a_windowed_layers_ort_cache_holds_its_window_only(windowed, ort_engines, in_place: bool) -> None:
    """A left-padded batch of a prompt longer than the window (prefilled in two chunks: the second over a past,
    row by row) and 16 greedy steps past it: after every step a windowed layer's keys and values hold its last
    ``window`` positions (the cache's bytes stop growing there), a full layer every position, and the tokens are
    transformers'."""
    prompts = [PROMPT, PROMPT[:9]]
    pad = len(PROMPT) - 9
    for name in ("mistral", "qwen3"):  # every layer windowed (4); full then windowed (5)
        engine = Engine.open(ort_engines[name])
        engine.session.kv_in_place = in_place
        windows = family_for(engine.config).layer_windows(engine.config)
        cache = engine.new_cache(2)
        assert isinstance(cache, KVBuffer if in_place else KVCache)
        ids = np.array([PROMPT, [0] * pad + PROMPT[:9]], dtype=np.int64)
        mask = np.array([[1] * len(PROMPT), [0] * pad + [1] * 9], dtype=np.int64)
        engine.step(ids[:, :6], cache, mask[:, :6])
        assert _held(cache) == _window_bound(cache, windows), name
        logits = engine.step(ids[:, 6:], cache, mask, last_only=True)
        out: list[list[int]] = [[], []]
        sizes = []
        for _ in range(16):
            assert _held(cache) == _window_bound(cache, windows), (name, cache.length)
            sizes.append(cache.nbytes())
            token = logits[:, -1].argmax(-1)
            for row, t in zip(out, token, strict=True):
                row.append(int(t))
            mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
            logits = engine.step(token[:, None], cache, mask, last_only=True)
        assert cache.length == len(PROMPT) + 16
        assert out == _reference(windowed[name][0], prompts), name
        if all(w is not None for w in windows):  # nothing grows: 2 rows x (K, V) x layers x kv heads x window x dim
            c = engine.config
            assert set(sizes) == {2 * 2 * c.num_hidden_layers * c.num_key_value_heads * 4 * c.head_dim * 4}, name


@pytest.mark.parametrize("in_place", [True, False], ids=["KVBuffer", "KVCache"])
def test_a_windowed_cache_steps_back_over_one_decode_step_only(ort_engines, in_place: bool) -> None:
    """``truncate`` (a benchmark's rewind to its past length) goes back over one decode step and gives the same
    logits again; further back than a windowed layer holds is refused, naming the window."""
    engine = Engine.open(ort_engines["qwen3"])
    engine.session.kv_in_place = in_place
    cache = engine.new_cache(1)
    engine.step(np.array([PROMPT]), cache)
    first = engine.step(np.array([[7]]), cache)
    cache.truncate(len(PROMPT))
    assert np.array_equal(engine.step(np.array([[7]]), cache), first)
    engine.step(np.array([[9]]), cache)
    with pytest.raises(ValueError, match=r"truncate length 14: layers of attention window 5 hold positions 11\.\.15 "
                                         r"only, and going back to 14 needs 10\.\.13"):
        cache.truncate(len(PROMPT))
    cache.truncate(0)
    assert cache.length == 0 and _held(cache) == [0] * 4
    assert np.array_equal(engine.step(np.array([PROMPT]), cache)[0], engine.logits(PROMPT))


def test_the_window_changes_the_tokens(windowed) -> None:
    """The windowed checkpoint is not its full-attention twin: the comparison above would catch a window ignored."""
    ckpt, _ = windowed["mistral"]
    full = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, sliding_window=None).eval()
    with torch.no_grad():
        assert not torch.allclose(full(torch.tensor([PROMPT])).logits, transformers.AutoModelForCausalLM
                                  .from_pretrained(ckpt, dtype=torch.float32).eval()(torch.tensor([PROMPT])).logits)


def _gpu_decoder_matches(ckpt: Path, onnx_dir: Path, device: torch.device, limit: float) -> None:
    cfg = ModelConfig.load(onnx_dir)
    table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
    model = GpuDecoder(cfg, load_parameters(data_file, table, device), max_batch_size=2, max_seq_len=32,
                       device=device)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    n = len(PROMPT)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = hf(ids).logits[0].float()
        d = ids.to(device)
        pos = torch.arange(n, device=device)[None]
        whole = model.prefill(d, pos, 0, torch.ones(1, n, dtype=torch.bool, device=device), 0, causal_only=True)[0]
        model.prefill(d[:, :8], pos[:, :8], 0, torch.ones(1, 8, dtype=torch.bool, device=device), 7,
                      causal_only=True)
        steps = torch.stack([model.decode(d[0, i:i + 1], pos[0, i:i + 1], torch.tensor([i], device=device))[0]
                             for i in range(8, n)])
        pad = 3
        padded_ids = torch.stack([torch.cat([torch.zeros(pad, dtype=torch.long), ids[0, :n - pad]]), ids[0]])
        mask = torch.tensor([[0] * pad + [1] * (n - pad), [1] * n], dtype=torch.bool)
        padded = model.prefill(padded_ids.to(device), (mask.long().cumsum(1) - 1).clamp_min(0).to(device), 0,
                               mask.to(device), 0, causal_only=False)
        # the padded batch again: prefilled in two chunks (the second attends to the ring's positions before it),
        # then decoded past the window
        cut, d_ids, d_pos, d_mask = 8, padded_ids.to(device), (mask.long().cumsum(1) - 1).clamp_min(0).to(device), \
            mask.to(device)
        chunks = [model.prefill(d_ids[:, :cut], d_pos[:, :cut], 0, d_mask[:, :cut], 0, causal_only=False),
                  model.prefill(d_ids[:, cut:n - 3], d_pos[:, cut:n - 3], cut, d_mask[:, cut:n - 3], 0,
                                causal_only=False)]
        chunks += [model.decode(d_ids[:, i], d_pos[:, i], torch.tensor([i], device=device))[:, None]
                   for i in range(n - 3, n)]
        chunked = torch.cat(chunks, dim=1)
    # the left-padded row sees its window over cache columns, padding included: transformers' own padded forward
    with torch.no_grad():
        ref_padded = hf(padded_ids, attention_mask=mask.long()).logits[0].float()
    for what, got, want in (("prefill", whole, ref), ("decode past the window", steps, ref[8:]),
                            ("left-padded row", padded[0, pad:], ref_padded[pad:]), ("full row", padded[1], ref),
                            ("left-padded row in chunks", chunked[0, pad:], ref_padded[pad:]),
                            ("full row in chunks", chunked[1], ref)):
        assert float((got.cpu() - want).abs().max()) < limit, what
    # a windowed layer's cache is a ring of its window's positions, a full layer's the engine's whole length
    assert [kv.shape[3] for kv in model.kv] == [w or model.capacity for w in model.windows]
    c = cfg
    assert model.kv_bytes() == sum(2 * 2 * c.num_key_value_heads * (w or model.capacity) * c.head_dim * 4
                                   for w in model.windows)


def test_torch_cuda_decoder_past_the_window_matches_transformers_on_the_cpu(windowed) -> None:
    """The decoder's prefill (whole, chunked over its past, left-padded) and decode steps past the window equal
    transformers' logits, a windowed layer's cache holding its window only (a ring of ``window`` positions)."""
    for ckpt, onnx_dir in windowed.values():
        _gpu_decoder_matches(ckpt, onnx_dir, torch.device("cpu"), 1e-4)


@pytest.mark.gpu
def test_torch_cuda_engine_past_the_window_equals_transformers_on_the_gpu(windowed, tmp_path) -> None:
    """On CUDA: the decoder's math (the layer modules: the fused kernels take no window) and a built torch-cuda
    engine's greedy continuation (its decode graphs captured mid-sequence too: their warm-ups must leave the rings
    as they were), against transformers; a windowed layer's cache a ring of its window, stepping back over one
    decode step only; ``run``'s presents of a windowed layer its last ``window`` positions."""
    device = torch.device("cuda")
    for name, (ckpt, onnx_dir) in windowed.items():
        _gpu_decoder_matches(ckpt, onnx_dir, device, 1e-3)
        # batch 1 and 3 warmed at open: batch 2's decode graph is captured after a prefill, below
        build_engine(onnx_dir, tmp_path / name, "torch-cuda", max_batch_size=3, max_seq_len=64)
        engine = Engine.open(tmp_path / name)
        want = _reference(ckpt, [PROMPT])[0]
        out = engine.generate([GenerationRequest(id="a", input_ids=PROMPT, max_new_tokens=16)])[0]
        assert out.output_ids == want, name
        model, cfg = engine.session.model, engine.config
        windows = family_for(cfg).layer_windows(cfg)
        assert [kv.shape[3] for kv in model.kv] == [w or model.capacity for w in windows], name
        # step by step, batch 2, then back one step
        cache = engine.new_cache(2)
        ids = np.array([PROMPT, PROMPT], dtype=np.int64)
        logits = engine.step(ids, cache, last_only=True)
        steps = []
        for _ in range(8):
            token = logits[:, -1].argmax(-1)
            steps.append(int(token[0]))
            logits = engine.step(token[:, None], cache, last_only=True)
        assert steps == want[:8], name
        before = engine.step(np.array([[3], [3]]), cache)
        cache.truncate(cache.length - 1)
        np.testing.assert_allclose(engine.step(np.array([[3], [3]]), cache), before, atol=1e-5)
        if any(windows):
            with pytest.raises(ValueError, match="layers of attention window"):
                cache.truncate(len(PROMPT))
        # the export's signature: a windowed layer's present holds its last window positions
        n = len(PROMPT)
        empty = np.zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim), dtype=np.float32)
        past = {f"past_key_values.{i}.{kv}": empty for i in range(cfg.num_hidden_layers) for kv in ("key", "value")}
        first = engine.session.run({"input_ids": np.array([PROMPT[:-1]]), "attention_mask": np.ones((1, n - 1),
                                    dtype=np.int64), "position_ids": np.arange(n - 1)[None], **past})
        present = {f"past_key_values.{i}.{kv}": first[f"present.{i}.{kv}"]
                   for i in range(cfg.num_hidden_layers) for kv in ("key", "value")}
        assert [first[f"present.{i}.key"].shape[2] for i in range(cfg.num_hidden_layers)] == [
            n - 1 if w is None else min(n - 1, w) for w in windows], name
        last = engine.session.run({"input_ids": np.array([PROMPT[-1:]]), "attention_mask": np.ones((1, n),
                                   dtype=np.int64), "position_ids": np.array([[n - 1]]),
                                   "logits_positions": np.array([0]), **present})
        np.testing.assert_allclose(last["logits"][0, 0], engine.logits(PROMPT)[-1], atol=1e-4)


def test_a_windowed_model_runs_the_layer_modules_even_where_the_kernels_are_asked_for(windowed) -> None:
    """The torch-cuda session asks for the fused kernels wherever Triton imports; they implement full attention only,
    so a windowed model takes the layer modules (checked above) instead of the kernels' unwindowed attention."""
    onnx_dir = windowed["qwen2"][1]
    cfg = ModelConfig.load(onnx_dir)
    table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
    model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=1,
                       max_seq_len=32, device=torch.device("cpu"), fused=True)
    assert model.fused is False and model.windows == (None, 4) and not model.decoder.plain
