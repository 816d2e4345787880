"""Shared by the stage tasks: the retry rule (infrastructure errors only) and outcome bookkeeping."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run as prefect_task_run

from edgellm.errors import ConfigurationError, EdgeLLMError, ErrorKind, InfrastructureError
from results.errors import classify
from results.models import ResultStatus
from stages import Stage
from tasks.device_exec import DeviceRun, fetch_scope
from tasks.farm import Farm
from tasks.outcome import StageOutcome
from tasks.spec import JobSpec
from toolchains.base import require

log = logging.getLogger(__name__)

STAGE_RETRIES = 1  # after every device of the platform failed; a later attempt may find one back
RETRY_DELAY_S = 2.0


def stage_task(name: str) -> Callable[[Callable[..., StageOutcome]], Any]:
    """The Prefect task decorator every stage shares: retried only after infrastructure failures, never cached by
    Prefect (stages cache by content themselves: results/cache.py)."""
    return task(name=name, retries=STAGE_RETRIES, retry_delay_seconds=RETRY_DELAY_S, retry_condition_fn=infra_only,
                cache_policy=NO_CACHE)


def infra_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry a stage only when it failed for infrastructure reasons."""
    try:
        state.result()
    except InfrastructureError:
        return True
    except Exception:
        return False
    return False


def guarded(stage: Stage, body: Callable[[], StageOutcome]) -> StageOutcome:
    """Run a stage body: infrastructure errors propagate (Prefect retries them); anything else becomes an
    outcome with its error kind, so one broken model never stops the run."""
    started = time.time()
    try:
        with fetch_scope():  # what the stage fetched from its device is gone when it ends
            outcome = body().done()
    except InfrastructureError:
        raise
    except EdgeLLMError as exc:
        outcome = StageOutcome.from_error(stage, exc)
        outcome.duration_s = outcome.ended_at - started  # the body's time until it raised
    except Exception as exc:  # a full disk or a lost database is infrastructure (retried); the rest a bug
        known = classify(exc)
        if isinstance(known, InfrastructureError):
            raise known from exc
        log.exception("%s stage crashed", stage)
        outcome = StageOutcome.from_error(stage, known if isinstance(known, ConfigurationError) else exc)
        outcome.duration_s = outcome.ended_at - started
    outcome.started_at = min(outcome.started_at, started)
    outcome.task_run_id = str(prefect_task_run.id) if prefect_task_run.id else None
    return outcome


def upstream_problem(stage: Stage, upstream: StageOutcome | BaseException | None) -> StageOutcome | None:
    """The outcome to return without running, when the stage this one needs did not pass."""
    if upstream is None:
        return None
    if isinstance(upstream, BaseException):
        kind = upstream.kind if isinstance(upstream, EdgeLLMError) else ErrorKind.BUG
        return StageOutcome(stage=stage, status=ResultStatus.SKIPPED, error_kind=kind,
                            reason=f"upstream stage did not finish: {str(upstream).splitlines()[0][:500]}").done()
    if upstream.status is ResultStatus.NOT_APPLICABLE:  # what cannot apply upstream cannot apply here either
        return StageOutcome(stage=stage, status=ResultStatus.NOT_APPLICABLE, reason=upstream.reason).done()
    if not upstream.passed:
        return StageOutcome.skipped(stage, f"upstream {upstream.stage.value} {upstream.status.value}")
    return None


def from_device_run(stage: Stage, run: DeviceRun, job: JobSpec) -> StageOutcome:
    out = StageOutcome(stage=stage, status=run.status, device=run.device.id, reason=run.reason,
                       error_kind=run.error_kind, duration_s=run.duration_s,
                       toolchain_version=require(job.toolchain).version(run.env))
    if run.log is not None:
        out.artifacts.append(run.log)
    out.metrics["lease_wait_s"] = (run.lease_wait_s, "s")
    return out


def attempt_recorder(farm: Farm, job: JobSpec, stage: Stage) -> Callable[[Any, InfrastructureError, float], None]:
    def record(device: Any, exc: InfrastructureError, elapsed: float) -> None:
        with farm.lock:
            env = farm.backend_versions.get(device.id)  # None when the device never answered
        farm.recorder.record_attempt(
            farm.ctx.run_id, model=job.model, precision=job.precision, platform=job.platform, stage=stage,
            test_id=job.test_id, device=device.id, status=ResultStatus.ERROR, error_kind=ErrorKind.INFRASTRUCTURE,
            toolchain=job.toolchain, toolchain_version=None if env is None else require(job.toolchain).version(env),
            reason=str(exc).splitlines()[0][:2000], duration_s=elapsed,
        )

    return record
