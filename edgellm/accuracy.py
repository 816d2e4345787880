"""Accuracy of a built engine against Hugging Face transformers running the same checkpoint (fp32, CPU).

Three comparisons, all on identical token ids (the engine's tokenizer, checked against the reference's):
  1. logits on a few fixed prompts: max abs diff and min per-position cosine similarity;
  2. greedy generation of N tokens per prompt: tokens matching before the first divergence, and the reference's
     logit margin at that divergence;
  3. perplexity of a text file in non-overlapping windows of <= max_input_len tokens (same windows for both),
     plus teacher-forced top-1 agreement on the same positions.
The checks that count, and their limits, come from ``edgellm.thresholds`` keyed by the engine's own precision.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgellm import BUNDLED_TEXT_FILE
from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import ConfigurationError
from edgellm.thresholds import Thresholds, resolve_thresholds
from edgellm.types import Precision

log = logging.getLogger(__name__)

PROMPTS: tuple[str, ...] = (
    "Once upon a time, there was a little girl named Lily.",
    "The cat sat on the mat and",
    "Tom and his mom went to the park. They saw a big",
    "One day, a boy found a shiny red ball in the garden. He",
)
DEFAULT_GREEDY_TOKENS = 64
DEFAULT_MAX_TOKENS = 4096
_EOS = -1  # sentinel marking "the sequence ended with an end-of-sequence token"


@dataclass
class Check:
    name: str
    value: float | bool | None
    threshold: float | bool
    op: str  # "<=" | ">=" | "=="
    passed: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        value = self.value
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # JSON has no NaN/inf; a non-finite value never passes
        return {"value": value, "threshold": self.threshold, "op": self.op, "passed": self.passed,
                "detail": self.detail}


def _check(name: str, value: float | bool, threshold: float | bool, op: str, detail: str = "") -> Check:
    if op == "<=":
        ok = bool(value <= threshold)  # NaN compares false: fails
    elif op == ">=":
        ok = bool(value >= threshold)
    else:
        ok = bool(value == threshold)
    return Check(name, value, threshold, op, ok, detail)


@dataclass
class EvalOptions:
    engine_dir: Path
    checkpoint: Path
    text_file: Path = BUNDLED_TEXT_FILE
    greedy_tokens: int = DEFAULT_GREEDY_TOKENS
    max_tokens: int = DEFAULT_MAX_TOKENS
    thresholds_file: Path | None = None
    threshold_overrides: dict[str, Any] = field(default_factory=dict)
    prompts: tuple[str, ...] = PROMPTS
    num_threads: int | None = None

    def validate(self) -> None:
        problems = []
        if self.greedy_tokens < 1:
            problems.append(f"--greedy-tokens {self.greedy_tokens}: must be >= 1")
        if self.max_tokens < 2:
            problems.append(f"--max-tokens {self.max_tokens}: must be >= 2")
        if not Path(self.engine_dir).is_dir():
            problems.append(f"engine dir {self.engine_dir} not found")
        if not (Path(self.checkpoint) / "config.json").is_file():
            problems.append(f"checkpoint {self.checkpoint} has no config.json (give a Hugging Face checkpoint dir)")
        if not Path(self.text_file).is_file():
            problems.append(f"text file {self.text_file} not found")
        if self.num_threads is not None and self.num_threads < 1:
            problems.append(f"--threads {self.num_threads}: must be >= 1")
        if problems:
            raise ConfigurationError("; ".join(problems))


class Reference:
    """transformers' model and tokenizer for a checkpoint, fp32 on CPU."""

    def __init__(self, checkpoint: Path) -> None:
        import torch
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        self.torch = torch
        try:
            # The checkpoint's own tokenizer.json pipeline (post-processor included) is what the engine must match.
            # AutoTokenizer may substitute a model-specific class (transformers 5 does for qwen2, phi3, ...), which
            # disagrees with tokenizer.json for checkpoints pairing such a family with another tokenizer (the
            # synthetic ones do); its agreement is reported, not enforced.
            self.tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(checkpoint)
            self.auto_tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigurationError(f"transformers cannot load checkpoint {checkpoint}: "
                                     f"{str(exc).splitlines()[0]}") from None
        self.model.eval()
        # transformers >= 5.2x names the KV argument ``cache``; older releases ``past_key_values``
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        # Tiny models are dominated by per-op overhead, which extra threads only add to (and which collapses when
        # the cores are shared); real-sized ones want every core.
        self._threads = torch.get_num_threads()
        if sum(p.numel() for p in self.model.parameters()) < 20_000_000:
            torch.set_num_threads(1)

    def close(self) -> None:
        """Give the process its thread setting back (callers may be long-lived, e.g. a test session)."""
        self.torch.set_num_threads(self._threads)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def auto_encode(self, text: str) -> list[int]:
        return list(self.auto_tokenizer(text).input_ids)

    def logits(self, ids: list[int]) -> np.ndarray:
        """float32 [S, vocab] for one sequence."""
        with self.torch.inference_mode():
            out = self.model(input_ids=self.torch.tensor([ids], dtype=self.torch.long), use_cache=False)
        return out.logits[0].float().numpy()

    def greedy(self, ids: list[int], n: int, eos: set[int]) -> tuple[list[int], list[np.ndarray]]:
        """Plain greedy loop (no generation_config: no repetition penalty or other defaults a checkpoint carries).

        Returns the generated ids (ending with the EOS id if one was produced) and each step's logits [vocab].
        """
        torch = self.torch
        out: list[int] = []
        steps: list[np.ndarray] = []
        past = None
        inp = torch.tensor([ids], dtype=torch.long)
        with torch.inference_mode():
            for _ in range(n):
                res = self.model(input_ids=inp, use_cache=True, **{self._cache_arg: past})
                past = getattr(res, self._cache_arg)
                logits = res.logits[0, -1].float().numpy()
                tok = int(np.argmax(logits))
                out.append(tok)
                steps.append(logits)
                if tok in eos:
                    break
                inp = torch.tensor([[tok]], dtype=torch.long)
        return out, steps


def _marked(ids: list[int], eos: set[int], ended_by_eos: bool) -> list[int]:
    """Ids with any trailing EOS replaced by one sentinel, so "stopped at EOS" compares equal across stacks."""
    body = list(ids)
    if body and body[-1] in eos:
        body.pop()
        ended_by_eos = True
    return body + ([_EOS] if ended_by_eos else [])


def greedy_compare(ref_ids: list[int], ref_steps: list[np.ndarray], eng_ids: list[int], eng_finish: str,
                   eos: set[int]) -> dict[str, Any]:
    """Prefix match of two greedy continuations and the reference's logit margin at the first divergence."""
    ref = _marked(ref_ids, eos, False)
    eng = _marked(eng_ids, eos, eng_finish == "eos")
    matched = 0
    for a, b in zip(ref, eng, strict=False):
        if a != b:
            break
        matched += 1
    total = max(len(ref), len(eng))
    margin = 0.0
    if matched < total and matched < len(ref_steps):
        logits = ref_steps[matched].astype(np.float64)
        ref_tok = int(np.argmax(logits))
        if matched < len(eng):
            e = eng[matched]
            eng_logit = max(logits[t] for t in eos) if e == _EOS and eos else logits[e]
        else:  # the engine stopped (length) where the reference went on: no token to compare against
            eng_logit = -math.inf
        margin = float(logits[ref_tok] - eng_logit)
    return {"matched": matched, "total": total, "fraction": matched / total if total else 1.0,
            "divergence_margin": margin, "reference_ids": ref_ids, "engine_ids": eng_ids,
            "engine_finish_reason": eng_finish}


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[:, 0]


def window_nll(logits: np.ndarray, window: list[int]) -> tuple[float, int]:
    """Sum of next-token negative log-likelihoods over one window; logits [S, vocab] float32."""
    targets = np.asarray(window[1:], dtype=np.int64)
    total = 0.0
    for start in range(0, len(targets), 64):  # rows at a time: [64, vocab] float64 stays small for big vocabs
        rows = logits[start:start + 64][: len(targets) - start]
        lse = _logsumexp_rows(rows)
        picked = rows[np.arange(len(rows)), targets[start:start + len(rows)]].astype(np.float64)
        total += float((lse - picked).sum())
    return total, len(targets)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    denom = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(axis=-1) / np.where(denom == 0, 1.0, denom)


def make_windows(ids: list[int], size: int, max_tokens: int) -> list[list[int]]:
    """Non-overlapping windows of <= size tokens covering the first max_tokens ids; a last window of 1 is dropped
    (it predicts nothing)."""
    ids = ids[:max_tokens]
    return [w for w in (ids[i:i + size] for i in range(0, len(ids), size)) if len(w) >= 2]


def checkpoint_eos_ids(ckpt: Path, cfg: ModelConfig) -> set[int]:
    """End-of-sequence ids as transformers' generate sees them: config.json's plus generation_config.json's."""
    eos = set(cfg.eos_token_ids)
    gen = ckpt / "generation_config.json"
    if gen.is_file():
        value = read_json_object(gen, what="generation_config.json").get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        eos |= {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
    return eos


def _config_differences(engine_cfg: ModelConfig, ckpt_cfg: ModelConfig) -> dict[str, list[Any]]:
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "rope_theta", "tie_word_embeddings")
    return {k: [getattr(engine_cfg, k), getattr(ckpt_cfg, k)] for k in keys
            if getattr(engine_cfg, k) != getattr(ckpt_cfg, k)}


def run_eval(opts: EvalOptions) -> dict[str, Any]:
    """Run every comparison and return the report (``passed`` is the AND of all enabled checks)."""
    from edgellm.runtime import Engine

    opts.validate()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    engine = Engine.open(opts.engine_dir, num_threads=opts.num_threads)
    timings["engine_open_s"] = time.perf_counter() - t0
    precision = Precision.parse(engine.precision, what="engine precision")
    thresholds = resolve_thresholds(precision, opts.thresholds_file, opts.threshold_overrides)

    ckpt_cfg = ModelConfig.load(Path(opts.checkpoint))
    differences = _config_differences(engine.config, ckpt_cfg)
    if "vocab_size" in differences:
        e, c = differences["vocab_size"]
        raise ConfigurationError(f"engine {opts.engine_dir} has vocab_size {e} but checkpoint {opts.checkpoint} has "
                                 f"{c}: the engine was not built from this checkpoint, logits cannot be compared")
    if differences:
        log.warning("engine and checkpoint configs differ: %s", differences)

    text = Path(opts.text_file).read_text(encoding="utf-8", errors="replace")
    prompt_ids = [engine.encode(p) for p in opts.prompts]
    text_ids = engine.encode(text)
    too_long = [len(ids) for ids in prompt_ids if len(ids) > engine.max_input_len]
    if too_long:
        raise ConfigurationError(f"a fixed prompt is {max(too_long)} tokens, over the engine's max_input_len "
                                 f"{engine.max_input_len}")
    need = max(len(ids) for ids in prompt_ids) + opts.greedy_tokens
    if need > engine.max_seq_len:
        raise ConfigurationError(f"greedy check needs {need} positions (longest prompt + --greedy-tokens "
                                 f"{opts.greedy_tokens}), over the engine's max_seq_len {engine.max_seq_len}")
    window = min(engine.max_input_len, engine.max_seq_len)
    windows = make_windows(text_ids, window, opts.max_tokens)
    if not windows:
        raise ConfigurationError(f"text file {opts.text_file} gives {len(text_ids)} token(s); need at least 2")

    t0 = time.perf_counter()
    ref = Reference(Path(opts.checkpoint))
    timings["reference_load_s"] = time.perf_counter() - t0
    try:
        logits = _compare_logits(engine, ref, opts.prompts, prompt_ids, timings)
        greedy = _compare_greedy(engine, ref, opts, prompt_ids, checkpoint_eos_ids(Path(opts.checkpoint), ckpt_cfg),
                                 timings)
        ppl = _compare_perplexity(engine, ref, windows, timings)
        # tokenizer parity on everything this eval fed the engine
        tok_mismatch = [p for p, ids in zip(opts.prompts, prompt_ids, strict=True) if ref.encode(p) != ids]
        text_match = ref.encode(text) == text_ids
        auto_tokenizer = {"class": type(ref.auto_tokenizer).__name__,
                          "matches_engine": all(ref.auto_encode(p) == ids
                                                for p, ids in zip(opts.prompts, prompt_ids, strict=True))
                          and ref.auto_encode(text) == text_ids}
    finally:
        ref.close()
    tokenizer_ok = not tok_mismatch and text_match
    tok_detail = "" if tokenizer_ok else (f"differs on {len(tok_mismatch)} prompt(s)"
                                          + ("" if text_match else " and on the text file"))
    checks = _make_checks(thresholds, logits=logits, greedy=greedy, ppl=ppl, tokenizer_ok=tokenizer_ok,
                          tok_detail=tok_detail)
    return {
        "passed": all(c.passed for c in checks),
        "precision": precision.value,
        "engine_dir": str(opts.engine_dir),
        "checkpoint": str(opts.checkpoint),
        "text_file": str(opts.text_file),
        "checks": {c.name: c.to_json() for c in checks},
        "failed_checks": [c.name for c in checks if not c.passed],
        "thresholds": thresholds.enabled(),
        "reference_perplexity": ppl["reference"],
        "engine_perplexity": ppl["engine"],
        "perplexity_tokens": ppl["tokens"],
        "perplexity_windows": len(windows),
        "window_tokens": window,
        "greedy_tokens": opts.greedy_tokens,
        "greedy": [{k: v for k, v in g.items() if k not in ("reference_ids", "engine_ids")}
                   | {"reference_text": engine.decode(g["reference_ids"]),
                      "engine_text": engine.decode(g["engine_ids"])} for g in greedy],
        "logits": logits["per_prompt"],
        "config_differences": differences,
        "auto_tokenizer": auto_tokenizer,
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }


def _compare_logits(engine: Any, ref: Reference, prompts: tuple[str, ...], prompt_ids: list[list[int]],
                    timings: dict[str, float]) -> dict[str, Any]:
    max_abs, min_cos, per_prompt = 0.0, 1.0, []
    t_eng = t_ref = 0.0
    for p, ids in zip(prompts, prompt_ids, strict=True):
        t0 = time.perf_counter()
        e = engine.logits(ids)
        t_eng += time.perf_counter() - t0
        t0 = time.perf_counter()
        r = ref.logits(ids)
        t_ref += time.perf_counter() - t0
        finite = bool(np.all(np.isfinite(e)))
        diff = float(np.max(np.abs(e.astype(np.float64) - r))) if finite else math.nan
        cos = float(np.min(cosine_rows(e, r))) if finite else math.nan
        max_abs = diff if math.isnan(diff) or diff > max_abs else max_abs
        min_cos = cos if math.isnan(cos) or cos < min_cos else min_cos
        per_prompt.append({"prompt": p, "tokens": len(ids), "max_abs_diff": diff, "min_cosine": cos})
    timings["logits_engine_s"], timings["logits_reference_s"] = t_eng, t_ref
    return {"max_abs_diff": max_abs, "min_cosine": min_cos, "per_prompt": per_prompt}


def _compare_greedy(engine: Any, ref: Reference, opts: EvalOptions, prompt_ids: list[list[int]], eos: set[int],
                    timings: dict[str, float]) -> list[dict[str, Any]]:
    from edgellm.runtime import GenerationRequest

    t0 = time.perf_counter()
    results = []
    bs = max(1, engine.max_batch_size)
    for start in range(0, len(prompt_ids), bs):  # batched, as a server would run them
        reqs = [GenerationRequest(id=f"prompt{i}", input_ids=ids, max_new_tokens=opts.greedy_tokens, temperature=0.0)
                for i, ids in enumerate(prompt_ids[start:start + bs], start=start)]
        results.extend(engine.generate(reqs))
    timings["greedy_engine_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    greedy = []
    for p, ids, res in zip(opts.prompts, prompt_ids, results, strict=True):
        ref_out, ref_steps = ref.greedy(ids, opts.greedy_tokens, eos)
        greedy.append({"prompt": p, **greedy_compare(ref_out, ref_steps, list(res.output_ids), res.finish_reason,
                                                     eos)})
    timings["greedy_reference_s"] = time.perf_counter() - t0
    return greedy


def _compare_perplexity(engine: Any, ref: Reference, windows: list[list[int]],
                        timings: dict[str, float]) -> dict[str, Any]:
    """Perplexity of both on identical windows, and teacher-forced top-1 agreement on the same positions."""
    nll_e = nll_r = 0.0
    count = agree = 0
    t_eng = t_ref = 0.0
    for w in windows:
        t0 = time.perf_counter()
        e = engine.logits(w)
        t_eng += time.perf_counter() - t0
        t0 = time.perf_counter()
        r = ref.logits(w)
        t_ref += time.perf_counter() - t0
        se, n = window_nll(e, w)
        sr, _ = window_nll(r, w)
        nll_e, nll_r, count = nll_e + se, nll_r + sr, count + n
        agree += int(np.sum(np.argmax(e[:-1], axis=-1) == np.argmax(r[:-1], axis=-1)))
    timings["perplexity_engine_s"], timings["perplexity_reference_s"] = t_eng, t_ref
    ppl_e = math.exp(nll_e / count) if math.isfinite(nll_e) else math.nan
    ppl_r = math.exp(nll_r / count)
    return {"engine": ppl_e, "reference": ppl_r, "tokens": count, "top1_agreement": agree / count,
            "rel_diff": abs(ppl_e - ppl_r) / ppl_r if math.isfinite(ppl_e) else math.nan}


def _make_checks(t: Thresholds, *, logits: dict[str, Any], greedy: list[dict[str, Any]], ppl: dict[str, Any],
                 tokenizer_ok: bool, tok_detail: str) -> list[Check]:
    checks: list[Check] = []
    if t.tokenizer_match is not None:
        checks.append(_check("tokenizer_match", tokenizer_ok, t.tokenizer_match, "==", tok_detail))
    if t.logits_max_abs_diff is not None:
        checks.append(_check("logits_max_abs_diff", logits["max_abs_diff"], t.logits_max_abs_diff, "<=",
                             "max |engine - reference| over all logits of the fixed prompts"))
    if t.logits_min_cosine is not None:
        checks.append(_check("logits_min_cosine", logits["min_cosine"], t.logits_min_cosine, ">=",
                             "min per-position cosine similarity of the logits"))
    if t.greedy_min_match_fraction is not None:
        g = min(greedy, key=lambda g: g["fraction"])
        checks.append(_check("greedy_match_fraction", g["fraction"], t.greedy_min_match_fraction, ">=",
                             f"worst prompt: {g['matched']}/{g['total']} tokens equal before the first divergence"))
    if t.greedy_max_divergence_margin is not None:
        g = max(greedy, key=lambda g: g["divergence_margin"])
        checks.append(_check("greedy_divergence_margin", g["divergence_margin"], t.greedy_max_divergence_margin,
                             "<=", "reference's logit lead at the first divergence (0 = no divergence); "
                                   f"worst prompt diverged after {g['matched']}/{g['total']} tokens"))
    if t.ppl_max_rel_diff is not None:
        checks.append(_check("perplexity_rel_diff", ppl["rel_diff"], t.ppl_max_rel_diff, "<=",
                             f"engine {ppl['engine']:.6g} vs reference {ppl['reference']:.6g} over "
                             f"{ppl['tokens']} tokens"))
    if t.top1_min_agreement is not None:
        checks.append(_check("top1_agreement", ppl["top1_agreement"], t.top1_min_agreement, ">=",
                             f"teacher-forced argmax agreement over {ppl['tokens']} positions"))
    return checks
