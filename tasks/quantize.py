"""Quantize: produce the checkpoint a precision is exported from, and return its reference.

Where the job's export reads the source checkpoint (unquantized precisions, and precisions its toolchain quantizes
in its own export), quantize is the identity: the source's own reference, no copy, no second digest. Otherwise the
toolchain the plan chose as the job's quantizer (``JobSpec.quantizer``: the one whose driver ``quantizes()`` the
precision) runs on the orchestrating host, once per (model, precision, LM head, KV cache) whichever toolchain
consumes it. Its key and work are the driver's (``ToolchainDriver.quantize_key`` / ``quantize``); the generic body
caches its product by content (``stages.StageCache``). The quantizer not installed -> skipped, with the reason.
"""

from __future__ import annotations

from pathlib import Path

from artifacts.store import ArtifactRef
from edgellm.types import UNQUANTIZED
from results.models import ResultStatus
from stages import Stage
from stages.job import JobSpec
from stages.outcome import Keyed, StageOutcome
from tasks.farm import FarmContext
from tasks.host import FarmHostWork


def quantize_key(ctx: FarmContext, job: JobSpec) -> Keyed | StageOutcome:
    """The table's cache key function; the outcome itself where no quantizer runs (identity, none available)."""
    maker = job.quantizer_driver(ctx.data_dir)
    if maker is None:
        return identity(job)
    state = maker.available()
    if not state.ok:
        return StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.SKIPPED, toolchain=maker.name,
                            reason=f"toolchain {maker.name} is not available: {state.reason}")
    work = FarmHostWork(ctx, job, Stage.QUANTIZE)
    version = job.quantizer_version or maker.host_version()  # the plan resolved it; a job made by hand may not

    def on_hit(ref: ArtifactRef) -> StageOutcome:  # a stored checkpoint is judged again like a new one
        out = maker.judge_quantized(work, job, version, ref)
        out.reason = f"cache hit; {out.reason}"
        return out

    return Keyed(maker.quantize_key_inputs(job, ctx.quantize_device, version), toolchain=maker.name,
                 toolchain_version=version, on_hit=on_hit)


def quantize(ctx: FarmContext, job: JobSpec, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: the quantizer's work (as the key found it)."""
    maker = job.quantizer_driver(ctx.data_dir)
    assert maker is not None
    return maker.quantize(FarmHostWork(ctx, job, Stage.QUANTIZE), job, keyed)


def identity(job: JobSpec) -> StageOutcome:
    ref = job.checkpoint
    why = (f"identity for {job.precision}" if job.precision in UNQUANTIZED
           else f"identity: toolchain {job.toolchain} quantizes {job.precision} in its export")
    out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS, reason=f"{why} (checkpoint sha256 "
                                                                              f"{ref.sha256[:12]})")
    out.outputs["checkpoint"] = ref
    out.outputs["quantized_linears"] = 0
    size = sum(p.stat().st_size for p in Path(ref.path).rglob("*") if p.is_file())
    out.metrics["checkpoint_bytes"] = (float(size), "B")
    return out
