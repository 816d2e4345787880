"""The runtime on stories260K: greedy equals transformers, batching, streaming, sampling, stop strings, the KV
cache, the request file's strict validation and the engine's limits."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

from edgellm.cli import main
from edgellm.errors import ConfigurationError
from edgellm.runtime import Engine, GenerationRequest, KVBuffer, KVCache
from tests.fixtures.engines import build

PROMPT = "Once upon a time"
PROMPTS = [("a", "Once upon a time", 64), ("b", "The dog", 40), ("c", "Lily and Tom went to the park to play", 20)]


@pytest.fixture(scope="module")
def engine(stories_engine) -> Engine:
    return Engine.open(stories_engine.engine_dir)


def _infer(tmp_path, engine_dir, payload, capsys):
    req, out = tmp_path / "req.json", tmp_path / "out.json"
    req.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    rc = main(["infer", "--engine-dir", str(engine_dir), "--input-file", str(req), "--output-file", str(out)])
    captured = capsys.readouterr()
    return rc, (json.loads(out.read_text()) if rc == 0 else None), captured.err


def test_cli_greedy_equals_transformers(stories_engine, tmp_path, capsys):
    tok = transformers.AutoTokenizer.from_pretrained(stories_engine.ckpt_dir)
    ref = transformers.AutoModelForCausalLM.from_pretrained(stories_engine.ckpt_dir, dtype=torch.float32).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids[0, 0].item() == 1  # BOS from the tokenizer's post-processor
    with torch.no_grad():
        expected = ref.generate(ids, max_new_tokens=64, do_sample=False)[0, ids.shape[1]:].tolist()
    rc, out, err = _infer(tmp_path, stories_engine.engine_dir,
                          {"requests": [{"id": "r1", "prompt": PROMPT, "max_new_tokens": 64, "temperature": 0.0}]},
                          capsys)
    assert rc == 0, err
    (resp,) = out["responses"]
    assert resp["id"] == "r1" and resp["output_ids"] == expected
    assert resp["finish_reason"] == ("eos" if 2 in expected else "length")
    assert resp["text"] == tok.decode(expected, skip_special_tokens=True)
    assert resp["timings"]["ttft_ms"] > 0 and resp["timings"]["ms_per_token"] > 0


def test_batched_equals_alone_and_streaming(engine):
    reqs = [GenerationRequest(id=i, prompt=p, max_new_tokens=n) for i, p, n in PROMPTS]
    batched = engine.generate(reqs)
    alone = [engine.generate([r])[0] for r in reqs]
    assert [b.output_ids for b in batched] == [a.output_ids for a in alone]
    assert [len(b.output_ids) for b in batched] == [64, 40, 20]
    assert list(engine.stream(reqs[0])) == alone[0].output_ids
    # more requests than max_batch_size run in several batches, results stay in request order
    many = engine.generate([GenerationRequest(id=str(i), prompt=PROMPTS[i % 3][1], max_new_tokens=8)
                            for i in range(6)])
    assert [m.id for m in many] == [str(i) for i in range(6)]
    assert many[0].output_ids == many[3].output_ids == alone[0].output_ids[:8]


def test_seeded_sampling_is_reproducible(engine):
    def sample(seed, extra=()):
        r = GenerationRequest(id="s", prompt=PROMPT, temperature=0.9, top_k=50, top_p=0.95, seed=seed,
                              max_new_tokens=32)
        return engine.generate([r, *extra])[0].output_ids

    first = sample(7)
    assert sample(7) == first
    assert sample(7, [GenerationRequest(id="x", prompt="The dog", max_new_tokens=5)]) == first
    assert sample(8) != first
    greedy = engine.generate([GenerationRequest(id="g", prompt=PROMPT, max_new_tokens=32)])[0].output_ids
    assert first != greedy


def test_stop_strings(engine):
    full = engine.generate([GenerationRequest(id="g", prompt=PROMPT, max_new_tokens=64)])[0]
    stop = "Lily"
    assert stop in full.text
    out = engine.generate([GenerationRequest(id="s", prompt=PROMPT, max_new_tokens=64, stop=[stop])])[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert out.output_ids == full.output_ids[: len(out.output_ids)] and len(out.output_ids) < 64


def test_step_cache_truncate_and_copy(engine):
    ids = engine.encode("Once upon a time there was a little girl")
    full = engine.logits(ids)
    cache = engine.new_cache(1)
    assert isinstance(cache, KVBuffer) and cache.length == 0 and cache.batch_size == 1  # fp32: filled in place
    engine.step(np.array([ids[:6]]), cache)
    snapshot = cache.copy()
    engine.step(np.array([ids[6:]]), cache)
    assert cache.length == len(ids) and snapshot.length == 6
    cache.truncate(6)
    again = engine.step(np.array([ids[6:]]), cache)[0]
    assert np.abs(again - full[6:]).max() < 1e-4
    decode = engine.step(np.array([ids[6:7]]), snapshot)[0]
    assert np.abs(decode - full[6:7]).max() < 1e-4


def test_left_padded_batch_prefilled_in_chunks_equals_each_row_alone(engine, stories_engine):
    """fp32 engines attend through ONNX Runtime's GroupQueryAttention, which refuses several new positions over a
    past for batch > 1: the session runs such a step row by row. Two left-padded rows prefilled in two chunks, then
    one decode step for both, give each row's logits computed alone."""
    ops = json.loads((stories_engine.engine_dir / "engine_manifest.json").read_text())["graph"]["op_counts"]
    assert ops.get("GroupQueryAttention") == 5 and "Softmax" not in ops  # one fused attention per layer
    a, b = engine.encode("Once upon a time there was a little girl"), engine.encode("The dog ran")
    pad = len(a) - len(b)
    ids = np.array([a, [engine.pad_id] * pad + b], dtype=np.int64)
    mask = np.array([[1] * len(a), [0] * pad + [1] * len(b)], dtype=np.int64)
    cache, cut = engine.new_cache(2), pad + 2  # the second chunk has a past for both rows
    first = engine.step(ids[:, :cut], cache, mask[:, :cut])
    second = engine.step(ids[:, cut:], cache, mask)
    nxt = np.array([[5], [7]], dtype=np.int64)
    last = engine.step(nxt, cache, np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1))
    for row, alone_ids in ((0, a), (1, b)):
        alone = engine.logits([*alone_ids, int(nxt[row, 0])])
        got = np.concatenate([first[row], second[row], last[row]])[-len(alone):]
        assert np.abs(got - alone).max() < 1e-4, row


def test_in_place_buffer_equals_the_growing_cache(stories_engine):
    """fp32 engines step over a preallocated KVBuffer that GroupQueryAttention fills in place (past and present
    bound to one buffer); the same engine stepping over a growing KVCache (each step's present outputs) gives the
    same logits, step after step (a left-padded batch prefilled in two chunks, then decoded), and the same batched
    generation."""
    in_place, growing = Engine.open(stories_engine.engine_dir), Engine.open(stories_engine.engine_dir)
    growing.session.kv_in_place = False
    assert isinstance(in_place.new_cache(2), KVBuffer) and isinstance(growing.new_cache(2), KVCache)
    a, b = in_place.encode("Once upon a time there was"), in_place.encode("The dog")
    pad = len(a) - len(b)
    ids = np.array([a, [0] * pad + b], dtype=np.int64)
    mask = np.array([[1] * len(a), [0] * pad + [1] * len(b)], dtype=np.int64)
    caches = in_place.new_cache(2, capacity=len(a) + 3), growing.new_cache(2)
    for chunk in (slice(0, pad + 2), slice(pad + 2, None)):  # the second chunk: batch 2 over a past, row by row
        outs = [e.step(ids[:, chunk], c, mask[:, :chunk.stop]) for e, c in zip((in_place, growing), caches,
                                                                                strict=True)]
        assert np.array_equal(*outs)
    for t in range(3):
        mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
        nxt = np.array([[3 + t], [9 + t]], dtype=np.int64)
        outs = [e.step(nxt, c, mask) for e, c in zip((in_place, growing), caches, strict=True)]
        assert np.array_equal(*outs), t
    assert [c.length for c in caches] == [len(a) + 3] * 2
    assert all(np.array_equal(k, g) for k, g in zip(caches[0].keys + caches[0].values,
                                                     caches[1].keys + caches[1].values, strict=True))
    reqs = [GenerationRequest(id=i, prompt=p, max_new_tokens=n) for i, p, n in PROMPTS]
    assert [r.output_ids for r in in_place.generate(reqs)] == [r.output_ids for r in growing.generate(reqs)]


def test_in_place_buffer_capacity_is_named(engine):
    with pytest.raises(ConfigurationError, match=r"KV capacity 4096 must be in 1\.\.512"):
        engine.new_cache(1, capacity=4096)
    cache = engine.new_cache(1, capacity=8)
    engine.step(np.ones((1, 6), dtype=np.int64), cache)
    with pytest.raises(ConfigurationError, match=r"sequence length 9 \(cache 6 \+ input 3\) exceeds the cache's "
                                                 r"capacity 8"):
        engine.step(np.ones((1, 3), dtype=np.int64), cache)
    assert cache.length == 6  # the refused step changed nothing


def test_messages_use_the_chat_template(ckpts, tmp_path, engine):
    with pytest.raises(ConfigurationError, match="the tokenizer has no chat template"):
        engine.generate([GenerationRequest(id="m", messages=[{"role": "user", "content": "hi"}])])
    ckpt = ckpts.copy("stories", tmp_path / "ck")
    tcfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    tcfg["chat_template"] = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                             "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tcfg))
    chat_engine = Engine.open(build(ckpt, tmp_path / "b").engine_dir)
    messages = [{"role": "user", "content": "Tell me a story about a cat."}]
    expected = transformers.AutoTokenizer.from_pretrained(ckpt).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert chat_engine.codec.encode_chat(messages) == list(expected)
    out = chat_engine.generate([GenerationRequest(id="m", messages=messages, max_new_tokens=8)])[0]
    alone = chat_engine.generate([GenerationRequest(id="i", input_ids=list(expected), max_new_tokens=8)])[0]
    assert out.output_ids == alone.output_ids


def test_limits_are_named(stories_engine, tmp_path, capsys):
    small = tmp_path / "small"
    assert main(["build", str(stories_engine.onnx_dir), str(small), "--max-batch-size", "2",
                 "--max-input-len", "8", "--max-seq-len", "32"]) == 0
    capsys.readouterr()
    long_prompt = "Once upon a time there was a little girl named Lily who loved to play"
    rc, _, err = _infer(tmp_path, small, {"requests": [{"id": "r", "prompt": long_prompt}]}, capsys)
    assert rc == 2 and "over the engine's max_input_len 8" in err
    rc, _, err = _infer(tmp_path, small, {"requests": [{"id": "r", "prompt": "Hi", "max_new_tokens": 40}]}, capsys)
    assert rc == 2 and "exceed the engine's max_seq_len 32 (KV capacity)" in err
    e = Engine.open(small)
    with pytest.raises(ConfigurationError, match="exceeds the engine's max_batch_size 2"):
        e.new_cache(3)
    cache = e.new_cache(1)
    e.step(np.ones((1, 8), dtype=np.int64), cache)
    with pytest.raises(ConfigurationError, match="exceeds the engine's max_seq_len 32"):
        for _ in range(4):
            e.step(np.ones((1, 8), dtype=np.int64), cache)


@pytest.mark.parametrize("payload, fragments", [
    ("{not json", ["request file is not valid JSON"]),
    ({"requests": []}, ["requests: List should have at least 1 item"]),
    ({"requests": [{"id": "a", "prompt": "x", "colour": 1, "max_new_tokens": "5", "temperature": "hot"}]},
     ["requests.0.colour: Extra inputs are not permitted", "requests.0.max_new_tokens",
      "requests.0.temperature"]),
    ({"requests": [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y", "top_p": 0}]},
     ["duplicate request id 'a'", "top_p 0.0 must be a number in (0, 1]"]),
    ({"requests": [{"id": "a"}, {"id": "b", "prompt": "x", "input_ids": [1]}]},
     ["request 'a': needs exactly one of prompt, messages, input_ids (got none)",
      "request 'b': needs exactly one of prompt, messages, input_ids (got prompt, input_ids)"]),
])
def test_bad_request_files_exit_2_naming_every_problem(stories_engine, tmp_path, capsys, payload, fragments):
    rc, _, err = _infer(tmp_path, stories_engine.engine_dir, payload, capsys)
    assert rc == 2
    assert err.count("\n") == 1  # one line, no traceback
    for fragment in fragments:
        assert fragment in err


def test_engine_files_are_verified(stories_engine, tmp_path, capsys):
    engine_dir = tmp_path / "engine"
    shutil.copytree(stories_engine.engine_dir, engine_dir)
    (engine_dir / "tokenizer.json").unlink()
    rc, _, err = _infer(tmp_path, engine_dir, {"requests": [{"id": "r", "prompt": "x"}]}, capsys)
    assert rc == 2 and "tokenizer.json: file listed in engine_manifest.json is missing" in err
    shutil.copyfile(stories_engine.engine_dir / "tokenizer.json", engine_dir / "tokenizer.json")
    with open(engine_dir / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ConfigurationError, match=r"model.onnx: size \d+ does not match engine_manifest.json"):
        Engine.open(engine_dir)
    rc, _, err = _infer(tmp_path, tmp_path / "nowhere", {"requests": [{"id": "r", "prompt": "x"}]}, capsys)
    assert rc == 2 and "engine directory not found" in err


def test_engine_contract_attributes(engine, stories_engine):
    assert engine.precision == "fp32" and engine.engine_dir == stories_engine.engine_dir
    assert (engine.max_batch_size, engine.max_input_len, engine.max_seq_len) == (4, 512, 512)
    assert engine.manifest["backend"] == "ort" and engine.config.vocab_size == 512
    assert engine.engine_bytes() > 1_000_000
    assert engine.decode(engine.encode(PROMPT)) == PROMPT
