"""Quantize: produce the checkpoint a precision is exported from, and return its reference.

Where the job's export reads the source checkpoint (unquantized precisions, precisions its toolchain quantizes in its
own export, and a source checkpoint that is already quantized: ``JobSpec.prequantized``), quantize is the identity:
the source's own reference, no copy, no second digest; for a pre-quantized one it hands on how many linears the
checkpoint stores quantized (its layout read and checked). A quantizer never runs on a checkpoint that is already
quantized: that is refused as a configuration error naming it (the plan never asks it; a job made otherwise might).
Otherwise the
toolchain the plan chose as the job's quantizer (``JobSpec.quantizer``: the one whose driver ``quantizes()`` the
precision) runs on the orchestrating host, once per (model, precision, LM head, KV cache) whichever toolchain
consumes it. Its key and work are the driver's (``HostStages.quantize_key_inputs`` / ``quantize``); the generic body
caches its product by content (``stages.StageCache``). The quantizer not installed -> skipped, with the reason.
"""

from __future__ import annotations

from pathlib import Path

from edgefarm.artifacts.store import ArtifactRef
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.tasks.farm import FarmContext
from edgefarm.tasks.host import FarmHostWork
from edgefarm.toolchains.base import job_quantizer
from edgellm.checkpoint.modelopt import quantized_linear_count
from edgellm.config import QuantConfig
from edgellm.errors import ConfigurationError
from edgellm.types import UNQUANTIZED


def quantize_key(ctx: FarmContext, job: JobSpec) -> Keyed | StageOutcome:
    """The table's cache key function; the outcome itself where no quantizer runs (identity, none available)."""
    maker = job_quantizer(job, ctx.data_dir)
    if maker is None:
        return identity(job)
    already = QuantConfig.load(Path(job.checkpoint.path))
    if already.is_quantized:
        raise ConfigurationError(
            f"model {job.model!r}: checkpoint {job.checkpoint.path} is already quantized ({already.method.value}, "
            f"{already.source}); toolchain {maker.name} would quantize it again for {job.precision}: refused (a "
            f"pre-quantized checkpoint is exported as it is, at its own precision)")
    if ctx.quantize_on:  # sent to the quantization pool's worker, which keys, caches and quantizes there
        from edgefarm.tasks.dispatch import quantize_remotely

        return quantize_remotely(ctx, job)
    state = maker.environment.available()
    if not state.ok:
        return StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.SKIPPED, toolchain=maker.name,
                            reason=f"toolchain {maker.name} is not available: {state.reason}")
    work = FarmHostWork(ctx, job, Stage.QUANTIZE)
    # the plan resolved it; a job made by hand may not
    version = job.quantizer_version or maker.environment.host_version()

    def on_hit(ref: ArtifactRef) -> StageOutcome:  # a stored checkpoint is judged again like a new one
        out = maker.host().judge_quantized(work, job, version, ref)
        out.reason = f"cache hit; {out.reason}"
        return out

    return Keyed(maker.host().quantize_key_inputs(job, ctx.quantize_device, version), toolchain=maker.name,
                 toolchain_version=version, on_hit=on_hit)


def quantize(ctx: FarmContext, job: JobSpec, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: the quantizer's work (as the key found it)."""
    maker = job_quantizer(job, ctx.data_dir)
    assert maker is not None
    return maker.host().quantize(FarmHostWork(ctx, job, Stage.QUANTIZE), job, keyed)


def identity(job: JobSpec) -> StageOutcome:
    ref = job.checkpoint
    linears, carried = 0, None
    if job.prequantized is not None:  # read again from the checkpoint itself: what the run's evidence says
        found = QuantConfig.load(Path(ref.path))
        if not found.is_quantized or found.method.value != job.precision.value:
            raise ConfigurationError(
                f"model {job.model!r}: the plan read precision {job.precision} ({job.prequantized}), but checkpoint "
                f"{ref.path} declares {found.method.value} ({found.source})")
        linears = quantized_linear_count(Path(ref.path))
        carried = f"pre-quantized checkpoint: precision {job.precision} read from {Path(found.source).name}"
        why = f"identity: {carried}; {linears} linear layers stored quantized"
    elif job.precision in UNQUANTIZED:
        why = f"identity for {job.precision}"
    else:
        why = f"identity: toolchain {job.toolchain} quantizes {job.precision} in its export"
    out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS, reason=f"{why} (checkpoint sha256 "
                                                                              f"{ref.sha256[:12]})")
    out.outputs["checkpoint"] = ref
    out.outputs["quantized_linears"] = linears
    if carried is not None:
        out.outputs["prequantized"] = carried
    size = sum(p.stat().st_size for p in Path(ref.path).rglob("*") if p.is_file())
    out.metrics["checkpoint_bytes"] = (float(size), "B")
    return out
