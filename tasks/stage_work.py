"""What runs each stage of the table (``stages.STAGES``): its work, and for a cached stage its key function and the
check of a stored hit, as plain function references (readers and tools follow the calls).

``stages`` declares what a stage is (needs, where, cache inputs, timeouts) and imports nothing of ``tasks``; this
module says which function does it. The one generic task body (``tasks.common.run_stage``) asks :func:`work_of`.
A stage added to the table adds one entry here (a test registers its throwaway stage's with :func:`register`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgefarm.artifacts.store import ArtifactRef
from edgefarm.stages import REFERENCE, Stage
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.tasks import accuracy, bench, build, export, infer, quantize, reference
from edgefarm.tasks.farm import FarmContext
from edgellm.errors import ConfigurationError

# a stage's own work: (ctx, job, *outcomes of its needs[, keyed=Keyed for a cached stage]) -> outcome
Work = Callable[..., StageOutcome]
# a cached stage's key: (ctx, job, *outcomes of its needs) -> Keyed, or an outcome that decides without the cache
KeyFunction = Callable[..., Keyed | StageOutcome]
# whether a stored hit is still usable beyond its blob (the device holding an engine still has it)
Verify = Callable[[FarmContext, JobSpec, ArtifactRef], bool]


@dataclass(frozen=True)
class StageWork:
    runs: Work
    key: KeyFunction | None = None  # set exactly for the stages the table caches (``StageSpec.cache``)
    verify: Verify | None = None  # None: a hit's blob is the product


WORK: dict[str, StageWork] = {
    REFERENCE: StageWork(reference.reference, key=reference.reference_key),
    Stage.QUANTIZE: StageWork(quantize.quantize, key=quantize.quantize_key),
    Stage.EXPORT: StageWork(export.export, key=export.export_key),
    Stage.BUILD: StageWork(build.build, key=build.build_key, verify=build.engine_present),
    Stage.INFER: StageWork(infer.infer),
    Stage.ACCURACY: StageWork(accuracy.accuracy),
    Stage.BENCH: StageWork(bench.bench),
}


def work_of(stage: str) -> StageWork:
    """The functions that run ``stage``; a stage of the table without them is a ConfigurationError."""
    try:
        return WORK[str(stage)]
    except KeyError:
        raise ConfigurationError(f"stage {stage!r} names no work in tasks.stage_work; "
                                 f"registered: {', '.join(WORK)}") from None


def register(stage: str, work: StageWork) -> None:
    """Add the work of a stage registered in ``stages`` after this module's table (tests' throwaway stages)."""
    if str(stage) in WORK:
        raise ConfigurationError(f"stage {stage!r} has its work registered twice")
    WORK[str(stage)] = work


def unregister(stage: str) -> None:
    WORK.pop(str(stage), None)
