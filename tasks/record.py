"""Record: write one stage's outcome (status, reason, error kind, metrics, artifact refs) to the results database.

Idempotent: the result is keyed by (run, model, precision, platform, stage, test id), so a retried record never
duplicates a row; the result and its metrics go in one transaction. It names the toolchain that made it (a
quantizer's for a quantize stage) and the one its job ran with (its row's). A stage the database does not record
(one without a ``Stage`` of its own) is only reported (progress event, returned outcome).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

import stages
from edgellm.errors import EdgeLLMError, InfrastructureError
from stages.job import JobSpec
from stages.outcome import StageOutcome
from tasks.common import infra_only
from tasks.environment import host_record
from tasks.farm import Farm, FarmContext
from tasks.progress import StageEvent, emit
from tasks.states import task_run_name


def as_outcome(stage: str, outcome: StageOutcome | BaseException) -> StageOutcome:
    if isinstance(outcome, StageOutcome):
        return outcome
    if not isinstance(outcome, EdgeLLMError):  # Prefect's own (a timeout, a crash) or a bug
        reason = f"{type(outcome).__name__}: {outcome}"
        return StageOutcome.from_error(stage, InfrastructureError(reason) if isinstance(outcome, TimeoutError)
                                       else outcome)
    return StageOutcome.from_error(stage, outcome)


@task(name="record", retries=2, retry_delay_seconds=1.0, retry_condition_fn=infra_only, cache_policy=NO_CACHE)
def record(ctx: FarmContext, job: JobSpec, stage: str, outcome: StageOutcome | BaseException) -> StageOutcome:
    result = as_outcome(stage, outcome)
    if result.standin:  # said on every page that shows the row (and never counted: results/queries.py)
        result.reason = f"STAND-IN tools (test only, never evidence): {result.reason or result.status.value}"
    if stages.spec(stage).recorded:
        model_revision = job.checkpoint.sha256  # the source checkpoint's one digest, whatever the stage
        farm = Farm.get(ctx)
        farm.recorder.record_result(
            ctx.run_id, model=job.model, precision=job.precision, platform=job.platform, stage=stage,
            test_id=job.test_id, status=result.status, toolchain=result.toolchain or job.toolchain,
            toolchain_version=result.toolchain_version, model_revision=model_revision, device=result.device,
            reason=result.reason, error_kind=result.error_kind, duration_s=round(result.duration_s, 4),
            metrics={**job.estimate_metrics, **result.metrics},  # the plan's estimate beside what the stage measured
            artifacts=result.artifacts, route=result.route, standin=result.standin,
            chosen_versions=job.chosen_versions, job_toolchain=job.toolchain,  # the row's; toolchain: the maker's
            variant=job.variant,
            environment=result.environment or host_record(), bench_conditions=result.bench_conditions,
        )
        if result.device is not None and not result.cached:
            farm.recorder.record_attempt(
                ctx.run_id, model=job.model, precision=job.precision, platform=job.platform, stage=stage,
                test_id=job.test_id, device=result.device, status=result.status,
                toolchain=result.toolchain or job.toolchain,
                toolchain_version=result.toolchain_version, error_kind=result.error_kind,
                reason=result.reason, duration_s=round(result.duration_s, 4),
            )
    emit(StageEvent(job=job.key, stage=str(stage), status=result.status.value, device=result.device,
                    cached=result.cached, name=task_run_name(str(stage), job), duration_s=result.duration_s,
                    reason=result.reason))
    return result
