"""Submit a plan's jobs as a DAG of stage tasks: the transformers reference once per model, quantize and export
once per (model, precision), then per platform build -> infer -> accuracy (with the reference) and build -> bench,
each stage recorded as it finishes.

Tasks return outcomes for test failures and configuration errors (one broken model never stops the run); only
infrastructure failures raise, and those are retried by Prefect. ``allow_failure`` lets a stage see why its
upstream broke so it is recorded as skipped with that reason instead of vanishing.
"""

from __future__ import annotations

import logging
import statistics
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from prefect import allow_failure
from prefect.futures import PrefectFuture, wait

from edgellm.types import Precision
from flows.plan import Decision, Job, Plan
from results.models import ResultStatus
from stages import Stage
from tasks.accuracy import accuracy
from tasks.bench import bench
from tasks.build import build
from tasks.export import export
from tasks.farm import Farm, FarmContext
from tasks.infer import infer
from tasks.outcome import StageOutcome
from tasks.quantize import quantize
from tasks.record import record
from tasks.reference import reference
from tasks.spec import CheckpointRef, JobSpec
from test_lists.catalog import Catalog, ModelSource

log = logging.getLogger(__name__)

PLAN_STATUS = {
    Decision.NOT_APPLICABLE: ResultStatus.NOT_APPLICABLE,
    Decision.SKIPPED: ResultStatus.SKIPPED,
    Decision.WAIVED: ResultStatus.WAIVED,
}


@dataclass
class RunReport:
    run_id: int
    outcomes: dict[str, dict[Stage, StageOutcome]] = field(default_factory=lambda: defaultdict(dict))
    planned: dict[str, ResultStatus] = field(default_factory=dict)  # jobs decided at plan time
    references: dict[str, StageOutcome] = field(default_factory=dict)  # model -> its reference outcome
    job_models: dict[str, tuple[str, Precision]] = field(default_factory=dict)  # job key -> (model, precision)
    engine_overheads_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failed(self) -> list[str]:
        return sorted(k for k, st in self.outcomes.items()
                      if any(o.status in (ResultStatus.FAIL, ResultStatus.ERROR) for o in st.values()))

    def cache_hits(self) -> dict[str, int]:
        hits: dict[str, int] = defaultdict(int)
        for stages in self.outcomes.values():
            for stage, o in stages.items():
                if o.cached:
                    hits[stage.value] += 1
        return dict(hits)

    def stage_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for stages in self.outcomes.values():
            for o in stages.values():
                counts[o.status.value] += 1
        return dict(counts)


def job_spec(job: Job, checkpoint: CheckpointRef, source: ModelSource | None = None) -> JobSpec:
    """``source``: the model's catalog entry (its chat template and accuracy thresholds, when it names them)."""
    e = job.entry
    template = source.chat_template if source is not None else None
    return JobSpec(model=e.model, precision=e.precision, platform=job.platform, toolchain=job.toolchain,
                   test_id=e.test_id,
                   checkpoint=checkpoint, max_seq_len=e.max_seq_len, max_batch_size=e.max_batch_size,
                   max_input_len=e.max_input_len, stages=e.stages, timeouts=dict(e.timeouts),
                   lm_head_precision=e.lm_head_precision, kv_cache_precision=e.kv_cache_precision,
                   chat_template=None if template is None else str(template),
                   thresholds=dict(source.thresholds.get(e.precision, {})) if source is not None else {})


def record_plan_decisions(ctx: FarmContext, plan: Plan, report: RunReport) -> None:
    """Jobs that will not run are recorded too, with the reason: the matrix shows why a cell is empty."""
    farm = Farm.get(ctx)
    rows = []
    for job in plan.jobs:
        status = PLAN_STATUS.get(job.decision)
        if status is None:
            continue
        rows += [{"model": job.model, "precision": job.precision, "platform": job.platform, "stage": stage,
                  "test_id": job.test_id, "status": status, "reason": job.reason, "toolchain": job.toolchain}
                 for stage in job.entry.stages]
        report.planned[job.key] = status
    farm.recorder.record_results(ctx.run_id, rows)


def submit_jobs(ctx: FarmContext, jobs: list[tuple[Job, CheckpointRef]], report: RunReport,
                catalog: Catalog | None = None) -> None:
    """Submit every runnable job (with its checkpoint reference) and wait for all of them to be recorded."""
    submitted_at = time.time()
    quantized: dict[tuple[Any, ...], PrefectFuture[Any]] = {}  # once per checkpoint to make, whoever consumes it
    exported: dict[tuple[Any, ...], PrefectFuture[Any]] = {}  # once per export, whatever the number of platforms
    references: dict[str, PrefectFuture[Any]] = {}  # the reference depends on the (float source) checkpoint only
    records: list[tuple[str, Stage, PrefectFuture[Any]]] = []
    for job, checkpoint in jobs:
        spec = job_spec(job, checkpoint, catalog.get(job.model) if catalog is not None else None)
        pair = (job.model, job.precision)
        report.job_models[spec.key] = pair
        if Stage.ACCURACY in spec.stages and job.model not in references:
            references[job.model] = reference.submit(ctx, checkpoint, spec.timeout(Stage.ACCURACY))
        if spec.quantize_variant not in quantized:
            quantized[spec.quantize_variant] = quantize.submit(ctx, spec)
        q = quantized[spec.quantize_variant]
        if spec.export_variant not in exported:
            exported[spec.export_variant] = export.submit(ctx, spec, allow_failure(q), spec.timeout(Stage.EXPORT))
        x = exported[spec.export_variant]
        futures: dict[Stage, PrefectFuture[Any]] = {Stage.QUANTIZE: q, Stage.EXPORT: x}
        stages = set(spec.stages)
        if Stage.BUILD in stages:
            futures[Stage.BUILD] = build.submit(ctx, spec, allow_failure(x))
        if Stage.INFER in stages:
            futures[Stage.INFER] = infer.submit(ctx, spec, allow_failure(futures[Stage.BUILD]))
        if Stage.ACCURACY in stages:
            futures[Stage.ACCURACY] = accuracy.submit(ctx, spec, allow_failure(futures[Stage.INFER]),
                                                      allow_failure(references[job.model]))
        if Stage.BENCH in stages:
            futures[Stage.BENCH] = bench.submit(ctx, spec, allow_failure(futures[Stage.BUILD]))
        for stage in spec.stages:
            rec = record.submit(ctx, spec, stage, allow_failure(futures[stage]))
            records.append((spec.key, stage, rec))
    wait([r for _, _, r in records])
    for key, stage, fut in records:
        report.outcomes[key][stage] = fut.result()
    for model, fut in references.items():
        outcome = fut.result(raise_on_failure=False)
        if isinstance(outcome, StageOutcome):
            report.references[model] = outcome
    report.wall_s = time.time() - submitted_at
    report.engine_overheads_s = engine_overheads(report)


def engine_overheads(report: RunReport) -> list[float]:
    """Per stage task: Prefect's time around the task body (its run's Running -> Completed span minus the body),
    read back from the API once the run's events have landed (a few hundred ms)."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    bodies = {o.task_run_id: o.ended_at - o.started_at for stages in report.outcomes.values()
              for o in stages.values() if o.task_run_id and o.ended_at}
    if not bodies:
        return []
    ids = [uuid.UUID(i) for i in bodies]
    runs: list[Any] = []
    try:
        with get_client(sync_client=True) as client:
            deadline = time.time() + 10
            while time.time() < deadline:
                runs = client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=ids)))
                if len(runs) == len(ids) and all(r.end_time for r in runs):
                    break
                time.sleep(0.2)
    except Exception as exc:  # measuring must never fail a run
        log.warning("could not read task runs to measure orchestration overhead: %s", exc)
        return []
    return [max(0.0, (r.end_time - r.start_time).total_seconds() - bodies[str(r.id)])
            for r in runs if r.start_time and r.end_time and str(r.id) in bodies]


def timing_summary(report: RunReport, jobs: list[tuple[Job, CheckpointRef]], host_slots: int,
                   device_slots: dict[str, int]) -> dict[str, float]:
    """Wall time vs the critical path (the longest dependent chain, or the busiest resource's work divided by
    its slots, whichever is longer); Prefect's overhead per task (around the body); and the per-task start latency
    once its inputs were ready (which includes waiting for a worker thread)."""
    chains, overheads = [], []
    busy: dict[str, float] = defaultdict(float)
    shared_done: set[str] = set()
    for key, stages in report.outcomes.items():
        o = stages

        def d(stage: Stage, o: dict[Stage, StageOutcome] = o) -> float:
            return o[stage].duration_s if stage in o else 0.0

        model, precision = report.job_models[key]
        ref = report.references[model].duration_s if model in report.references else 0.0
        head = d(Stage.QUANTIZE) + d(Stage.EXPORT) + d(Stage.BUILD)
        chains.append(max(head + d(Stage.INFER), ref) + d(Stage.ACCURACY))
        chains.append(head + d(Stage.BENCH))
        for stage, outcome in stages.items():
            if stage in (Stage.QUANTIZE, Stage.EXPORT):
                ident = f"{model}:{precision}:{stage}"
                if ident in shared_done:
                    continue
                shared_done.add(ident)
                busy["host"] += outcome.duration_s
            elif outcome.device:
                busy[outcome.device] += outcome.duration_s
        upstream = {Stage.EXPORT: Stage.QUANTIZE, Stage.BUILD: Stage.EXPORT, Stage.INFER: Stage.BUILD,
                    Stage.ACCURACY: Stage.INFER, Stage.BENCH: Stage.BUILD}
        for stage, outcome in stages.items():
            up = upstream.get(stage)
            if up is not None and up in stages and stages[up].ended_at and outcome.started_at:
                overheads.append(max(0.0, outcome.started_at - stages[up].ended_at))
    busy["host"] += sum(o.duration_s for o in report.references.values() if not o.cached)
    loads = [busy["host"] / max(1, host_slots)] + [v / max(1, device_slots.get(k, 1))
                                                   for k, v in busy.items() if k != "host"]
    critical = max([*chains, *loads, 1e-9])
    return {
        "wall_s": round(report.wall_s, 3),
        "critical_path_s": round(critical, 3),
        "wall_over_critical_path": round(report.wall_s / critical, 3),
        "median_task_start_latency_ms": round(statistics.median(overheads) * 1000, 1) if overheads else 0.0,
        "median_task_overhead_ms": round(statistics.median(report.engine_overheads_s) * 1000, 1)
        if report.engine_overheads_s else 0.0,
        "tasks_measured": float(len(report.engine_overheads_s)),
    }


def toolchain_versions() -> dict[str, str]:
    import importlib.metadata

    versions = {}
    for pkg in ("edgellm-farm", "onnxruntime", "onnx", "torch", "transformers", "prefect", "sqlalchemy"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions
