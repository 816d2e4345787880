"""Accuracy thresholds per precision: a table of defaults, overridable from a JSON/YAML file or CLI flags.

A field set to ``None`` disables that check. Defaults exist only for precisions whose error we have reasoned about;
any other precision needs an explicit thresholds file (no silent borrowing of another precision's limits). One check
has no threshold and always counts (``outputs_finite`` in edgellm.accuracy): a limit loosened for a model whose metrics
mean little (top-1 0.0 on random weights) never lets an engine computing NaN or inf pass.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError
from edgellm.types import Precision

MAX_THRESHOLDS_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Thresholds:
    """Limits of one precision. Every enabled field is one check in the eval report."""

    # max |engine - reference| over every logit of the fixed prompts
    logits_max_abs_diff: float | None = None
    # min over positions of cos(engine logits, reference logits) on the fixed prompts
    logits_min_cosine: float | None = None
    # min over prompts of (tokens equal before the first divergence) / (tokens generated), greedy
    greedy_min_match_fraction: float | None = None
    # at the first greedy divergence, the reference's lead (in logits) of its own token over the engine's token;
    # a divergence is tolerated only at a near-tie the engine's rounding could flip
    greedy_max_divergence_margin: float | None = None
    # |ppl_engine - ppl_reference| / ppl_reference on the text windows
    ppl_max_rel_diff: float | None = None
    # fraction of text positions where the engine's argmax equals the reference's (teacher-forced)
    top1_min_agreement: float | None = None
    # the engine's tokenizer gives the same ids as the reference tokenizer on the prompts and the text
    tokenizer_match: bool | None = True

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name == "tokenizer_match":
                if not isinstance(v, bool):
                    problems.append(f"{f.name}={v!r}: expected true, false or null")
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                problems.append(f"{f.name}={v!r}: expected a finite number >= 0 or null")
            elif f.name in _FRACTIONS and v > 1:
                problems.append(f"{f.name}={v!r}: expected a fraction in [0, 1]")
        if problems:
            raise ConfigurationError("bad thresholds: " + "; ".join(problems))
        if all(getattr(self, f.name) in (None, False) for f in dataclasses.fields(self)):
            raise ConfigurationError("bad thresholds: every check is disabled; enable at least one")

    def enabled(self) -> dict[str, float | bool]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def replace(self, **changes: Any) -> Thresholds:
        return dataclasses.replace(self, **changes)


_FRACTIONS = {"logits_min_cosine", "greedy_min_match_fraction", "top1_min_agreement"}
FIELDS = tuple(f.name for f in dataclasses.fields(Thresholds))

# fp32: the engine computes what the reference computes, up to summation order (~1e-6 on logits of O(10)).
# fp16: weights/activations rounded to 11-bit mantissas, so logits move by ~1e-2 and exact greedy agreement over
# 64 tokens is not guaranteed (a near-tie can flip and the continuations then differ legitimately). The fp16
# checks are therefore distributional (perplexity within 1%, cosine, teacher-forced top-1 agreement) plus a greedy
# check that a divergence, if any, happened at a near-tie of the reference (margin <= 0.25 logits).
# Quantized engines are scored against the float source by the limits their method declares (edgellm/quant, with
# the measurements behind them): perplexity (|ratio - 1|) and teacher-forced top-1 agreement only, since logits move
# by design and greedy continuations legitimately part at the first near-tie. On random-weight checkpoints top-1
# agreement means little (near-uniform logits make every argmax a near-tie), so accuracy rows of random checkpoints
# need --min-top1-agreement or a thresholds file.


def quantized_defaults() -> dict[Precision, Thresholds]:
    """Each quantization method's declared limits (edgellm/quant), by precision; a bad declaration is a bug."""
    from edgellm.errors import BugError
    from edgellm.quant import methods

    out = {}
    for m in methods():
        if m.thresholds is None:
            continue
        unknown = sorted(set(m.thresholds) - set(FIELDS))
        if unknown:
            raise BugError(f"quantization method {m.name!r} declares unknown threshold(s) {', '.join(unknown)}; "
                           f"valid: {', '.join(FIELDS)}")
        out[Precision(m.name)] = Thresholds(**m.thresholds)
    return out


QUANTIZED_DEFAULTS: dict[Precision, Thresholds] = quantized_defaults()

# bf16 (torch-cuda engines; ONNX Runtime's CPU provider builds none): 8-bit mantissas, so ~8x fp16's rounding. The
# same checks as fp16. Measured with the torch-cuda decoder math in bf16 against the fp32 transformers reference on
# the trained stories260K (bundled text, 4064 tokens, window 128; the CPU, 2026-11-30; fp16 in brackets):
#   logits max |diff| 0.235 (0.050), min cosine 0.99990 (0.999998), greedy: 2 of 4 prompts part at a near-tie of
#   margin <= 0.061 (none), ppl +0.14% (+0.002%), teacher-forced top-1 0.979 (0.997).
# Limits: top-1 at 3x the measured gap; cosine and perplexity at fp16's (already looser than 3x); a greedy divergence
# tolerated where the reference's lead is under about 2x the largest logit error. On the H200 (torch-cuda engine,
# reference on the same GPU): min cosine 0.99988, greedy margin <= 0.061, ppl +0.11%, top-1 0.981
# (benchmarks/results/gpu_verify_bf16.json).
BF16 = Thresholds(logits_min_cosine=0.999, greedy_max_divergence_margin=0.5, ppl_max_rel_diff=0.01,
                  top1_min_agreement=0.94)

DEFAULTS: dict[Precision, Thresholds] = {
    Precision.FP32: Thresholds(
        logits_max_abs_diff=1e-3,
        logits_min_cosine=0.99999,
        greedy_min_match_fraction=1.0,
        ppl_max_rel_diff=1e-3,
        top1_min_agreement=0.999,
    ),
    Precision.FP16: Thresholds(
        logits_min_cosine=0.999,
        greedy_max_divergence_margin=0.25,
        ppl_max_rel_diff=0.01,
        top1_min_agreement=0.97,
    ),
    Precision.BF16: BF16,
    **QUANTIZED_DEFAULTS,
}


def _load_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigurationError(f"thresholds file {path} not found")
    if path.stat().st_size > MAX_THRESHOLDS_BYTES:
        raise ConfigurationError(f"thresholds file {path} is over {MAX_THRESHOLDS_BYTES} bytes")
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix.lower() in (".yaml", ".yml"):
        from edgellm.yamlio import loads_yaml

        data = loads_yaml(text, path)
    elif path.suffix.lower() == ".json":
        import json

        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"thresholds file {path} is not valid JSON ({exc})") from None
    else:
        raise ConfigurationError(f"thresholds file {path}: unknown suffix {path.suffix!r}; valid: .json, .yaml, .yml")
    if not isinstance(data, dict):
        raise ConfigurationError(f"thresholds file {path} must hold a mapping, got {type(data).__name__}")
    return data


def _fields_from(mapping: Any, where: str) -> dict[str, Any]:
    if not isinstance(mapping, dict):
        raise ConfigurationError(f"{where} must be a mapping of threshold names to values, got {mapping!r}")
    unknown = sorted(set(mapping) - set(FIELDS))
    if unknown:
        raise ConfigurationError(f"{where}: unknown threshold(s) {', '.join(map(repr, unknown))}; "
                                 f"valid: {', '.join(FIELDS)}")
    return dict(mapping)


def resolve_thresholds(precision: Precision, file: Path | None = None,
                       overrides: dict[str, Any] | None = None) -> Thresholds:
    """Defaults of ``precision``, then the file's values, then CLI overrides (later wins).

    The file is either flat (``{logits_max_abs_diff: 0.01}``: applies to whatever precision the engine has) or keyed
    by precision (``{fp16: {ppl_max_rel_diff: 0.02}}``); mixing both forms is an error.
    """
    changes: dict[str, Any] = {}
    if file is not None:
        data = _load_file(Path(file))
        precision_keys = [k for k in data if k in {p.value for p in Precision}]
        if precision_keys and len(precision_keys) != len(data):
            others = sorted(set(data) - set(precision_keys))
            raise ConfigurationError(f"thresholds file {file}: mixes precision keys ({', '.join(precision_keys)}) "
                                     f"with other keys ({', '.join(others)}); use one form")
        if precision_keys:
            if precision.value in data:
                changes.update(_fields_from(data[precision.value], f"thresholds file {file}, key {precision.value!r}"))
        else:
            changes.update(_fields_from(data, f"thresholds file {file}"))
    changes.update({k: v for k, v in (overrides or {}).items() if v is not None})
    base = DEFAULTS.get(precision)
    if base is None:
        if not changes:
            raise ConfigurationError(f"no default accuracy thresholds for precision {precision.value!r} "
                                     f"(defaults exist for {', '.join(p.value for p in DEFAULTS)}); "
                                     "give them with --thresholds FILE or the threshold flags")
        base_values = {f: None for f in FIELDS}
        return Thresholds(**{**base_values, **changes})
    return base.replace(**changes)


# Per-layer limit of ``edgellm eval``'s layer comparison (edgellm.layer_diff): max |engine - reference| of the
# residual stream after a layer's attention or MLP, over max |reference| there. Measured fp32 (a 4-layer random
# tiny-llama, ONNX Runtime engine vs transformers, 12- and 118-token sequences, 2026-12-06): <= 3.4e-7 at every
# layer and part; limit 1e-4 (300x). fp16/bf16: their rounding (2^-11, 2^-8 relative per op) compounded over a few
# ops, not measured per layer; the quantized methods: weight error of 4/8-bit groups, not measured per layer (a
# wrong dequantization layout gives O(1), which these still catch).
LAYER_REL_LIMITS: dict[Precision, float] = {
    Precision.FP32: 1e-4,
    Precision.FP16: 1e-2,
    Precision.BF16: 5e-2,
}
QUANTIZED_LAYER_REL_LIMIT = 0.3


def layer_rel_limit(precision: Precision) -> float:
    """The per-layer relative limit of ``precision`` (a quantized one: ``QUANTIZED_LAYER_REL_LIMIT``)."""
    return LAYER_REL_LIMITS.get(precision, QUANTIZED_LAYER_REL_LIMIT)
