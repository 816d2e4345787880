"""Accuracy of a built engine against Hugging Face transformers running the same checkpoint in fp32.

The reference (``edgellm.reference``) is either computed in this process from ``--checkpoint`` or loaded from a
file ``edgellm reference`` wrote (``--reference``: no torch or transformers needed here). Computed here, it runs
where the engine runs (the backend's declared ``device``: cuda for torch-cuda, cpu for ort) unless
``--reference-device`` says otherwise; an absent device is an error, never a fall back. Either way one
comparison path runs, on the reference's token ids:
  1. logits on a few fixed prompts: max abs diff and min per-position cosine similarity;
  2. greedy generation of N tokens per prompt: tokens matching before the first divergence, and the reference's
     logit margin at that divergence;
  3. perplexity of a text in non-overlapping windows of the reference's window size (same windows for both),
     plus teacher-forced top-1 agreement on the same positions;
  4. tokenizer parity: the engine's tokenizer gives the reference's ids on the prompts and the text.
The checks that count, and their limits, come from ``edgellm.thresholds`` keyed by the engine's own precision; one
more always counts (``outputs_finite``: every logit of 1 and 3 is finite), and a non-finite metric fails its check.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgellm import BUNDLED_TEXT_FILE
from edgellm.backends.base import backend_class
from edgellm.config import ModelConfig
from edgellm.errors import ConfigurationError, UnsupportedError
from edgellm.reference import (
    CONFIG_KEYS,
    DEFAULT_GREEDY_TOKENS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_WINDOW,
    PROMPTS,
    REFERENCE_DEVICES,
    ReferenceData,
    ReferenceSettings,
    TopLogits,
    checkpoint_eos_ids,
    compute_reference,
    device_problem,
    load_reference,
    make_windows,
    window_nll,
)
from edgellm.runtime.engine import threads_problem
from edgellm.thresholds import Thresholds, resolve_thresholds
from edgellm.types import Precision

__all__ = ["DEFAULT_GREEDY_TOKENS", "DEFAULT_MAX_TOKENS", "DEFAULT_WINDOW", "Check", "EvalOptions",
           "WindowReductions", "checkpoint_eos_ids", "cosine_rows", "greedy_compare", "make_windows",
           "perplexity_from_reductions", "run_eval", "score", "window_nll"]

log = logging.getLogger(__name__)

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
    if isinstance(value, float) and not math.isfinite(value):
        ok = False  # a metric of a working engine is finite: NaN or inf never passes, on either side of a limit
    elif op == "<=":
        ok = bool(value <= threshold)
    elif op == ">=":
        ok = bool(value >= threshold)
    else:
        ok = bool(value == threshold)
    return Check(name, value, threshold, op, ok, detail)


@dataclass
class EvalOptions:
    """Exactly one of ``checkpoint`` (compute the reference here) and ``reference`` (a stored one). The reference
    settings (text, max_tokens, greedy_tokens, window) apply to ``checkpoint`` mode; a stored reference carries
    its own and refuses others."""

    engine_dir: Path
    checkpoint: Path | None = None
    reference: Path | None = None
    text_file: Path | None = None
    greedy_tokens: int | None = None
    max_tokens: int | None = None
    window: int | None = None
    thresholds_file: Path | None = None
    threshold_overrides: dict[str, Any] = field(default_factory=dict)
    prompts: tuple[str, ...] = PROMPTS
    num_threads: int | None = None
    reference_device: str | None = None  # None: where the engine runs (its backend's device)
    layers: bool = False  # compare every layer's hidden states even when every check passed

    def settings(self) -> ReferenceSettings:
        return ReferenceSettings(
            text_file=Path(self.text_file) if self.text_file is not None else BUNDLED_TEXT_FILE,
            max_tokens=self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS,
            greedy_tokens=self.greedy_tokens if self.greedy_tokens is not None else DEFAULT_GREEDY_TOKENS,
            window=self.window if self.window is not None else DEFAULT_WINDOW,
            prompts=self.prompts,
        )

    def validate(self) -> None:
        problems = []
        if (self.checkpoint is None) == (self.reference is None):
            problems.append("give exactly one of --checkpoint and --reference")
        if not Path(self.engine_dir).is_dir():
            problems.append(f"engine dir {self.engine_dir} not found")
        if self.checkpoint is not None and not (Path(self.checkpoint) / "config.json").is_file():
            problems.append(f"checkpoint {self.checkpoint} has no config.json (give a Hugging Face checkpoint dir)")
        if self.reference is not None:
            given = [f"--{n.replace('_', '-')}" for n in ("text_file", "max_tokens", "greedy_tokens", "window",
                                                          "reference_device") if getattr(self, n) is not None]
            if given:
                problems.append(f"{', '.join(given).replace('--text-file', '--text')}: the reference file "
                                f"{self.reference} fixes these settings (remake it with `edgellm reference` "
                                f"to change them)")
        if (problem := threads_problem(self.num_threads)) is not None:
            problems.append(problem)
        if self.reference_device is not None and self.reference_device not in REFERENCE_DEVICES:
            problems.append(f"--reference-device {self.reference_device!r}: valid: {', '.join(REFERENCE_DEVICES)}")
        if problems:
            raise ConfigurationError("; ".join(problems))
        if self.checkpoint is not None:
            self.settings().validate()


def _marked(ids: list[int], eos: set[int], ended_by_eos: bool) -> list[int]:
    """Ids with any trailing EOS replaced by one sentinel, so "stopped at EOS" compares equal across stacks."""
    body = list(ids)
    if body and body[-1] in eos:
        body.pop()
        ended_by_eos = True
    return body + ([_EOS] if ended_by_eos else [])


def _step_logit(row: np.ndarray | TopLogits, token: int) -> tuple[float, bool]:
    if isinstance(row, TopLogits):
        return row.value(token)
    return float(row[token]), True


def greedy_compare(ref_ids: list[int], ref_steps: list[np.ndarray] | list[TopLogits], eng_ids: list[int],
                   eng_finish: str, eos: set[int]) -> dict[str, Any]:
    """Prefix match of two greedy continuations and the reference's logit margin at the first divergence.

    ``ref_steps`` are each step's reference logits, full [vocab] or sparse (``TopLogits``); with sparse ones a
    token outside the stored top-K gives a lower bound of the margin (``margin_exact`` False)."""
    ref = _marked(ref_ids, eos, False)
    eng = _marked(eng_ids, eos, eng_finish == "eos")
    matched = 0
    for a, b in zip(ref, eng, strict=False):
        if a != b:
            break
        matched += 1
    total = max(len(ref), len(eng))
    margin, exact = 0.0, True
    if matched < total and matched < len(ref_steps):
        row = ref_steps[matched]
        ref_tok = row.top() if isinstance(row, TopLogits) else int(np.argmax(row))
        top, _ = _step_logit(row, ref_tok)
        if matched < len(eng):
            e = eng[matched]
            if e == _EOS and eos:
                vals = [_step_logit(row, t) for t in eos]
                eng_logit, exact = max(v for v, _ in vals), all(x for _, x in vals)
            else:
                eng_logit, exact = _step_logit(row, e)
        else:  # the engine stopped (length) where the reference went on: no token to compare against
            eng_logit = -math.inf
        margin = float(np.float64(top) - np.float64(eng_logit))
    return {"matched": matched, "total": total, "fraction": matched / total if total else 1.0,
            "divergence_margin": margin, "margin_exact": exact, "reference_ids": ref_ids, "engine_ids": eng_ids,
            "engine_finish_reason": eng_finish}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    denom = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(axis=-1) / np.where(denom == 0, 1.0, denom)


def _config_differences(engine_cfg: ModelConfig, ref_cfg: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: [getattr(engine_cfg, k), ref_cfg.get(k)] for k in CONFIG_KEYS
            if getattr(engine_cfg, k) != ref_cfg.get(k)}


def reference_device(backend: str, asked: str | None) -> tuple[str, str]:
    """Where transformers computes the reference for an engine of ``backend``, and why there: ``asked`` (the
    --reference-device flag) when given, else the device the backend declares its engines run on. Raises
    UnsupportedError when that device is absent here (no silent fall back to the CPU)."""
    if asked is not None:
        device, source = asked, "--reference-device"
    else:
        device, source = backend_class(backend).device, f"where the {backend} engine runs"
    if (problem := device_problem(device)) is not None:
        hint = "" if asked == "cpu" else "; pass --reference-device cpu to compute it on the CPU"
        raise UnsupportedError(f"{problem}: it was chosen as {source}{hint}")
    return device, source


def _check_engine_limits(engine: Any, prompt_lens: list[int], greedy_tokens: int, window: int, where: str) -> None:
    if max(prompt_lens) > engine.max_input_len:
        raise ConfigurationError(f"a fixed prompt is {max(prompt_lens)} tokens, over the engine's max_input_len "
                                 f"{engine.max_input_len}")
    need = max(prompt_lens) + greedy_tokens
    if need > engine.max_seq_len:
        raise ConfigurationError(f"greedy check needs {need} positions (longest prompt + --greedy-tokens "
                                 f"{greedy_tokens}), over the engine's max_seq_len {engine.max_seq_len}")
    if window > min(engine.max_input_len, engine.max_seq_len):
        raise ConfigurationError(f"perplexity window {window} tokens ({where}) is over the engine's max_input_len "
                                 f"{engine.max_input_len} / max_seq_len {engine.max_seq_len}; use a reference "
                                 f"made with --window <= {min(engine.max_input_len, engine.max_seq_len)}")


def _reference_for(engine: Any, opts: EvalOptions, timings: dict[str, float]) -> tuple[ReferenceData, dict]:
    """The reference to compare against: loaded (identity enforced) or computed here from the checkpoint."""
    t0 = time.perf_counter()
    if opts.reference is not None:
        ref = load_reference(Path(opts.reference))
        timings["reference_load_s"] = time.perf_counter() - t0
        engine_sha = (engine.manifest.get("source_export") or {}).get("checkpoint_sha256")
        # a quantized engine is scored against its float source: its own checkpoint is the quantizer's output
        quantized = bool(engine.manifest.get("quantization"))
        if engine_sha and engine_sha != ref.checkpoint_sha256 and not quantized:
            raise ConfigurationError(
                f"reference file {opts.reference} was made from checkpoint sha256 {ref.checkpoint_sha256[:16]}... "
                f"but engine {opts.engine_dir} was built from checkpoint sha256 {engine_sha[:16]}...: make the "
                f"reference from the engine's checkpoint")
        differences = _config_differences(engine.config, ref.header["checkpoint"]["config"])
        if differences:
            raise ConfigurationError(f"reference file {opts.reference} does not match engine {opts.engine_dir}: "
                                     + ", ".join(f"{k} {e} (engine) vs {r} (reference)"
                                                 for k, (e, r) in differences.items()))
        s = ref.settings
        _check_engine_limits(engine, [len(i) for i in ref.prompt_ids], s["greedy_tokens"], s["window"],
                             f"fixed by reference file {opts.reference}")
        return ref, differences
    ckpt = Path(opts.checkpoint)  # type: ignore[arg-type]
    device, source = reference_device(str(engine.manifest["backend"]), opts.reference_device)
    ckpt_cfg = ModelConfig.load(ckpt)
    differences = _config_differences(engine.config, {k: getattr(ckpt_cfg, k) for k in CONFIG_KEYS})
    if "vocab_size" in differences:
        e, c = differences["vocab_size"]
        raise ConfigurationError(f"engine {opts.engine_dir} has vocab_size {e} but checkpoint {ckpt} has "
                                 f"{c}: the engine was not built from this checkpoint, logits cannot be compared")
    if differences:
        log.warning("engine and checkpoint configs differ: %s", differences)
    settings = opts.settings()
    # fail fast on the engine's limits before paying for transformers (the engine's own tokens approximate)
    _check_engine_limits(engine, [len(engine.encode(p)) for p in settings.prompts], settings.greedy_tokens,
                         settings.window, "--window")
    ref = compute_reference(ckpt, settings, device)
    ref.header["device"]["chosen_as"] = source
    timings["reference_load_s"] = time.perf_counter() - t0
    _check_engine_limits(engine, [len(i) for i in ref.prompt_ids], settings.greedy_tokens, settings.window,
                         "--window")
    return ref, differences


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
    ref, differences = _reference_for(engine, opts, timings)
    timings.update({f"reference_{k}": v for k, v in ref.timings.items()})  # computed here (--checkpoint)

    report = score(engine, ref, thresholds, precision, engine_dir=str(opts.engine_dir),
                   checkpoint=str(opts.checkpoint) if opts.checkpoint is not None else ref.header["checkpoint"]["path"],
                   reference_file=str(opts.reference) if opts.reference is not None else None,
                   engine_backend=engine.manifest["backend"], config_differences=differences, timings=timings)
    if opts.layers or not report["passed"]:
        _add_layers(report, engine, ref, opts, precision)
    return report


LAYER_SEQUENCE_TOKENS = 128  # the text's first tokens: a sequence long enough to show error growth with position


def _add_layers(report: dict[str, Any], engine: Any, ref: ReferenceData, opts: EvalOptions,
                precision: Precision) -> None:
    """``layers``, ``first_divergent_layer`` and ``diagnosis`` (edgellm.layer_diff, edgellm.diagnosis); where
    the layers cannot be compared, ``layers`` is null and ``layers_unavailable`` says why."""
    from edgellm.diagnosis import diagnose
    from edgellm.errors import UnsupportedError
    from edgellm.layer_diff import layer_report
    from edgellm.quant import methods
    from edgellm.thresholds import layer_rel_limit

    limit = layer_rel_limit(precision)
    result, why = None, None
    if engine.manifest["backend"] != "ort":
        why = (f"a {engine.manifest['backend']} engine exposes no per-layer states here; `edgellm layers-check` "
               f"compares few-layer ONNX Runtime engines instead")
    elif opts.checkpoint is None and not ref.layer_states:
        why = ("this reference file holds no per-layer states (make it with `edgellm reference --layer-states`), "
               "or give --checkpoint")
    else:
        t0 = time.perf_counter()
        length = min(LAYER_SEQUENCE_TOKENS, engine.config.max_position_embeddings)
        sequences = [*ref.prompt_ids, *([ref.text_ids[:length]] if ref.text_ids else [])]
        try:
            result = layer_report(opts.engine_dir, opts.checkpoint, sequences, engine.config.num_hidden_layers,
                                  limit, device=ref.device["device"],
                                  stored=ref.layer_states if opts.checkpoint is None else None)
        except UnsupportedError as exc:
            why = str(exc)
        report["timings"]["layers_s"] = round(time.perf_counter() - t0, 4)
    report["layers"] = result["layers"] if result else None
    report["first_divergent_layer"] = result["first_divergent_layer"] if result else None
    report["layer_rel_limit"] = limit
    report["layers_summary"] = result["summary"] if result else None
    if why is not None:
        report["layers_unavailable"] = why
    quantized = precision.value in {m.name for m in methods()}
    report["diagnosis"] = diagnose(report, result, quantized=quantized, limit=limit)


@dataclass(frozen=True)
class WindowReductions:
    """What an engine may give instead of the text windows' full logits (a device shipping them back for a large
    vocabulary): per window, the summed next-token NLL (``window_nll``'s sum) and the argmax at every position but
    the last."""

    nll: np.ndarray
    argmax: list[np.ndarray]


def perplexity_from_reductions(ref: ReferenceData, windows: list[list[int]],
                               reductions: WindowReductions) -> dict[str, Any]:
    """The perplexity comparison (engine and reference perplexity, tokens, teacher-forced top-1 agreement, relative
    difference) from the engine's per-window reductions: the same sums as from the windows' full logits. Raises
    ConfigurationError when the reductions do not fit ``windows``."""
    if len(reductions.nll) != len(windows) or len(reductions.argmax) != len(windows):
        raise ConfigurationError(f"the engine's reductions have {len(reductions.nll)} window NLLs and "
                                 f"{len(reductions.argmax)} argmax rows for {len(windows)} windows")
    count = agree = 0
    for w, top1, ours in zip(windows, ref.window_top1, reductions.argmax, strict=True):
        if len(ours) != len(w) - 1:
            raise ConfigurationError(f"the engine's argmax has {len(ours)} positions for a window of {len(w)}")
        count += len(w) - 1
        agree += int(np.sum(ours == top1))
    nll_e, nll_r = float(np.sum(reductions.nll)), float(np.sum(ref.window_nll))
    ppl_e = math.exp(nll_e / count) if math.isfinite(nll_e) else math.nan
    ppl_r = math.exp(nll_r / count)
    return {"engine": ppl_e, "reference": ppl_r, "tokens": count, "top1_agreement": agree / count,
            "rel_diff": abs(ppl_e - ppl_r) / ppl_r if math.isfinite(ppl_e) else math.nan}


def score(engine: Any, ref: ReferenceData, thresholds: Thresholds, precision: Precision, *, engine_dir: str | None,
          checkpoint: str, reference_file: str | None, engine_backend: str,
          config_differences: dict[str, list[Any]], reductions: WindowReductions | None = None,
          timings: dict[str, float] | None = None) -> dict[str, Any]:
    """``edgellm eval``'s report of ``engine`` against ``ref`` under ``thresholds`` (``passed`` is the AND of every
    check): the one scoring of every engine, this library's and a toolchain's alike.

    ``engine`` answers ``encode``, ``decode``, ``logits(ids)``, ``generate(requests)`` and ``max_batch_size`` (an
    engine of this library, or a read-only one answering from a device's file). With ``reductions``, perplexity and
    top-1 agreement come from them instead of the windows' logits. ``engine_dir`` ... ``config_differences`` are
    copied into the report as given; ``timings`` (seconds by name) gains the engine's and is the report's, rounded.
    """
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    engine_prompt_ids = [engine.encode(p) for p in ref.prompts]
    engine_text_ids = engine.encode(ref.text)
    timings["tokenize_engine_s"] = time.perf_counter() - t0
    tok_mismatch = [p for p, ids, r in zip(ref.prompts, engine_prompt_ids, ref.prompt_ids, strict=True) if ids != r]
    text_match = engine_text_ids == ref.text_ids
    auto_tokenizer = {"class": ref.header["auto_tokenizer_class"],
                      "matches_engine": all(a == e for a, e in zip(ref.prompt_auto_ids, engine_prompt_ids,
                                                                   strict=True))
                      and ref.text_auto_ids == engine_text_ids}

    logits = _compare_logits(engine, ref, timings)
    greedy = _compare_greedy(engine, ref, timings)
    windows = ref.windows()
    if reductions is None:
        ppl = _compare_perplexity(engine, ref, windows, timings)
    else:
        ppl = perplexity_from_reductions(ref, windows, reductions)
    tokenizer_ok = not tok_mismatch and text_match
    tok_detail = "" if tokenizer_ok else (f"differs on {len(tok_mismatch)} prompt(s)"
                                          + ("" if text_match else " and on the text file"))
    checks = _make_checks(thresholds, logits=logits, greedy=greedy, ppl=ppl, tokenizer_ok=tokenizer_ok,
                          tok_detail=tok_detail)
    s = ref.settings
    return {
        "passed": all(c.passed for c in checks),
        "precision": precision.value,
        "engine_dir": engine_dir,
        "checkpoint": checkpoint,
        "checkpoint_sha256": ref.checkpoint_sha256,
        "reference_file": reference_file,
        "reference_versions": ref.header["versions"],
        "reference_device": ref.device,
        "engine_backend": engine_backend,
        "text_file": s["text_file"],
        "checks": {c.name: c.to_json() for c in checks},
        "failed_checks": [c.name for c in checks if not c.passed],
        "thresholds": thresholds.enabled(),
        "reference_perplexity": ppl["reference"],
        "perplexity_ratio": ppl["engine"] / ppl["reference"],
        "engine_perplexity": ppl["engine"],
        "perplexity_tokens": ppl["tokens"],
        "perplexity_windows": len(windows),
        "window_tokens": s["window"],
        "max_tokens": s["max_tokens"],
        "greedy_tokens": s["greedy_tokens"],
        "greedy": [{k: v for k, v in g.items() if k not in ("reference_ids", "engine_ids")}
                   | {"reference_text": engine.decode(g["reference_ids"]),
                      "engine_text": engine.decode(g["engine_ids"])} for g in greedy],
        "logits": logits["per_prompt"],
        "config_differences": config_differences,
        "auto_tokenizer": auto_tokenizer,
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }


def _compare_logits(engine: Any, ref: ReferenceData, timings: dict[str, float]) -> dict[str, Any]:
    max_abs, min_cos, per_prompt = 0.0, 1.0, []
    t_eng = 0.0
    for p, ids, r in zip(ref.prompts, ref.prompt_ids, ref.prompt_logits, strict=True):
        t0 = time.perf_counter()
        e = engine.logits(ids)
        t_eng += time.perf_counter() - t0
        finite = bool(np.all(np.isfinite(e)))
        diff = float(np.max(np.abs(e.astype(np.float64) - r))) if finite else math.nan
        cos = float(np.min(cosine_rows(e, r))) if finite else math.nan
        max_abs = diff if math.isnan(diff) or diff > max_abs else max_abs
        min_cos = cos if math.isnan(cos) or cos < min_cos else min_cos
        per_prompt.append({"prompt": p, "tokens": len(ids), "max_abs_diff": diff, "min_cosine": cos})
    timings["logits_engine_s"] = t_eng
    return {"max_abs_diff": max_abs, "min_cosine": min_cos, "per_prompt": per_prompt}


def _compare_greedy(engine: Any, ref: ReferenceData, timings: dict[str, float]) -> list[dict[str, Any]]:
    from edgellm.runtime import GenerationRequest

    n = int(ref.settings["greedy_tokens"])
    t0 = time.perf_counter()
    results = []
    bs = max(1, engine.max_batch_size)
    for start in range(0, len(ref.prompt_ids), bs):  # batched, as a server would run them
        reqs = [GenerationRequest(id=f"prompt{i}", input_ids=ids, max_new_tokens=n, temperature=0.0)
                for i, ids in enumerate(ref.prompt_ids[start:start + bs], start=start)]
        results.extend(engine.generate(reqs))
    timings["greedy_engine_s"] = time.perf_counter() - t0
    eos = ref.eos_ids
    return [{"prompt": p, **greedy_compare(out, steps, list(res.output_ids), res.finish_reason, eos)}
            for p, out, steps, res in zip(ref.prompts, ref.greedy_ids, ref.greedy_steps, results, strict=True)]


def _compare_perplexity(engine: Any, ref: ReferenceData, windows: list[list[int]],
                        timings: dict[str, float]) -> dict[str, Any]:
    """Perplexity of both on identical windows, and teacher-forced top-1 agreement on the same positions."""
    nll_e = 0.0
    count = agree = 0
    t_eng = 0.0
    finite = True
    for w, top1 in zip(windows, ref.window_top1, strict=True):
        t0 = time.perf_counter()
        e = engine.logits(w)
        t_eng += time.perf_counter() - t0
        finite = finite and bool(np.all(np.isfinite(e)))
        se, n = window_nll(e, w)
        nll_e, count = nll_e + se, count + n
        agree += int(np.sum(np.argmax(e[:-1], axis=-1) == top1))
    nll_r = float(np.sum(ref.window_nll))
    timings["perplexity_engine_s"] = t_eng
    ppl_e = math.exp(nll_e / count) if math.isfinite(nll_e) else math.nan
    ppl_r = math.exp(nll_r / count)
    return {"engine": ppl_e, "reference": ppl_r, "tokens": count, "top1_agreement": agree / count,
            "rel_diff": abs(ppl_e - ppl_r) / ppl_r if math.isfinite(ppl_e) else math.nan, "finite": finite}


def _make_checks(t: Thresholds, *, logits: dict[str, Any], greedy: list[dict[str, Any]], ppl: dict[str, Any],
                 tokenizer_ok: bool, tok_detail: str) -> list[Check]:
    checks: list[Check] = []
    # Always checked, whatever the thresholds: limits loosened for a model whose metrics mean little (a catalog's
    # top1_min_agreement 0.0 for random weights) must not let an engine computing NaN or inf pass. The logits'
    # difference is NaN exactly when a prompt's logits were not finite; the text windows say so themselves (or, when
    # only their reductions came back, through the engine's perplexity).
    finite = (math.isfinite(logits["max_abs_diff"]) and math.isfinite(ppl["engine"])
              and bool(ppl.get("finite", True)))
    checks.append(Check("outputs_finite", finite, True, "==", finite,
                        "every logit of the fixed prompts and the text windows is finite (no threshold disables it)"))
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
        bound = "" if g["margin_exact"] else " (a lower bound: the engine's token is outside the stored top-K)"
        checks.append(_check("greedy_divergence_margin", g["divergence_margin"], t.greedy_max_divergence_margin,
                             "<=", "reference's logit lead at the first divergence (0 = no divergence); "
                                   f"worst prompt diverged after {g['matched']}/{g['total']} tokens{bound}"))
    if t.ppl_max_rel_diff is not None:
        checks.append(_check("perplexity_rel_diff", ppl["rel_diff"], t.ppl_max_rel_diff, "<=",
                             f"engine {ppl['engine']:.6g} vs reference {ppl['reference']:.6g} over "
                             f"{ppl['tokens']} tokens"))
    if t.top1_min_agreement is not None:
        checks.append(_check("top1_agreement", ppl["top1_agreement"], t.top1_min_agreement, ">=",
                             f"teacher-forced argmax agreement over {ppl['tokens']} positions"))
    return checks
