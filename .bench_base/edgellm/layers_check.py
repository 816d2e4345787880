"""Few-layer numeric test: the checkpoint cut to its first N decoder layers, through edgellm's own route (export ->
build for ONNX Runtime -> run), against the provider reference's layer-N results (``edgellm reference --layers N``).

What is compared, on the reference's fixed prompts (its token ids):
  logits  the truncated engine's logits vs the reference's layer-N logits (transformers' own final norm and lm_head
          applied to its hidden state after N layers): max |diff| and min per-position cosine;
  hidden  the hidden state after N layers as the truncated graph's lm_head sees it (final norm applied, so its
          per-position scale is not observable there): the engine's recovered from its logits (the family's final
          soft-capping undone, where it has one) by least squares over the checkpoint's lm_head (exact when the
          lm_head has full column rank, vocab >= hidden), the reference's by the family's own final norm (edgellm's
          module of it: RMSNorm, or (1 + w) RMSNorm) over the stored hidden state with the checkpoint's weight; max
          |diff| and min cosine. A recovery too ill-conditioned for that (``MAX_LM_HEAD_CONDITION``: the lm_head's
          condition number times the soft-capping's amplification; rank-deficient, or vocab < hidden) makes it
          unobservable: reported with the reason, not checked.
Limits are the fp32 accuracy thresholds (``edgellm.thresholds``: logits_max_abs_diff, logits_min_cosine), applied to
both; float checkpoints only (the route exports fp32). The report is ``edgellm.layers-check/1`` JSON.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.accuracy import Check, _check, _compare_logits, cosine_rows
from edgellm.errors import BugError, ConfigurationError, UnsupportedError
from edgellm.reference import ReferenceData, checkpoint_digest, load_reference
from edgellm.thresholds import DEFAULTS
from edgellm.types import Precision

SCHEMA = "edgellm.layers-check/1"
BACKEND = "ort"
# The recovery amplifies the logits' relative error (~1e-6 in fp32) by the lm_head's condition number: above this
# the recovered hidden state's error could approach the 1e-3 limit by itself, so the check is reported unobservable
# rather than failed (the logits check still runs). stories260K's tied lm_head: 36; a random one: ~2.
MAX_LM_HEAD_CONDITION = 1e3


def _fp32_limit(name: str) -> float:
    value = getattr(DEFAULTS[Precision.FP32], name)
    if value is None:
        raise BugError(f"the fp32 thresholds disable {name}, which the few-layer test needs")
    return float(value)


@dataclass(frozen=True)
class LayerLimits:
    """Applied to the logits and to the hidden states alike; default: the fp32 accuracy thresholds."""

    max_abs_diff: float = field(default_factory=lambda: _fp32_limit("logits_max_abs_diff"))
    min_cosine: float = field(default_factory=lambda: _fp32_limit("logits_min_cosine"))

    def __post_init__(self) -> None:
        bad = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
               if isinstance(getattr(self, f.name), bool) or not isinstance(getattr(self, f.name), float | int)
               or not 0 <= getattr(self, f.name) < float("inf")]
        if self.min_cosine > 1:
            bad.append(f"min_cosine={self.min_cosine!r}")
        if bad:
            raise ConfigurationError(f"bad limits: {', '.join(bad)}; expected finite numbers >= 0 (min_cosine <= 1)")


class _Recording:
    """An engine whose ``logits`` results are kept (the logits comparison's, reused for the hidden states)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: list[np.ndarray] = []

    def logits(self, ids: list[int]) -> np.ndarray:
        out = self.engine.logits(ids)
        self.seen.append(out)
        return out  # type: ignore[no-any-return]


def _reference(reference: Path, checkpoint: Path, layers: int | None) -> tuple[ReferenceData, str]:
    ref = load_reference(reference)
    if ref.layers == 0:
        raise ConfigurationError(f"reference file {reference} stores no hidden states; make it with "
                                 f"`edgellm reference {checkpoint} --layers N`")
    if layers is not None and layers != ref.layers:
        raise ConfigurationError(f"--layers {layers}: reference file {reference} stores the hidden states after "
                                 f"{ref.layers} layer(s); valid: {ref.layers} (or remake it with --layers {layers})")
    digest = checkpoint_digest(checkpoint)
    if digest != ref.checkpoint_sha256:
        raise ConfigurationError(f"reference file {reference} was made from checkpoint sha256 "
                                 f"{ref.checkpoint_sha256[:16]}... but {checkpoint} has sha256 {digest[:16]}...: make "
                                 f"the reference from this checkpoint")
    return ref, digest


def _lm_head_gram(w: Any) -> np.ndarray:
    """W^T W in float64 [hidden, hidden], over vocab chunks of the lm_head ``w`` (torch [vocab, hidden]): the
    normal equations of the least-squares recovery, without a float64 copy of a large vocabulary's lm_head."""
    gram = np.zeros((w.shape[1], w.shape[1]), dtype=np.float64)
    for start in range(0, w.shape[0], 8192):
        chunk = w[start:start + 8192].double().numpy()
        gram += chunk.T @ chunk
    return gram


def _uncapped(logits: np.ndarray, cap: float | None) -> np.ndarray:
    """The logits before a final soft-capping ``cap * tanh(x / cap)`` (float64), or as they are without one."""
    z = logits.astype(np.float64)
    return z if cap is None else cap * np.arctanh(z / cap)


def _final_norm(ckpt: Any) -> Any:
    """The family's final norm (edgellm's module, float64) with the checkpoint's weight: hidden [S, H] -> normed."""
    import torch

    from edgellm.models.decoder import make_norm

    cfg = ckpt.config
    norm = make_norm(ckpt.family, cfg.hidden_size, cfg.rms_norm_eps, torch.float64)
    norm.weight = torch.nn.Parameter(ckpt.load_tensor("model.norm.weight").double(), requires_grad=False)
    return lambda h: norm(torch.from_numpy(h).double()).numpy()


def _hidden(ckpt: Any, ref: ReferenceData, engine_logits: list[np.ndarray]) -> dict[str, Any]:
    import torch

    cfg, family = ckpt.config, ckpt.family
    head_name = family.tied_parameters(cfg).get("lm_head.weight", "lm_head.weight")
    w = ckpt.load_tensor(head_name).float()  # [vocab, hidden]
    gram = _lm_head_gram(w)
    eig = np.linalg.eigvalsh(gram)
    condition = float(np.sqrt(eig[-1] / eig[0])) if eig[0] > 0 else float("inf")
    # d/dx cap * tanh(x / cap) = 1 - (z / cap)^2: the logits' error grows by its inverse where they are undone
    cap = family.final_softcap(cfg)
    peak = max((float(np.max(np.abs(z))) for z in engine_logits), default=0.0)
    amplification = 1.0 if cap is None else (1.0 / (1.0 - (peak / cap) ** 2) if peak < cap else float("inf"))
    if not condition * amplification < MAX_LM_HEAD_CONDITION:
        capped = "" if cap is None else f", times {amplification:.3g} from undoing the final soft-capping at {cap:g}"
        return {"observable": False, "lm_head_condition": str(condition),
                "why": f"lm_head {head_name} {list(w.shape)} has condition number {condition:.3g}{capped} (limit "
                       f"{MAX_LM_HEAD_CONDITION:g}): the hidden state cannot be recovered from the logits"}
    norm = _final_norm(ckpt)
    max_abs, min_cos, per_prompt = 0.0, 1.0, []
    for p, h, z in zip(ref.prompts, ref.hidden, engine_logits, strict=True):
        want = norm(h)
        got = np.linalg.solve(gram, (torch.from_numpy(_uncapped(z, cap)) @ w.double()).numpy().T).T  # [S, hidden]
        diff, cos = float(np.max(np.abs(got - want))), float(np.min(cosine_rows(got, want)))
        max_abs, min_cos = max(max_abs, diff), min(min_cos, cos)
        per_prompt.append({"prompt": p, "tokens": len(h), "max_abs_diff": diff, "min_cosine": cos})
    return {"observable": True, "lm_head_condition": condition, "max_abs_diff": max_abs, "min_cosine": min_cos,
            "per_prompt": per_prompt}


def layers_check(checkpoint: Path | str, reference: Path | str, layers: int | None = None, *,
                 limits: LayerLimits | None = None, work_dir: Path | None = None,
                 num_threads: int | None = None) -> dict[str, Any]:
    """Run the few-layer test; returns the report (``passed`` false when a check failed; bad input raises
    ``ConfigurationError``). ``layers`` None: the reference's N. ``work_dir``: where the truncated checkpoint,
    export and engine are made (a temporary directory inside it, removed after)."""
    from edgellm.checkpoint.checkpoint import Checkpoint
    from edgellm.checkpoint.truncate import truncate_checkpoint
    from edgellm.compiler.build import build_engine
    from edgellm.compiler.export import export_checkpoint
    from edgellm.config import QuantConfig
    from edgellm.layer_diff import layer_report
    from edgellm.runtime.engine import Engine
    from edgellm.thresholds import layer_rel_limit

    limits = limits or LayerLimits()
    checkpoint, reference = Path(checkpoint), Path(reference)
    if not checkpoint.is_dir():
        raise ConfigurationError(f"{checkpoint}: checkpoint directory not found")
    if work_dir is not None and not Path(work_dir).is_dir():
        raise ConfigurationError(f"--work-dir {work_dir}: not found; give an existing directory")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    ckpt = Checkpoint.open(checkpoint)
    ckpt.validate()
    quant = QuantConfig.load(checkpoint, ckpt.config.raw)
    if quant.is_quantized:
        raise UnsupportedError(f"{checkpoint}: quantized {quant.method.value} ({quant.source}); the few-layer test "
                               f"compares fp32 exports of float checkpoints only")
    ref, digest = _reference(reference, checkpoint, layers)
    n = ref.layers
    timings["reference_s"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="edgellm-layers-", dir=work_dir) as tmp:
        t0 = time.perf_counter()
        truncated = truncate_checkpoint(checkpoint, Path(tmp) / "truncated", n)
        timings["truncate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        export_checkpoint(Path(tmp) / "truncated", Path(tmp) / "onnx", Precision.FP32)
        timings["export_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        build_engine(Path(tmp) / "onnx", Path(tmp) / "engine", BACKEND)
        timings["build_s"] = time.perf_counter() - t0
        engine = _Recording(Engine.open(Path(tmp) / "engine", num_threads=num_threads))
        logits = _compare_logits(engine, dataclasses.replace(ref, prompt_logits=ref.layer_logits), timings)
        t0 = time.perf_counter()  # where inside the N layers the engine leaves transformers (evidence, no check)
        per_layer = layer_report(Path(tmp) / "engine", Path(tmp) / "truncated", ref.prompt_ids, n,
                                 layer_rel_limit(Precision.FP32))
        timings["per_layer_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hidden = _hidden(ckpt, ref, engine.seen)
    timings["hidden_s"] = time.perf_counter() - t0
    checks: list[Check] = [
        _check("logits_max_abs_diff", logits["max_abs_diff"], limits.max_abs_diff, "<=",
               f"max |engine - reference| over the layer-{n} logits of the fixed prompts"),
        _check("logits_min_cosine", logits["min_cosine"], limits.min_cosine, ">=",
               f"min per-position cosine similarity of the layer-{n} logits"),
    ]
    if hidden["observable"]:
        checks += [
            _check("hidden_max_abs_diff", hidden["max_abs_diff"], limits.max_abs_diff, "<=",
                   f"max |engine - reference| over the final-normed hidden states after {n} layer(s)"),
            _check("hidden_min_cosine", hidden["min_cosine"], limits.min_cosine, ">=",
                   f"min per-position cosine similarity of the final-normed hidden states after {n} layer(s)"),
        ]
    failed = [c.name for c in checks if not c.passed]
    return {
        "schema": SCHEMA,
        "passed": not failed,
        "failed_checks": failed,
        "checkpoint": str(checkpoint),
        "checkpoint_sha256": digest,
        "family": ckpt.family.name,
        "reference": str(reference),
        "reference_revision": ref.header["checkpoint"].get("revision"),
        "layers": n,
        "of_layers": ckpt.config.num_hidden_layers,
        "route": {"export": "edgellm export", "precision": Precision.FP32.value, "backend": BACKEND},
        "truncated": {k: v for k, v in truncated.items() if k != "path"},
        "limits": dataclasses.asdict(limits),
        "checks": {c.name: c.to_json() for c in checks},
        "logits": logits,
        "hidden": hidden,
        "layers_compared": per_layer["layers"],
        "first_divergent_layer": per_layer["first_divergent_layer"],
        "layers_summary": per_layer["summary"],
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }
