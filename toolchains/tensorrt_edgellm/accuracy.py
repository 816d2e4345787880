"""Accuracy of a TensorRT Edge-LLM engine: greedy text agreement with the Hugging Face reference.

Why not ``edgellm eval``'s check: ``llm_inference`` returns text only (no logits, no token ids), so logits cosine,
perplexity and teacher-forced top-1 agreement cannot be computed on a TensorRT device. What can be checked is the
greedy continuation. The reference stage (on the host, transformers in fp32) stores, for each fixed prompt, its
greedy continuation and each step's largest logits; the engine runs the same prompts greedily (top_k 1,
``max_generate_length`` = the reference's greedy length, no chat template) and the farm compares on the host:

- ``matched``: the longest prefix of the reference's greedy tokens whose decoded text is a prefix of the engine's
  text (text, not re-tokenized ids: a decoded string re-encodes to other ids often enough to mislead);
- ``divergence_margin``: at the first divergence, the reference's lead (logits) of its own token over the token
  the engine wrote there (the first token of the engine's remaining text, re-encoded; a lower bound when that token
  is outside the stored top-K, ``margin_exact`` False). An engine may part from the reference only at a near-tie
  its rounding can flip; a broken engine parts at once, where the reference was sure (margins of several logits).

Thresholds: the library's own per-precision greedy limits (``edgellm/thresholds.py``: fp16 0.25 logits, bf16 0.5,
fp32 exact match) with the same reasoning, overridden by the catalog's limits for a model. Quantized precisions have
no library greedy limit (their engines are judged by perplexity there, which text cannot give): their rows need
``greedy_max_divergence_margin`` or ``greedy_min_match_fraction`` in the model's catalog thresholds, else the stage
is a configuration error naming what to set. Never borrowed from another precision.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError
from edgellm.reference import load_reference
from edgellm.runtime.tokenizer import TextCodec
from edgellm.thresholds import DEFAULTS
from edgellm.types import Precision

TEXT_CHECKS = ("greedy_max_divergence_margin", "greedy_min_match_fraction")


@dataclass(frozen=True)
class TextLimits:
    max_divergence_margin: float | None
    min_match_fraction: float | None


def text_limits(precision: Precision, catalog: dict[str, float]) -> TextLimits:
    base = DEFAULTS.get(precision)
    values = {k: getattr(base, k) if base is not None else None for k in TEXT_CHECKS}
    values.update({k: float(v) for k, v in catalog.items() if k in TEXT_CHECKS})
    if all(v is None for v in values.values()):
        raise ConfigurationError(
            f"no text-agreement limit for {precision.value} on tensorrt-edgellm (llm_inference gives text only; "
            f"the library's {precision.value} limits judge logits and perplexity): set "
            f"{' or '.join(TEXT_CHECKS)} in the model's thresholds in test_lists/models.yml")
    return TextLimits(values["greedy_max_divergence_margin"], values["greedy_min_match_fraction"])


def requests_for(reference: Path) -> list[dict[str, Any]]:
    """Our request list (``edgellm infer`` format) for the reference's prompts, greedy, its greedy length."""
    ref = load_reference(reference)
    n = int(ref.settings["greedy_tokens"])
    return [{"id": f"p{i}", "prompt": p, "max_new_tokens": n, "temperature": 0.0}
            for i, p in enumerate(ref.prompts)]


def compare_text(reference: Path, tokenizer: Path, texts: list[str]) -> list[dict[str, Any]]:
    """Per prompt: matched tokens, their share, the divergence margin (see the module doc)."""
    ref = load_reference(reference)
    codec = TextCodec(tokenizer)
    if len(texts) != len(ref.prompts):
        raise ConfigurationError(f"{len(texts)} engine outputs for {len(ref.prompts)} reference prompts")
    eos = ref.eos_ids
    out = []
    for prompt, ids, steps, text in zip(ref.prompts, ref.greedy_ids, ref.greedy_steps, texts, strict=True):
        body = [t for t in ids if t not in eos]
        # the longest agreeing prefix, searched from the whole continuation down: a byte-token run decodes as a
        # whole (one U+FFFD per byte when the run is not valid UTF-8), so a shorter prefix can read otherwise than
        # the same tokens inside the longer text
        matched = next((k for k in range(len(body), 0, -1) if text.startswith(_complete(codec, body[:k]))), 0)
        full = codec.decode(body)
        margin, exact = 0.0, True
        if matched < len(body) or text != full:
            rest = text[len(_complete(codec, body[:matched])):]
            row = steps[min(matched, len(steps) - 1)]
            top, _ = row.value(row.top())
            guess = codec.encode(rest, add_special_tokens=False)[:1] if rest else []
            if guess:
                theirs, exact = row.value(guess[0])
            else:  # the engine stopped where the reference went on: its token was an end of sequence
                values = [row.value(t) for t in eos] or [(float("-inf"), True)]
                theirs, exact = max(v for v, _ in values), all(x for _, x in values)
            margin = float(top - theirs)
        total = max(len(body), 1)
        out.append({"prompt": prompt, "matched": matched, "total": len(body), "fraction": matched / total,
                    "divergence_margin": margin, "margin_exact": exact, "reference_text": full,
                    "engine_text": text})
    return out


def _complete(codec: TextCodec, ids: list[int]) -> str:
    """The text of ``ids`` without trailing U+FFFD: a prefix that ends inside a character spelled in byte tokens
    (two of the three byte tokens of a right quote) decodes to replacement characters the whole text lacks."""
    return codec.decode(ids).rstrip("\ufffd")


def judge(per_prompt: list[dict[str, Any]], limits: TextLimits) -> dict[str, Any]:
    """The accuracy report (the shape of ``edgellm eval``'s: ``passed``, ``checks``, ``failed_checks``)."""
    checks: dict[str, dict[str, Any]] = {}
    # the worst value is a non-finite one if any prompt has it (max() would drop a NaN after the first prompt), and
    # a non-finite value never passes
    margins = [float(p["divergence_margin"]) for p in per_prompt]
    worst_margin = next((m for m in margins if not math.isfinite(m)), max(margins))
    fractions = [float(p["fraction"]) for p in per_prompt]
    worst_fraction = next((f for f in fractions if not math.isfinite(f)), min(fractions))
    if limits.max_divergence_margin is not None:
        checks["greedy_divergence_margin"] = {
            "value": worst_margin, "limit": limits.max_divergence_margin, "op": "<=",
            "passed": math.isfinite(worst_margin) and worst_margin <= limits.max_divergence_margin}
    if limits.min_match_fraction is not None:
        checks["greedy_match_fraction"] = {
            "value": worst_fraction, "limit": limits.min_match_fraction, "op": ">=",
            "passed": math.isfinite(worst_fraction) and worst_fraction >= limits.min_match_fraction}
    checks["greedy_mean_match_fraction"] = {
        "value": sum(p["fraction"] for p in per_prompt) / len(per_prompt), "limit": None, "op": "report",
        "passed": True}
    failed = [name for name, c in checks.items() if not c["passed"]]
    return {"kind": "tensorrt-edgellm greedy text agreement", "passed": not failed, "checks": checks,
            "failed_checks": failed, "greedy": per_prompt}


def write_report(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
