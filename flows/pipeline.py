"""Submit a plan's jobs as a DAG of stage tasks, derived from the stage table (``stages.STAGES``): each job runs
its listed stages and what they need, in pipeline order; a stage shared wider than one job runs once for all the
jobs that share it (the transformers reference once per model, quantize once per checkpoint to make, export once per
(model, precision, toolchain) whatever the platforms). Each stage is one Prefect task run; the scheduler records it
for every job that lists it as it ends, whatever its end (an outcome, an exception, a crash: ``tasks.record``).

Tasks return outcomes for test failures and configuration errors (one broken model never stops the run); only
infrastructure failures raise, and those are retried by Prefect. ``allow_failure`` lets a stage see why its
upstream broke so it is recorded as skipped with that reason instead of vanishing (a crashed upstream, which
``allow_failure`` does not let through, is handed on as the exception it crashed with).
"""

from __future__ import annotations

import logging
import queue
import statistics
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect import allow_failure
from prefect.futures import PrefectFuture
from prefect.utilities.annotations import quote

from edgefarm import stages
from edgefarm.flows.plan import Decision, Job, Plan
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Where
from edgefarm.stages.job import CheckpointRef, JobSpec, chosen_versions, estimate_metric, job_key
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.common import stage_task
from edgefarm.tasks.environment import host_record
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.tasks.record import record
from edgefarm.tasks.states import task_run_name
from edgefarm.test_lists.catalog import ModelSource

log = logging.getLogger(__name__)

PLAN_STATUS = {
    Decision.NOT_APPLICABLE: ResultStatus.NOT_APPLICABLE,
    Decision.SKIPPED: ResultStatus.SKIPPED,
    Decision.WAIVED: ResultStatus.WAIVED,
}


@dataclass
class RunReport:
    run_id: int
    outcomes: dict[str, dict[str, StageOutcome]] = field(default_factory=lambda: defaultdict(dict))  # as recorded
    planned: dict[str, ResultStatus] = field(default_factory=dict)  # jobs decided at plan time
    runs: dict[tuple[str, tuple[object, ...]], StageOutcome] = field(default_factory=dict)  # each stage run, once
    ran: dict[str, dict[str, tuple[str, tuple[object, ...]]]] = field(default_factory=lambda: defaultdict(dict))
    engine_overheads_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    # what crossed to and from each device during the run (devices.transport.TransferCounts as dicts): engines
    # stay on their devices, so no engine file comes back unless fetch_engines asked
    transfers: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return sorted(k for k, st in self.outcomes.items()
                      if any(o.status in (ResultStatus.FAIL, ResultStatus.ERROR) for o in st.values()))

    def cache_hits(self) -> dict[str, int]:
        hits: dict[str, int] = defaultdict(int)
        for recorded in self.outcomes.values():
            for stage, o in recorded.items():
                if o.cached:
                    hits[str(stage)] += 1
        return dict(hits)

    def stage_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for recorded in self.outcomes.values():
            for o in recorded.values():
                counts[o.status.value] += 1
        return dict(counts)


def job_spec(job: Job, checkpoint: CheckpointRef, source: ModelSource | None = None,
             reference: CheckpointRef | None = None, parts: Mapping[str, CheckpointRef] | None = None) -> JobSpec:
    """``source``: the model's catalog entry (its chat template and accuracy thresholds, when it names them);
    ``reference``: the checkpoint of its float base, when the catalog names one (a pre-quantized checkpoint's);
    ``parts``: located checkpoints by model, among them those its variant reads (a draft, an adapter...)."""
    e = job.entry
    located = tuple((role, (parts or {})[name]) for role, name in sorted(e.features.part_models().items()))
    template = source.chat_template if source is not None else None
    return JobSpec(model=e.model, precision=e.precision, platform=job.platform, toolchain=job.toolchain,
                   test_id=e.test_id, toolchain_version=job.toolchain_version, quantizer=job.quantizer,
                   quantizer_version=job.quantizer_version, prequantized=job.prequantized,
                   reference_checkpoint=reference,
                   checkpoint=checkpoint, max_seq_len=e.max_seq_len, max_batch_size=e.max_batch_size,
                   max_input_len=e.max_input_len, stages=e.stages, timeouts=dict(e.timeouts),
                   lm_head_precision=e.lm_head_precision, kv_cache_precision=e.kv_cache_precision,
                   features=e.features, after=None if e.after is None else job_key(e.after, job.platform),
                   parts=located,
                   chat_template=None if template is None else str(template),
                   thresholds=dict(source.thresholds.get(e.precision, {})) if source is not None else {},
                   calibration_samples=source.calibration_samples if source is not None else None,
                   toolchain_versions=e.toolchain_versions, memory_estimate_gb=job.memory_estimate_gb)


def record_plan_decisions(ctx: FarmContext, plan: Plan, report: RunReport) -> None:
    """Jobs that will not run are recorded too, with the reason: the matrix shows why a cell is empty."""
    farm = Farm.get(ctx)
    rows = []
    for job in plan.jobs:
        status = PLAN_STATUS.get(job.decision)
        if status is None:
            continue
        rows += [{"model": job.model, "precision": job.precision, "platform": job.platform, "stage": stage,
                  "test_id": job.test_id, "status": status, "reason": job.reason, "toolchain": job.toolchain,
                  "job_toolchain": job.toolchain, "chosen_versions": chosen_versions(job.entry.toolchain_versions),
                  "variant": job.entry.variant, "metrics": estimate_metric(job.memory_estimate_gb),
                  "environment": host_record()}  # decided by the orchestrator
                 for stage in job.entry.stages if stages.spec(stage).recorded]
        report.planned[job.key] = status
    farm.recorder.record_results(ctx.run_id, rows)


Needed = PrefectFuture[Any] | BaseException  # a needed run's future, or the exception it crashed with
Pin = Callable[[list[StageOutcome | BaseException]], str | None]  # what its needs ended with -> the device it needs


@dataclass
class _Node:
    """A stage run to submit once every run it reads has ended (``needs``: keys of ``Scheduler.futures``); ``ended``
    is called with what it ended with (``ended_with``) once it has, after the runs waiting for it were submitted."""

    key: object  # the stage run: (stage, what it serves)
    submit: Callable[[list[Needed]], PrefectFuture[Any]]  # given the needed runs (ended), in ``needs`` order
    needs: tuple[object, ...]
    lane: str  # "host" or "device:<platform>": what bounds how many run at once
    ended: Callable[[StageOutcome | BaseException], None]
    # the one device it will run on, read from what its needs ended with (the device holding the engine it uses);
    # None: any of its lane's
    pin: Pin | None = None
    waiting: int = 0
    pinned: str | None = None


def ended_with(future: PrefectFuture[Any]) -> StageOutcome | BaseException:
    """What a stage's ended task run ended with: its outcome, the exception it failed with, or the one it crashed
    with (Prefect marks the run Crashed and re-raises a ``BaseException`` that is not an ``Exception``, such as
    ``SystemExit``, in its thread: its future raises it)."""
    try:
        return future.result(raise_on_failure=False)  # type: ignore[no-any-return]
    except BaseException as exc:  # the future is done: nothing but the run's own crash can come from here
        return exc


class Scheduler:
    """Submits each task only when the runs it reads have ended, at most ``lanes[lane]`` running per lane: a task
    never holds one of the task runner's threads while it waits for its inputs (Prefect's thread pool resolves a
    task's upstream futures inside the worker thread), and a platform gets about as many tasks at once as it has
    device slots, however many rows wait (a 200-device lab had at most 16 stages moving, most of them waiting).
    When a run ends, the runs it unblocks are submitted first, then its node's ``ended`` (the record) is called here,
    in the flow's thread: a stage is one task run, never a second one for its record. A run pinned to one device (it
    uses the engine built there) is held back while ``pins[device]`` runs pinned there are running, and the runs
    behind it in its lane go first: runs waiting for one busy device never fill a lane while its other devices idle.
    """

    def __init__(self, lanes: Mapping[str, int], pins: Mapping[str, int] | None = None) -> None:
        self.lanes = dict(lanes)
        self.pins = dict(pins or {})
        self.futures: dict[object, PrefectFuture[Any]] = {}
        self.results: dict[object, StageOutcome | BaseException] = {}  # what each ended run ended with
        self._nodes: list[_Node] = []

    def add(self, node: _Node) -> None:
        self._nodes.append(node)

    def run(self) -> None:
        """Run every node; an exception of a node's ``ended`` is raised once every run has ended (the first one)."""
        dependents: dict[object, list[_Node]] = defaultdict(list)
        ready: dict[str, deque[_Node]] = defaultdict(deque)
        nodes = {n.key: n for n in self._nodes}
        for node in self._nodes:
            node.waiting = len(node.needs)
            for need in node.needs:
                if need not in nodes:
                    raise ValueError(f"{node.key} needs {need}, which nothing submits")
                dependents[need].append(node)
            if not node.needs:
                ready[node.lane].append(node)
        ended: queue.SimpleQueue[tuple[object, str]] = queue.SimpleQueue()
        running: dict[str, int] = defaultdict(int)
        on_device: dict[str, int] = defaultdict(int)  # pinned runs running, per device
        left = len(self._nodes)
        just_ended: list[_Node] = []
        failure: BaseException | None = None
        while True:
            for lane, waiting in ready.items():
                limit = self.lanes.get(lane)
                while waiting and (limit is None or running[lane] < limit):
                    node = self._next(waiting, on_device)
                    if node is None:  # every waiting run is pinned to a device that has its fill
                        break
                    future = node.submit([self._upstream(n) for n in node.needs])
                    self.futures[node.key] = future
                    running[lane] += 1
                    if node.pinned is not None:
                        on_device[node.pinned] += 1
                    future.add_done_callback(lambda _, k=node.key, lane=lane: ended.put((k, lane)))
            for node in just_ended:  # after what they unblocked was submitted
                try:
                    node.ended(self.results[node.key])
                except Exception as exc:  # one failed record never stops the others
                    log.exception("recording %s failed", node.key)
                    failure = failure or exc
            just_ended = []
            if not left:
                break
            finished = [ended.get()]
            while True:  # every run that ended meanwhile, in one round
                try:
                    finished.append(ended.get_nowait())
                except queue.Empty:
                    break
            for key, lane in finished:
                running[lane] -= 1
                left -= 1
                if nodes[key].pinned is not None:
                    on_device[nodes[key].pinned] -= 1
                self.results[key] = ended_with(self.futures[key])
                just_ended.append(nodes[key])
                for node in dependents.pop(key, ()):
                    node.waiting -= 1
                    if node.waiting == 0:
                        if node.pin is not None:
                            node.pinned = node.pin([self.results[n] for n in node.needs])
                        ready[node.lane].append(node)
        if failure is not None:
            raise failure

    def _next(self, waiting: deque[_Node], on_device: Mapping[str, int]) -> _Node | None:
        """The first waiting run that is not pinned to a device already running its fill of pinned runs (taken
        out of ``waiting``)."""
        for i, node in enumerate(waiting):
            if node.pinned is None or on_device.get(node.pinned, 0) < self.pins.get(node.pinned, 1):
                del waiting[i]
                return node
        return None

    def _upstream(self, key: object) -> Needed:
        """A needed run for the task that reads it: its future (so Prefect draws the edge), or the exception it
        crashed with (``allow_failure`` lets a Failed run through, never a Crashed one)."""
        result = self.results[key]
        return result if isinstance(result, BaseException) and not isinstance(result, Exception) \
            else self.futures[key]


def pins_of(ctx: FarmContext, platforms: set[str]) -> dict[str, int]:
    """How many runs pinned to one device (``_Node.pin``) run at once: its slots, and one more waiting for its lease
    (it starts as soon as one ends)."""
    farm = Farm.get(ctx)
    return {d.id: d.max_jobs + 1 for platform in platforms for d in farm.inventory.select(platform=platform)}


def _pin(ctx: FarmContext, stage: stages.StageSpec) -> Pin | None:
    """For a device stage that reads a device stage's product (an engine, which stays on the device that built it
    unless the run fetches engines: ``tasks.engines.holders``), the device that product is on."""
    on_device = [i for i, need in enumerate(stage.needs) if stages.spec(need).where is Where.DEVICE]
    if stage.where is not Where.DEVICE or not on_device or ctx.fetch_engines:
        return None

    def pin(ended: list[StageOutcome | BaseException]) -> str | None:
        made = ended[on_device[0]]
        return made.device if isinstance(made, StageOutcome) and made.passed else None

    return pin


def lanes_of(ctx: FarmContext, platforms: set[str]) -> dict[str, int]:
    """How many tasks of each lane run at once: the host stages' slots, and per platform its device slots and half
    as many again (a stage waiting for the one device that holds its engine leaves the others work)."""
    farm = Farm.get(ctx)
    lanes = {"host": max(1, ctx.host_slots)}
    for platform in platforms:
        slots = sum(d.max_jobs for d in farm.inventory.select(platform=platform))
        lanes[f"device:{platform}"] = slots + slots // 2 + 2
    return lanes


def submit_jobs(ctx: FarmContext, jobs: list[tuple[Job, CheckpointRef]], report: RunReport,
                sources: Mapping[str, ModelSource] | None = None,
                checkpoints: Mapping[str, CheckpointRef] | None = None) -> None:
    """Submit every runnable job (with its checkpoint reference) and wait for all of them to be recorded.
    ``checkpoints``: every located checkpoint by model (a pre-quantized model's base among them)."""
    submitted_at = time.time()
    platforms = {job.platform for job, _ in jobs}
    scheduler = Scheduler(lanes_of(ctx, platforms), pins_of(ctx, platforms))
    runs: dict[tuple[str, tuple[object, ...]], _Node] = {}  # (stage, what it serves) -> its one run
    sharers: dict[tuple[str, tuple[object, ...]], list[JobSpec]] = defaultdict(list)  # the jobs a run serves
    stage_runs: dict[str, dict[str, tuple[str, tuple[object, ...]]]] = {}  # job key -> its stages' runs
    records: list[tuple[str, str]] = []  # (job key, stage) in the order the report lists them
    recorded: dict[tuple[str, str], StageOutcome] = {}
    # a job that runs after another (JobSpec.after) is added after it, so it can wait for its stages
    for job, checkpoint in sorted(jobs, key=lambda pair: pair[0].entry.after is not None):
        source = (sources or {}).get(job.model)
        base = source.base.name if source is not None and source.base is not None else None
        spec = job_spec(job, checkpoint, source, None if base is None else (checkpoints or {}).get(base), checkpoints)
        mine: dict[str, tuple[str, tuple[object, ...]]] = {}
        gates = stage_runs.get(spec.after, {}) if spec.after is not None else {}
        for name in stages.closure(spec.stages):
            stage = stages.spec(name)
            run = (name, spec.share(stage.shared))
            if run not in runs:
                # a job that runs after another (an EAGLE3 draft after its base) waits for that one's same stage
                needs = tuple(mine[need] for need in stage.needs) + ((gates[name],) if name in gates else ())
                lane = "host" if stage.where is Where.HOST else f"device:{spec.platform}"
                runs[run] = _Node(run, _stage_submitter(ctx, name, spec, sharers[run]), needs, lane,
                                  _recorder(ctx, name, sharers[run], recorded), _pin(ctx, stage))
                scheduler.add(runs[run])
            sharers[run].append(spec)
            mine[name] = run
            report.ran[spec.key][name] = run
        stage_runs[spec.key] = mine
        records += [(spec.key, name) for name in spec.stages]
    scheduler.run()
    for job_key_, name in records:
        report.outcomes[job_key_][name] = recorded[job_key_, name]
    for run in runs:
        outcome = scheduler.results[run]
        if isinstance(outcome, StageOutcome):
            report.runs[run] = outcome
    report.wall_s = time.time() - submitted_at
    report.engine_overheads_s = engine_overheads(report)


def _stage_submitter(ctx: FarmContext, name: str, spec: JobSpec,
                     sharers: list[JobSpec]) -> Callable[[list[Needed]], PrefectFuture[Any]]:
    """Submits the stage's task, named after what it serves (``sharers``: every job that shares the run, complete
    by the time the scheduler submits it)."""
    def submit(upstream: list[Needed]) -> PrefectFuture[Any]:
        named = stage_task(name).with_options(task_run_name=task_run_name(name, spec, sharers))
        # the context and the job hold no future: quoted, Prefect hands them over without walking every field of
        # them (twice per task run: its inputs, then its parameters); only the upstream runs are its to resolve
        return named.submit(quote(ctx), name, quote(spec), tuple(u if isinstance(u, BaseException)
                                                                 else allow_failure(u) for u in upstream))

    return submit


def _recorder(ctx: FarmContext, name: str, sharers: list[JobSpec],
              recorded: dict[tuple[str, str], StageOutcome]) -> Callable[[StageOutcome | BaseException], None]:
    """Records what the stage's run ended with for each job it serves that lists it (``sharers``: complete by the
    time the run ends)."""
    def ended(outcome: StageOutcome | BaseException) -> None:
        for spec in sharers:
            if name in spec.stages:
                recorded[spec.key, name] = record(ctx, spec, name, outcome)

    return ended


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
    """Wall time vs the critical path (the longest dependent chain through the stage table, or the busiest
    resource's work divided by its slots, whichever is longer); Prefect's overhead per task (around the body); and
    the per-task start latency once its inputs were ready (which includes waiting for a worker thread)."""
    chains, overheads = [], []
    for ran in report.ran.values():
        durations = {name: report.runs[run].duration_s for name, run in ran.items() if run in report.runs}
        chains += [end for _, end in stages.finish_times(durations)]
    busy: dict[str, float] = defaultdict(float)
    for (name, _), outcome in report.runs.items():  # a shared run's work counts once
        if stages.spec(name).where is Where.HOST:
            busy["host"] += 0.0 if outcome.cached else outcome.duration_s
        elif outcome.device:
            busy[outcome.device] += outcome.duration_s
    for recorded in report.outcomes.values():
        for name, outcome in recorded.items():
            ready = [recorded[n].ended_at for n in stages.spec(name).needs if n in recorded and recorded[n].ended_at]
            if ready and outcome.started_at:
                overheads.append(max(0.0, outcome.started_at - max(ready)))
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


FARM_PACKAGES = ("edgellm-farm", "prefect", "sqlalchemy")  # the orchestrator's own, beside the library's


def toolchain_versions() -> dict[str, str]:
    """What a run records of the orchestrating host: the library's package list (``edgellm env``) and the farm's."""
    from edgellm.cli.env import PACKAGES, package_versions

    return {pkg: v for pkg, v in package_versions((*FARM_PACKAGES, *PACKAGES)).items() if v is not None}
