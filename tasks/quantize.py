"""Quantize: produce the checkpoint a precision is exported from. Identity for unquantized precisions (the
checkpoint goes into the store as is); quantized precisions are refused until a quantizer exists."""

from __future__ import annotations

from pathlib import Path

from artifacts.kinds import ArtifactKind
from edgellm.errors import UnsupportedError
from edgellm.types import UNQUANTIZED, Precision, Stage
from results.models import ResultStatus
from tasks.common import guarded, stage_task
from tasks.farm import Farm, FarmContext
from tasks.outcome import StageOutcome
from toolchains.base import Toolchain, require


@stage_task("quantize")
def quantize(ctx: FarmContext, model: str, precision: Precision, toolchain: Toolchain,
             checkpoint_dir: str) -> StageOutcome:
    def body() -> StageOutcome:
        if precision not in UNQUANTIZED:
            raise UnsupportedError(f"no quantizer for {precision} yet; identity precisions: "
                                   f"{', '.join(sorted(p.value for p in UNQUANTIZED))}")
        farm = Farm.get(ctx)
        ref = farm.store.put(Path(checkpoint_dir), ArtifactKind.CHECKPOINT)
        out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS, reason=f"identity for {precision}",
                           toolchain_version=require(toolchain).host_version())
        out.artifacts.append(ref)
        out.outputs["checkpoint"] = ref
        out.metrics["checkpoint_bytes"] = (float(ref.size), "B")
        return out

    return guarded(Stage.QUANTIZE, body)
