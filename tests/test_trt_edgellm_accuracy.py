"""TensorRT Edge-LLM's accuracy check compares text (toolchains/tensorrt_edgellm/accuracy.py): an engine that writes
the reference's own greedy continuation matches it in full, also where that text spells characters in byte tokens
(random weights write them often; real models do for emoji, CJK and curly quotes)."""

from __future__ import annotations

from pathlib import Path

from edgefarm.toolchains.tensorrt_edgellm.accuracy import TextLimits, compare_text, judge
from edgellm.reference import ReferenceSettings, compute_reference, load_reference
from edgellm.runtime.tokenizer import TextCodec
from edgellm.synth import make_checkpoint


def test_the_references_own_text_matches_in_full_even_through_byte_tokens(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path / "ckpt", "llama", seed=3)
    reference = tmp_path / "ref.npz"
    compute_reference(checkpoint, ReferenceSettings(max_tokens=64, window=32, greedy_tokens=48)).save(reference)
    ref, codec = load_reference(reference), TextCodec(checkpoint / "tokenizer.json")
    bodies = [[t for t in ids if t not in ref.eos_ids] for ids in ref.greedy_ids]
    texts = [codec.decode(b) for b in bodies]
    # the case this guards: some prefix of a continuation ends inside a character (its decode ends in U+FFFD)
    assert any(codec.decode(b[:k]).endswith("\ufffd") and not codec.decode(b).startswith(codec.decode(b[:k]))
               for b in bodies for k in range(1, len(b))), "no byte-token character in the continuations"

    same = compare_text(reference, checkpoint / "tokenizer.json", texts)
    assert [(p["matched"], p["divergence_margin"]) for p in same] == [(len(b), 0.0) for b in bodies]
    assert judge(same, TextLimits(0.25, None))["passed"]

    # an engine that parts half way is still caught there, with the reference's lead at that step
    half = len(bodies[0]) // 2
    cut = texts[:]
    cut[0] = codec.decode(bodies[0][:half]).rstrip("\ufffd") + "zzzz"
    parted = compare_text(reference, checkpoint / "tokenizer.json", cut)[0]
    assert half - 3 <= parted["matched"] <= half, parted["matched"]
    assert parted["divergence_margin"] > 0.0
