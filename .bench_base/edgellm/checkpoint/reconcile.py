"""Weight reconciliation: the checkpoint's tensors against the parameters its model family needs, both ways.

Every checkpoint-only tensor must be explained (tied to another parameter, or ignored by a named rule); every
missing required parameter, shape mismatch or non-float weight is a problem. A ModelOpt-quantized checkpoint's
linear layers are checked by ``edgellm.checkpoint.modelopt`` (packed weight, scales, per-layer precision); any other
quantized format is a problem (it would otherwise be misread as float weights), and layers lacking scales are listed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgellm.checkpoint.header import FLOAT_DTYPES, TensorInfo
from edgellm.checkpoint.modelopt import QuantLayout, linear_modules, quant_layout
from edgellm.config import ModelConfig, QuantConfig
from edgellm.errors import CheckpointError
from edgellm.models.base import ModelFamily
from edgellm.quant import methods

# Tensor-name suffixes quantizers store next to or instead of ``weight``: those of formats edgellm does not read
# (AutoAWQ, GPTQ, FP8 block), ModelOpt's KV-cache scales, and every scale a quantization method stores (edgellm/quant).
OTHER_QUANT_SUFFIXES = (".weight_scale_inv", ".k_scale", ".v_scale", ".scales", ".qweight", ".qzeros", ".g_idx")
SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".scales")


def quant_suffixes() -> tuple[str, ...]:
    stored = {f".{suffix}" for m in methods() if m.stored is not None for suffix in m.stored.scales}
    return tuple(sorted(stored | set(OTHER_QUANT_SUFFIXES)))


@dataclass
class Reconciliation:
    family: str
    expected: int = 0
    matched: list[str] = field(default_factory=list)
    missing: dict[str, tuple[int, ...]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatches: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)  # exp, found
    tied: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)  # tensor -> rule name
    quantization_tensors: list[str] = field(default_factory=list)
    quant_layout: QuantLayout | None = None
    problems: list[CheckpointError] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "expected": self.expected,
            "matched": len(self.matched),
            "missing": {k: list(v) for k, v in self.missing.items()},
            "unexpected": self.unexpected,
            "shape_mismatches": [{"name": k, "expected": list(e), "found": list(f)}
                                 for k, (e, f) in self.shape_mismatches.items()],
            "tied": self.tied,
            "ignored": self.ignored,
            "quantization_tensors": len(self.quantization_tensors),
            "ok": not self.problems,
        }


def reconcile(tensors: Mapping[str, TensorInfo], family: type[ModelFamily], cfg: ModelConfig,
              quant: QuantConfig, *, unknown: set[str] | frozenset[str] = frozenset()) -> Reconciliation:
    """``unknown``: names whose shard could not be read (already reported; not "missing" again)."""
    expected = family.expected_parameters(cfg)
    tied = family.tied_parameters(cfg)
    rec = Reconciliation(family=family.name, expected=len(expected))

    def bad(msg: str, name: str | None = None) -> None:
        info = tensors.get(name) if name else None
        rec.problems.append(CheckpointError(msg, file=info.file.name if info else None, tensor=name))

    # weights whose shape and dtype the quantization layout checks (packed, with scales)
    packed: set[str] = set()
    if quant.is_quantized and quant.modelopt:
        rec.quant_layout = quant_layout(tensors, family, cfg, quant)
        rec.problems.extend(rec.quant_layout.problems)
        packed = {m + ".weight" for m in linear_modules(family, cfg)
                  if not any(fnmatch.fnmatchcase(m, ex) for ex in quant.exclude_modules)}
    elif quant.is_quantized:
        bad(f"checkpoint declares {quant.method.value} quantization ({quant.source}); only ModelOpt's unified "
            f"format (hf_quant_config.json) is read (it would otherwise be misread as unquantized weights)")
    for name, shape in expected.items():
        info = tensors.get(name)
        if info is None and name in unknown:
            continue
        if info is None:
            rec.missing[name] = shape
            bad(f"missing: family {family.name} needs it with shape {list(shape)}", name)
            continue
        if name in packed:
            rec.matched.append(name)
            continue
        if info.shape != shape:
            rec.shape_mismatches[name] = (shape, info.shape)
            bad(f"wrong shape {list(info.shape)}; family {family.name} expects {list(shape)}", name)
            continue
        if info.dtype not in FLOAT_DTYPES and not quant.is_quantized:
            bad(f"dtype {info.dtype} is not a float type ({', '.join(sorted(FLOAT_DTYPES))}) and the checkpoint "
                f"declares no quantization", name)
            continue
        rec.matched.append(name)
    suffixes = quant_suffixes()
    for name in sorted(set(tensors) - set(expected)):
        if name in tied:
            src = tied[name]
            rec.tied[name] = src
            if src in expected and tensors[name].shape != expected[src]:
                bad(f"tied to {src!r} but shape {list(tensors[name].shape)} != {list(expected[src])}", name)
            continue
        rule = next((r for r in family.ignore_rules if r.matches(name)), None)
        if rule is not None:
            rec.ignored[name] = rule.name
            continue
        if quant.is_quantized and name.endswith(suffixes):
            rec.quantization_tensors.append(name)
            continue
        rec.unexpected.append(name)
        rules = "; ".join(f"{r.name} /{r.pattern}/" for r in family.ignore_rules) or "none"
        bad(f"unexplained tensor: family {family.name} does not use it, it is not tied, and no ignore rule "
            f"matches it (rules: {rules})", name)
    if quant.is_quantized and not quant.modelopt:
        _missing_scales(tensors, expected, quant, bad)
    return rec


def _missing_scales(tensors: Mapping[str, TensorInfo], expected: Mapping[str, tuple[int, ...]], quant: QuantConfig,
                    bad: Any) -> None:
    """Each quantized linear weight (a 2-D ``*_proj.weight`` not excluded) needs a scale tensor next to it."""
    for name, shape in expected.items():
        if len(shape) != 2 or not name.endswith("_proj.weight") or name not in tensors:
            continue
        module = name.removesuffix(".weight")
        if any(fnmatch.fnmatchcase(module, ex) for ex in quant.exclude_modules):
            continue
        if not any(module + s in tensors for s in SCALE_SUFFIXES):
            bad(f"declared {quant.method.value}-quantized but has no scale tensor "
                f"({', '.join(module + s for s in SCALE_SUFFIXES[:1])} or similar)", name)
