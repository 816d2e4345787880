"""A stage is one Prefect task run (issue 41 item 3: each stage had a second ``record …`` task run, 19 task runs for 7
stages; issue 39 item 3: each cost the orchestrator a task run's CPU). The scheduler records what each run ended
with, a crash included: a stage that crashes (Prefect's Crashed: a ``BaseException`` such as ``SystemExit`` from a
tool's wrapper) is recorded as crashed, and what needs it is skipped with why, instead of the run breaking off with
the crash (before, the crashed future broke its record task and the flow with it). In a real run under the Prefect
harness, with throwaway stages registered in the table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prefect import flow, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.task_runners import ThreadPoolTaskRunner
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.execute import execute_plan
from edgefarm.flows.pipeline import RunReport
from edgefarm.flows.plan import Plan, plan_matrix
from edgefarm.flows.settings import Settings
from edgefarm.results.db import make_engine
from edgefarm.results.models import Result, ResultStatus
from edgefarm.stages import StageSpec, Where
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.farm import FarmContext
from edgefarm.test_lists.catalog import Catalog
from edgellm.errors import ErrorKind
from tests.helpers.stages import throwaway

pytestmark = pytest.mark.usefixtures("prefect_harness")


def fine(ctx: FarmContext, job: JobSpec) -> StageOutcome:
    return StageOutcome(stage="fine", status=ResultStatus.PASS, device="orchestrator")


def crash(ctx: FarmContext, job: JobSpec) -> StageOutcome:
    raise SystemExit(3)  # what a tool's Python wrapper does in-process: not an Exception, so Prefect says Crashed


def after(ctx: FarmContext, job: JobSpec, crashed: StageOutcome) -> StageOutcome:
    raise AssertionError("a stage ran although what it needs crashed")


STAGES = [(StageSpec(name="fine", needs=(), where=Where.HOST, cache_key=(), timeout_s=60), fine),
          (StageSpec(name="crash", needs=(), where=Where.HOST, cache_key=(), timeout_s=60), crash),
          (StageSpec(name="after_crash", needs=("crash",), where=Where.HOST, cache_key=(), timeout_s=60), after)]


@pytest.fixture
def throwaway_stages() -> Iterator[list[str]]:
    with throwaway(STAGES) as names:
        yield names


@flow(name="one-task-run-per-stage-test", task_runner=ThreadPoolTaskRunner(max_workers=4))
def _run(plan: Plan, settings: Settings) -> RunReport:
    return execute_plan(plan, settings, trigger="test")[0]


def test_a_stage_is_one_task_run_and_a_crashed_one_is_recorded_as_crashed(
        farm_dirs: dict[str, Path], tmp_path: Path, throwaway_stages: list[str]) -> None:
    matrix = tmp_path / "one-run.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "one-run", "models": ["stories260K"], "precisions": ["fp32", "fp16"], "platforms": ["x86-cpu"],
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128, "stages": throwaway_stages}}))
    plan = plan_matrix(matrix, load_inventory(farm_dirs["inventory"], data_dir=farm_dirs["data"]), Catalog.load(),
                       data_dir=farm_dirs["data"])
    assert len(plan.runnable()) == 2
    db = f"sqlite:///{tmp_path / 'one-run.db'}"
    settings = Settings.resolve(db=db, data_dir=farm_dirs["data"], inventory=farm_dirs["inventory"],
                                docs_dir=tmp_path / "docs")
    state = _run(plan, settings, return_state=True)
    report = state.result()
    assert isinstance(report, RunReport)

    # one task run per stage run: 2 jobs x 3 stages, none shared, and no second task run to record each
    ran = {run for runs in report.ran.values() for run in runs.values()}
    assert len(ran) == 6
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert len(tasks) == len(ran), sorted(t.name for t in tasks)
    assert sorted(t.name.split(" ")[0] for t in tasks) == sorted(["fine", "crash", "after_crash"] * 2)
    crashed = [t for t in tasks if t.name.startswith("crash ")]
    assert {t.state.type.value for t in crashed} == {"CRASHED"}, [t.state for t in crashed]

    # the crash is recorded (as crashed, a bug of the farm's), and what needed it skipped with why
    for job, got in report.outcomes.items():
        assert got["fine"].status is ResultStatus.PASS, job
        assert got["crash"].status is ResultStatus.ERROR and got["crash"].error_kind is ErrorKind.BUG
        assert got["crash"].reason == "crashed: SystemExit: 3"
        assert got["after_crash"].status is ResultStatus.SKIPPED
        assert got["after_crash"].reason == "upstream stage did not finish: 3"
    with Session(make_engine(db)) as session:
        rows = session.scalars(select(Result).where(Result.run_id == report.run_id)).all()
    assert sorted((r.precision.value, r.stage, r.status, r.reason) for r in rows) == sorted(
        (precision, stage, status, reason) for precision in ("fp16", "fp32") for stage, status, reason in (
            ("fine", ResultStatus.PASS, None), ("crash", ResultStatus.ERROR, "crashed: SystemExit: 3"),
            ("after_crash", ResultStatus.SKIPPED, "upstream stage did not finish: 3")))
