"""The one task body every stage of the table (``stages.STAGES``) runs in: skip when a stage it needs did not pass
(not applicable propagates), look the stage's product up in the content cache when it declares one (a verified hit
is the outcome; on a miss what the work made is remembered), call the stage's own work with the outcomes it needs (a
host stage's under one of the host's slots), turn errors into outcomes by kind (only infrastructure errors raise,
and only they are retried), log the outcome and note the Prefect task run."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeAlias

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run as prefect_task_run
from prefect.states import State

from edgefarm import stages
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.results import cache
from edgefarm.results.errors import classify
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage, Where
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.tasks import environment
from edgefarm.tasks.device_exec import DeviceRun, fetch_scope
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.tasks.host_gate import HostGate, gate_dir
from edgefarm.tasks.progress import StageEvent, emit
from edgefarm.tasks.run_logs import log_tails
from edgefarm.tasks.states import stage_state, task_run_name
from edgefarm.toolchains.base import ToolchainDriver
from edgellm.errors import ConfigurationError, EdgeLLMError, ErrorKind, InfrastructureError

log = logging.getLogger(__name__)

STAGE_RETRIES = 1  # after every device of the platform failed; a later attempt may find one back
RETRY_DELAY_S = 2.0


def infra_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry a stage only when it failed for infrastructure reasons."""
    try:
        state.result()
    except InfrastructureError:
        return True
    except Exception:
        return False
    return False


Upstream: TypeAlias = StageOutcome | BaseException  # what a needed stage's future resolved to (``allow_failure``)
StageWork: TypeAlias = Callable[..., StageOutcome]  # a stage's own work: (ctx, job, *outcomes of its needs) -> outcome


def run_stage(ctx: FarmContext, stage: str, job: JobSpec, upstream: tuple[Upstream, ...]) -> StageOutcome:
    """The generic body: ``upstream`` holds the outcomes of the stage's needs, in the table's order, then, for a job
    that runs after another (``JobSpec.after``: an EAGLE3 draft after its base), that one's same stage (its gate):
    skipped, with the reason, unless the gate passed."""
    spec = stages.spec(stage)
    if len(upstream) not in (len(spec.needs), len(spec.needs) + 1):
        raise ValueError(f"stage {stage} needs {', '.join(spec.needs) or 'nothing'} (and at most one gate); got "
                         f"{len(upstream)} outcome(s)")
    upstream, gate = upstream[:len(spec.needs)], upstream[len(spec.needs):]
    for outcome in gate:  # the same stage of the job this one runs after (JobSpec.after) must have passed
        if isinstance(outcome, BaseException) or not outcome.passed:
            why = outcome if isinstance(outcome, BaseException) else f"{outcome.status.value}: {outcome.reason or ''}"
            problem = StageOutcome.skipped(stage, f"runs after {job.after}, whose {stage} did not pass ({why})"[:1000])
            log.info("%s %s: skipped (%s)", stage, job.key, problem.reason)
            return problem
    for need, outcome in zip(spec.needs, upstream, strict=True):
        # a need the job lists, or the database records, has its failure reported: this stage is skipped; one the
        # job neither lists nor could record (the reference) would vanish, so this stage reports it as its own
        reported = need in job.stages or stages.spec(need).recorded
        problem = upstream_problem(stage, outcome) if reported else adopted_problem(stage, need, outcome)
        if problem is not None:
            log.info("%s %s: %s without running (%s)", stage, job.key, problem.status.value, problem.reason)
            return problem
    ready = [o for o in upstream if isinstance(o, StageOutcome)]
    emit(StageEvent(job=job.key, stage=stage, status="start", device=None, cached=False,
                    name=prefect_task_run.name or task_run_name(stage, job)))
    outcome = guarded(stage, lambda: _work(ctx, spec, job, ready))
    if stage not in job.stages:  # no record says its end (a model's reference, an identity quantize): said here
        emit(StageEvent(job=job.key, stage=stage, status=outcome.status.value, device=outcome.device,
                        cached=outcome.cached, name=prefect_task_run.name or task_run_name(stage, job),
                        duration_s=outcome.duration_s, reason=outcome.reason))
    log_tails(ctx, outcome)
    log.info("%s %s: %s in %.2f s%s%s", stage, job.key, outcome.status.value, outcome.duration_s,
             " (cached)" if outcome.cached else "", f": {outcome.reason}" if outcome.reason else "")
    return outcome


def work_again(ctx: FarmContext, stage: str, job: JobSpec, ready: list[StageOutcome]) -> StageOutcome:
    """A stage's work once more, behind its cache (whose verify decides whether the product it holds is still
    usable): what a later stage asks for when the product it was handed is lost (an engine's device went down)."""
    return _work(ctx, stages.spec(stage), job, ready)


def _work(ctx: FarmContext, spec: stages.StageSpec, job: JobSpec, ready: list[StageOutcome]) -> StageOutcome:
    """The stage's work, behind its content cache when it declares one (``stages.StageCache``)."""
    declared = spec.cache
    if declared is None:
        return _slotted(ctx, spec, lambda: stage_work(spec.name)(ctx, job, *ready))
    from edgefarm.tasks.stage_work import work_of  # its modules import this one

    functions = work_of(spec.name)
    if functions.key is None:
        raise ConfigurationError(f"stage {spec.name} is cached but tasks.stage_work names no key function for it")
    keyed = functions.key(ctx, job, *ready)
    if isinstance(keyed, StageOutcome):  # decided without the cache (an identity precision, no toolchain)
        return keyed
    if not isinstance(keyed, Keyed):
        raise TypeError(f"stage {spec.name}: {functions.key.__qualname__} returned {type(keyed).__name__}, not Keyed "
                        f"or an outcome")
    farm = Farm.get(ctx)
    key = cache.cache_key(keyed.inputs)
    hit = cache.lookup(farm.engine, key)
    ref = None
    # has() re-hashes the blob (a corrupt one is evicted: a miss); an entry of another kind (made before the
    # product changed) or one its verify refuses is a miss too, and the new product replaces it
    if hit is not None and hit.kind == declared.kind and farm.store.has(hit.sha256):
        ref = farm.store.ref(hit.sha256, declared.kind, declared.packing)
        if functions.verify is not None and not functions.verify(ctx, job, ref):
            ref = None
    if hit is not None and ref is not None:
        cache.touch(farm.engine, key)
        log.info("%s %s: cache hit (key %s, %s sha256 %s)", spec.name, job.key, key[:12], declared.kind,
                 hit.sha256[:12])
        return _hit(spec, keyed, ref, hit.toolchain_version)
    try:
        out = _slotted(ctx, spec, lambda: stage_work(spec.name)(ctx, job, *ready, keyed=keyed))
    finally:
        if keyed.product is not None:
            cache.remember(farm.engine, key, declared.kind, keyed.product.sha256, keyed.inputs,
                           toolchain=keyed.toolchain, toolchain_version=keyed.product_version)
    if out.toolchain_version is None:
        out.toolchain_version = keyed.toolchain_version
    if declared.output in out.outputs:  # it handed a new product on
        out.metrics.setdefault(declared.hit_metric, (0.0, ""))
    return out


def _hit(spec: stages.StageSpec, keyed: Keyed, ref: ArtifactRef, made_with: str | None) -> StageOutcome:
    """A verified hit's outcome: the stored product handed on, with the version of the toolchain that made it."""
    declared = spec.cache
    assert declared is not None
    if keyed.on_hit is not None:
        out = keyed.on_hit(ref)
    else:
        out = StageOutcome(stage=spec.name, status=ResultStatus.PASS, reason=declared.hit_reason,
                           device=keyed.device, route=keyed.route, standin=keyed.standin,
                           toolchain_version=made_with if made_with is not None else keyed.toolchain_version)
        out.outputs[declared.output] = ref
        if spec.recorded:  # the evidence of its result row
            out.artifacts.append(ref)
    out.cached = True
    out.metrics[declared.hit_metric] = (1.0, "")
    return out


def _slotted(ctx: FarmContext, spec: stages.StageSpec, work: Callable[[], StageOutcome]) -> StageOutcome:
    """A host stage's work holds one of the orchestrating host's slots while it runs, and the host gate shared (a
    benchmark on a device of this host waits for it, and it for the benchmark: ``tasks.host_gate``)."""
    if spec.where is not Where.HOST:
        return work()
    with Farm.get(ctx).host_slots, HostGate(gate_dir(ctx.data_dir)).shared(f"host stage {spec.name}"):
        return work()


@task(name="stage", retries=STAGE_RETRIES, retry_delay_seconds=RETRY_DELAY_S, retry_condition_fn=infra_only,
      cache_policy=NO_CACHE)
def _stage_task(ctx: FarmContext, stage: str, job: JobSpec, upstream: tuple[Upstream, ...]) -> State[StageOutcome]:
    """The stage's outcome as the task run's final state (Failed when the stage failed: ``flows.run_state``); its
    data, the outcome, is what the stages after it read and what the scheduler records (``flows.pipeline``)."""
    return stage_state(run_stage(ctx, stage, job, upstream))


@functools.cache
def stage_task(stage: str) -> Task[..., State[StageOutcome]]:
    """The Prefect task of a stage (named after it): retried only after infrastructure failures, never cached by
    Prefect (stages cache by content themselves: results/cache.py)."""
    return _stage_task.with_options(name=stages.spec(stage).name)


def stage_work(stage: str) -> StageWork:
    """The work that runs a stage (``tasks.stage_work``)."""
    from edgefarm.tasks.stage_work import work_of  # its modules import this one

    return work_of(stage).runs


def guarded(stage: str, body: Callable[[], StageOutcome]) -> StageOutcome:
    """Run a stage body: infrastructure errors propagate (Prefect retries them); anything else becomes an
    outcome with its error kind, so one broken model never stops the run."""
    started = time.time()
    try:
        with fetch_scope():  # what the stage fetched from its device is gone when it ends
            outcome = body()
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
    # timed from the body's start, not the outcome's creation (work may build its outcome when it ends)
    outcome.started_at = min(outcome.started_at, started)
    outcome.done()
    outcome.task_run_id = str(prefect_task_run.id) if prefect_task_run.id else None
    return outcome


def upstream_problem(stage: str, upstream: Upstream | None) -> StageOutcome | None:
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
        return StageOutcome.skipped(stage, f"upstream {upstream.stage} {upstream.status.value}")
    return None


def adopted_problem(stage: str, need: str, upstream: Upstream) -> StageOutcome | None:
    """This stage's outcome when ``need`` (a stage without its own result row: the reference) could not be made:
    its error kind, and why, reported as this stage's; else None."""
    if isinstance(upstream, BaseException):
        where = "orchestrator" if stages.spec(need).where is Where.HOST else None
        out = StageOutcome.from_error(stage, upstream, device=where)
    elif not upstream.passed:
        out = StageOutcome(stage=stage, status=upstream.status, device=upstream.device,
                           reason=upstream.reason, error_kind=upstream.error_kind,
                           duration_s=upstream.duration_s, artifacts=list(upstream.artifacts))
        if out.status is ResultStatus.SKIPPED:
            return out.done()
    else:
        return None
    out.reason = f"{need}: {out.reason or 'failed'}"[:2000]
    if out.status is ResultStatus.PASS:
        out.status = ResultStatus.ERROR
    return out.done()


def from_device_run(stage: str, run: DeviceRun, toolchain: ToolchainDriver) -> StageOutcome:
    """A device stage's outcome as its run left it: where it ran, the toolchain's version there, its route and
    whether the device runs stand-ins of the tools (its results are never evidence)."""
    version = toolchain.device().device_version(run.device, run.env)
    out = StageOutcome(stage=stage, status=run.status, device=run.device.id, reason=run.reason,
                       error_kind=run.error_kind, duration_s=run.duration_s,
                       toolchain_version=version, route=toolchain.route(run.device),
                       standin=toolchain.device().standin(run.device),
                       environment=environment.device_record(run.device.id, str(run.device.platform), run.env,
                                                             toolchain.name, version))
    if run.log is not None:
        out.artifacts.append(run.log)
    out.metrics["lease_wait_s"] = (run.lease_wait_s, "s")
    return out


def attempt_recorder(farm: Farm, job: JobSpec, stage: Stage,
                     toolchain: ToolchainDriver) -> Callable[[Any, InfrastructureError, float], None]:
    def record(device: Any, exc: InfrastructureError, elapsed: float) -> None:
        with farm.lock:
            env = farm.backend_versions.get(device.id)  # None when the device never answered
        farm.recorder.record_attempt(
            farm.ctx.run_id, model=job.model, precision=job.precision, platform=job.platform, stage=stage,
            test_id=job.test_id, device=device.id, status=ResultStatus.ERROR, error_kind=ErrorKind.INFRASTRUCTURE,
            toolchain=job.toolchain,
            toolchain_version=None if env is None else toolchain.device().device_version(device, env),
            reason=str(exc).splitlines()[0][:2000], duration_s=elapsed,
        )

    return record
