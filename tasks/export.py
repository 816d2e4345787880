"""Export: checkpoint -> ONNX directory, on the orchestrating host, cached by content.

The checkpoint is what quantize handed over (the source itself where quantize was the identity). What the export is
the product of (its key inputs) and how it is made are the job's toolchain's (``HostStages.export_key_inputs`` /
``export``): at least the checkpoint sha256, the precision and its LM-head / KV-cache variant, the toolchain and its
version, and what its exporter depends on. A rerun with the same inputs reuses the stored export (verified) and says
so; anything changed exports again. The outcome also hands on the checkpoint it was made from (``checkpoint``: what
a build straight from the checkpoint reads instead of the export).
"""

from __future__ import annotations

from edgefarm.artifacts.store import ArtifactRef
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.tasks.farm import FarmContext
from edgefarm.tasks.host import FarmHostWork
from edgefarm.toolchains.base import job_driver


def export_key(ctx: FarmContext, job: JobSpec, quantized: StageOutcome) -> Keyed:
    """The table's cache key function: the checkpoint quantize handed on, exported by the job's toolchain here."""
    ckpt: CheckpointRef = quantized.outputs["checkpoint"]  # what quantize made (identity: the source)
    toolchain = job_driver(job, ctx.data_dir)
    # the plan resolved it; a job made by hand may not
    version = job.toolchain_version or toolchain.environment.host_version()

    def on_hit(ref: ArtifactRef) -> StageOutcome:  # the stored export, and the checkpoint it was made from
        out = StageOutcome(stage=Stage.EXPORT, status=ResultStatus.PASS, reason="cache hit", toolchain_version=version)
        out.outputs.update(onnx=ref, checkpoint=ckpt)
        out.artifacts.append(ref)
        return out

    return Keyed(toolchain.host().export_key_inputs(ckpt.sha256, job, version), toolchain=toolchain.name,
                 toolchain_version=version, on_hit=on_hit)


def export(ctx: FarmContext, job: JobSpec, quantized: StageOutcome, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: export the checkpoint with the job's toolchain. A pre-quantized checkpoint's export records
    where its precision was read (its row runs no quantize stage that would)."""
    ckpt: CheckpointRef = quantized.outputs["checkpoint"]
    out = job_driver(job, ctx.data_dir).host().export(FarmHostWork(ctx, job, Stage.EXPORT), job, ckpt,
                                          int(quantized.outputs.get("quantized_linears", 0)), keyed)
    carried = quantized.outputs.get("prequantized")
    if carried is not None:
        out.reason = "; ".join(r for r in (str(carried), out.reason) if r)
    if "onnx" in out.outputs:
        out.outputs["checkpoint"] = ckpt
    return out
