"""Quantize: produce the checkpoint a precision is exported from, and return its reference. Identity for
unquantized precisions (the source's own reference: no copy, no second digest); quantized precisions are
refused until a quantizer exists."""

from __future__ import annotations

from pathlib import Path

from edgellm.errors import UnsupportedError
from edgellm.types import UNQUANTIZED, Stage
from results.models import ResultStatus
from tasks.common import guarded, stage_task
from tasks.farm import FarmContext
from tasks.outcome import StageOutcome
from tasks.spec import JobSpec
from toolchains.base import require


@stage_task("quantize")
def quantize(ctx: FarmContext, job: JobSpec) -> StageOutcome:
    precision = job.precision

    def body() -> StageOutcome:
        if precision not in UNQUANTIZED:
            raise UnsupportedError(f"no quantizer for {precision} yet; identity precisions: "
                                   f"{', '.join(sorted(p.value for p in UNQUANTIZED))}")
        ref = job.checkpoint
        out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS,
                           reason=f"identity for {precision} (checkpoint sha256 {ref.sha256[:12]})",
                           toolchain_version=require(job.toolchain).host_version())
        out.outputs["checkpoint"] = ref
        size = sum(p.stat().st_size for p in Path(ref.path).rglob("*") if p.is_file())
        out.metrics["checkpoint_bytes"] = (float(size), "B")
        return out

    return guarded(Stage.QUANTIZE, body)
