"""Record: write one stage's outcome (status, reason, error kind, metrics, artifact refs) to the results database.

Called by the scheduler (``flows.pipeline``) in the flow's own thread as each stage's task run ends, whatever its end
(an outcome, an exception, a crash): a stage is one Prefect task run, its record no second one. Idempotent: the
result is keyed by (run, model, precision, platform, stage, test id), so a retried record never duplicates a row; the
result, its metrics, its artifact refs and its attempt go in one transaction. It names the toolchain that made it (a
quantizer's for a quantize stage) and the one its job ran with (its row's). A stage the database does not record (one
without a ``Stage`` of its own) is only reported (progress event, returned outcome).
"""

from __future__ import annotations

import time

from edgefarm import stages
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.environment import host_record
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.tasks.progress import StageEvent, emit
from edgefarm.tasks.states import task_run_name
from edgellm.errors import EdgeLLMError, InfrastructureError

RECORD_TRIES = 3  # an infrastructure error (the database briefly unreachable) is tried again, a second apart
RETRY_DELAY_S = 1.0


def as_outcome(stage: str, outcome: StageOutcome | BaseException) -> StageOutcome:
    """What a stage's task run ended with, as an outcome: its own, or the exception it raised as an error (a timeout
    as infrastructure; a crash, which Prefect shows as Crashed, says so)."""
    if isinstance(outcome, StageOutcome):
        return outcome
    if not isinstance(outcome, Exception):  # SystemExit, KeyboardInterrupt...: Prefect marked the task run Crashed
        crashed = StageOutcome.from_error(stage, outcome)
        crashed.reason = f"crashed: {crashed.reason}"
        return crashed
    if not isinstance(outcome, EdgeLLMError):  # Prefect's own (a timeout) or a bug
        reason = f"{type(outcome).__name__}: {outcome}"
        return StageOutcome.from_error(stage, InfrastructureError(reason) if isinstance(outcome, TimeoutError)
                                       else outcome)
    return StageOutcome.from_error(stage, outcome)


def record(ctx: FarmContext, job: JobSpec, stage: str, outcome: StageOutcome | BaseException) -> StageOutcome:
    """Record what ``stage`` of ``job`` ended with and say it ended (progress event); returns the recorded outcome.
    An infrastructure error writing it is tried again (``RECORD_TRIES`` in all), then raised."""
    result = as_outcome(stage, outcome)
    if result.standin:  # said on every page that shows the row (and never counted: results/queries.py)
        result.reason = f"STAND-IN tools (test only, never evidence): {result.reason or result.status.value}"
    if stages.spec(stage).recorded:
        for attempt in range(1, RECORD_TRIES + 1):
            try:
                _write(ctx, job, stage, result)
                break
            except InfrastructureError:
                if attempt == RECORD_TRIES:
                    raise
                time.sleep(RETRY_DELAY_S)
    emit(StageEvent(job=job.key, stage=str(stage), status=result.status.value, device=result.device,
                    cached=result.cached, name=task_run_name(str(stage), job), duration_s=result.duration_s,
                    reason=result.reason))
    return result


def _write(ctx: FarmContext, job: JobSpec, stage: str, result: StageOutcome) -> None:
    """The result row (with its metrics and artifact refs) and, for a stage that ran on a device, its attempt: one
    transaction."""
    model_revision = job.checkpoint.sha256  # the source checkpoint's one digest, whatever the stage
    key = {"model": job.model, "precision": job.precision, "platform": job.platform, "stage": stage,
           "test_id": job.test_id}
    toolchain = result.toolchain or job.toolchain  # the maker's
    row = dict(
        key, status=result.status, toolchain=toolchain, toolchain_version=result.toolchain_version,
        model_revision=model_revision, device=result.device, reason=result.reason, error_kind=result.error_kind,
        duration_s=round(result.duration_s, 4),
        metrics={**job.estimate_metrics, **result.metrics},  # the plan's estimate beside what the stage measured
        artifacts=result.artifacts, route=result.route, standin=result.standin,
        chosen_versions=job.chosen_versions, job_toolchain=job.toolchain,  # the row's
        variant=job.variant,
        environment=result.environment or host_record(), bench_conditions=result.bench_conditions,
    )
    attempts = []
    if result.device is not None and not result.cached:
        attempts.append(dict(key, device=result.device, status=result.status, toolchain=toolchain,
                             toolchain_version=result.toolchain_version, error_kind=result.error_kind,
                             reason=result.reason, duration_s=round(result.duration_s, 4)))
    Farm.get(ctx).recorder.record_results(ctx.run_id, [row], attempts)
