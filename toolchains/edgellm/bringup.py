"""Bring-up checks of a checkpoint against this library as a toolchain: its family registry (``edgellm.models``:
no default model, so a model_type without a family is unsupported) and the reconciliation of the checkpoint's tensors
with the family's parameters (``edgellm.checkpoint``: headers only), in the toolchains' common report shapes."""

from __future__ import annotations

from pathlib import Path

from edgefarm.toolchains.base import RegistryCheck, RegistryStatus, ShapeMismatch, WeightReconciliation
from edgellm.checkpoint import Checkpoint
from edgellm.config import ModelConfig
from edgellm.errors import UnsupportedError
from edgellm.models.base import ModelFamily, family_for


def _qualname(family: type[ModelFamily]) -> str:
    return f"{family.__module__}.{family.__qualname__}"


def registry_check(toolchain: str, version: str, checkpoint: Path) -> RegistryCheck:
    """Registered when a family of ours takes the config (its model_type, architectures and settings); else
    unsupported, with the family registry's own reason. ConfigurationError for an unreadable config.json."""
    config = ModelConfig.load(Path(checkpoint))
    common = dict(toolchain=toolchain, toolchain_version=version, model_type=config.model_type,
                  architectures=config.architectures)
    try:
        family = family_for(config)
        family.check_config(config)
    except UnsupportedError as exc:
        return RegistryCheck(**common, status=RegistryStatus.UNSUPPORTED, model_class=None, reason=str(exc))
    return RegistryCheck(**common, status=RegistryStatus.REGISTERED, model_class=_qualname(family),
                         reason=f"registered: family {family.name}")


def reconcile(toolchain: str, version: str, checkpoint: Path) -> WeightReconciliation:
    """The checkpoint against its family's parameters (``Checkpoint.open``: every header and index problem too).
    UnsupportedError when no family takes it."""
    found = Checkpoint.open(Path(checkpoint))
    rec = found.reconciliation
    return WeightReconciliation(
        toolchain=toolchain, toolchain_version=version, model=_qualname(found.family), expected=rec.expected,
        matched=len(rec.matched), missing=dict(rec.missing), unexpected=tuple(rec.unexpected),
        shape_mismatches=tuple(ShapeMismatch(name, name, expected, seen)
                               for name, (expected, seen) in rec.shape_mismatches.items()),
        tied=dict(rec.tied),
        ignored={**rec.ignored, **{name: "quantization tensor" for name in rec.quantization_tensors}},
        problems=tuple(str(p) for p in found.problems))
