"""Run a validated plan: open a run in the results database, record the plan's decisions, materialize the
checkpoints, submit the stage DAG, close the run with its status."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from edgefarm.artifacts.location import S3Location, parse_artifacts_url
from edgefarm.devices.pools import quantize_deployment, quantize_deployment_name
from edgefarm.devices.transport import open_transport
from edgefarm.devices.transport.base import transfer_counts, transfers_since
from edgefarm.flows import revision
from edgefarm.flows.flow_run_names import current_flow_run_id, flow_run_name, flow_run_tags, name_this_flow_run
from edgefarm.flows.pipeline import RunReport, record_plan_decisions, submit_jobs, timing_summary, toolchain_versions
from edgefarm.flows.plan import Plan
from edgefarm.flows.settings import Settings
from edgefarm.results.db import for_parameters, make_engine
from edgefarm.results.liveness import heartbeat, reap_stale_runs
from edgefarm.results.migrate import prepare_for_run
from edgefarm.results.models import RegressionSeverity, ResultStatus, RunKind, RunStatus
from edgefarm.results.quarantine import update_quarantine
from edgefarm.results.recorder import Recorder
from edgefarm.results.regressions import Flag, flag_regressions
from edgefarm.stages.job import CheckpointRef, job_key
from edgefarm.tasks import engines
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.tasks.host import sweep_dead_work
from edgefarm.test_lists.catalog import ModelSource
from edgellm.errors import ConfigurationError, EdgeLLMError
from edgellm.reference import checkpoint_digest

log = logging.getLogger(__name__)


def locate_checkpoints(models: list[str], sources: Mapping[str, ModelSource],
                       data_dir: Path) -> dict[str, CheckpointRef]:
    """Each model's checkpoint, located (synthetic ones made) and digested once for the whole run; the digests
    run in parallel (hashlib releases the GIL)."""
    paths = {m: Path(sources[m].locate(data_dir)).resolve() for m in models}
    with ThreadPoolExecutor(max_workers=4) as pool:
        digests = dict(zip(paths, pool.map(checkpoint_digest, paths.values()), strict=True))
    return {m: CheckpointRef(model=m, path=str(p), sha256=digests[m]) for m, p in paths.items()}


def execute_plan(plan: Plan, settings: Settings, *, trigger: str, host_slots: int | None = None,
                 run_id: int | None = None) -> tuple[RunReport, dict[str, float]]:
    """Run the plan in a new run, or in ``run_id`` (a run its caller started, e.g. a bring-up's); the run is
    finished here either way."""
    host_slots = settings.host_slots if host_slots is None else host_slots
    engine = make_engine(settings.db_url)
    prepare_for_run(engine)
    reap_stale_runs(engine)
    for path in sweep_dead_work(settings.data_dir):
        log.info("removed %s, left by a run that died", path)
    recorder = Recorder(engine)
    pool = revision.worker_pool()
    quantize_on = quantization_pool(plan, settings, pool)
    here = revision.current()
    if run_id is None:
        run_id = recorder.start_run(RunKind(plan.kind), trigger, here.git, toolchain=toolchain_versions())
        name_this_flow_run(flow_run_name(plan.kind, plan.name, run_id),
                           flow_run_tags(plan.kind, sorted({j.platform for j in plan.jobs}), toolchain_versions()))
    recorder.record_worker(run_id, role="orchestrator", pool=pool, host=revision.host_name(),
                           data_dir=str(settings.data_dir), revision=here.git, source_digest=here.source,
                           toolchains=toolchain_versions(), flow_run_id=current_flow_run_id())
    ctx = FarmContext(run_id=run_id, db_url=for_parameters(settings.db_url), data_dir=str(settings.data_dir),
                      inventory_dir=str(settings.inventory_dir), host_slots=host_slots,
                      quantize_device=settings.quantize_device,
                      max_unquantized_share=settings.max_unquantized_share, fetch_engines=settings.fetch_engines,
                      artifacts=settings.artifacts or "", artifact_cache_gb=settings.artifact_cache_gb,
                      quantize_on=quantize_on or "", revision=here.git, source_digest=here.source)
    report = RunReport(run_id=run_id)
    status, completed = RunStatus.ERROR, False  # unless the plan ran to its end
    started = time.time()
    moved = transfer_counts()
    try:
        with heartbeat(recorder, run_id):
            farm = Farm.get(ctx)
            record_plan_decisions(ctx, plan, report)
            models = {j.model for j in plan.runnable()}
            bases = {b.name for m in models if (b := plan.sources[m].base) is not None}  # their references' sources
            parts = {p for j in plan.runnable() for p in j.entry.features.part_models().values()}  # drafts, adapters
            checkpoints = locate_checkpoints(sorted(models | bases | parts), plan.sources, settings.data_dir)
            jobs = [(job, checkpoints[job.model]) for job in plan.runnable()]
            submit_jobs(ctx, jobs, report, plan.sources, checkpoints)
            if plan.kind == RunKind.NIGHTLY.value:
                fail_regressed(report, flag_regressions(engine, run_id))
            status = run_status(report)
            completed = True
            slots = {d.id: d.max_jobs for d in farm.inventory}
            timing = timing_summary(report, jobs, host_slots, slots)
    finally:
        try:
            # A run that broke off is ended but not published: its partial results never become evidence.
            recorder.finish_run(run_id, status, publish=completed)
            for q in update_quarantine(engine):
                log.warning("device %s quarantined: %s", q.device_id, q.reason)
        finally:
            release_devices(ctx)
            report.transfers = {d: c.to_dict() for d, c in sorted(transfers_since(moved).items())}
            Farm.close(ctx)
            engine.dispose()
    timing["run_wall_s"] = round(time.time() - started, 3)
    return report, timing


def quantization_pool(plan: Plan, settings: Settings, here: str | None) -> str | None:
    """The pool this run sends its quantize stages to (settings over the matrix), or None to quantize here (also
    when this flow run is a worker of that pool). Sending needs a store every worker reaches and the pool's
    deployment on the Prefect server: checked before the run starts (a ConfigurationError naming what to set)."""
    pool = settings.quantize_on or plan.quantize_on
    if pool is None or pool == here:
        return None
    if not isinstance(parse_artifacts_url(settings.artifacts), S3Location):
        raise ConfigurationError(
            f"quantize_on {pool!r}: the quantized checkpoints come back through the artifact store, and this run's "
            f"is {settings.artifacts or 'the data dir'} on this host only; set EDGEFARM_ARTIFACTS=s3://BUCKET/PREFIX "
            f"on every worker (or unset quantize_on / EDGEFARM_QUANTIZE_ON to quantize here)")
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    name = quantize_deployment(pool)
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
    except ObjectNotFound:
        raise ConfigurationError(
            f"quantize_on {pool!r}: the Prefect server has no deployment {name}; register it (prefect deploy "
            f"--prefect-file infra/prefect.yaml --name {quantize_deployment_name(pool)}) and start a worker of "
            f"pool {pool}, or unset quantize_on / EDGEFARM_QUANTIZE_ON to quantize here") from None
    return pool


def release_devices(ctx: FarmContext) -> None:
    """Remove the run's in-use markers from the caches of the devices it used (best effort: they also expire)."""
    farm = Farm.get(ctx)
    for device_id in sorted(farm.touched_devices):
        device = farm.inventory.devices.get(device_id)
        if device is None:
            continue
        try:
            with open_transport(device) as transport:
                engines.release_run(farm, transport)
        except EdgeLLMError as exc:
            log.warning("%s: could not remove run %s's in-use markers (they expire): %s", device_id, ctx.run_id,
                        str(exc).splitlines()[0])


def fail_regressed(report: RunReport, flags: list[Flag]) -> None:
    """An accuracy regression fails its job in the report too (the database already says so)."""
    for f in flags:
        outcome = report.outcomes.get(job_key(f.test_id, f.platform), {}).get(f.stage)
        if f.severity is RegressionSeverity.FAIL and outcome is not None:
            outcome.status = ResultStatus.FAIL
            outcome.reason = f"accuracy regression: {f.describe()}"
        elif outcome is not None:
            log.warning("performance regression in %s %s: %s", f.test_id, f.platform, f.describe())


def run_status(report: RunReport) -> RunStatus:
    """``failed`` when a test failed; else ``error`` when a stage broke (infrastructure, bug); else ``passed``."""
    seen = {o.status for stages in report.outcomes.values() for o in stages.values()}
    if ResultStatus.FAIL in seen:
        return RunStatus.FAILED
    return RunStatus.ERROR if ResultStatus.ERROR in seen else RunStatus.PASSED
