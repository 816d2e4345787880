"""Each stage is declared once (``stages.STAGES``): pipeline order, the DAG, timing, timeouts and progress columns
derive from the table, and they are today's. Adding a stage is one table entry plus one module: throwaway stages
registered here (their work is this module's functions) are wired, ordered, timed, skipped when what they need
failed and not applicable when it was, in a real run under the Prefect harness."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prefect import flow, get_client
from prefect.task_runners import ThreadPoolTaskRunner
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm import stages
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.execute import execute_plan
from edgefarm.flows.pipeline import RunReport, job_spec
from edgefarm.flows.plan import MATRICES_DIR, Plan, plan_matrix
from edgefarm.flows.settings import Settings
from edgefarm.results.db import make_engine
from edgefarm.results.models import Result, ResultStatus
from edgefarm.stages import REFERENCE, Shared, Stage, StageSpec, Where
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks import stage_work
from edgefarm.tasks.farm import FarmContext
from edgefarm.tasks.progress import StageEvent, subscribe
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import LISTS_DIR, list_names, load_list
from edgellm.errors import ConfigurationError, ErrorKind, TestFailure
from tests.helpers.stages import throwaway

# -- today's behaviour, written out (what the table must reproduce) ---------------------------------------------
TODAY_ORDER = ["quantize", "export", "build", "infer", "accuracy", "bench"]
TODAY_NEEDS = {"build": "export", "infer": "build", "accuracy": "infer", "bench": "build"}  # as lists must list them
TODAY_TIMEOUTS = {"quantize": 1200, "export": 1200, "build": 1200, "infer": 6000, "accuracy": 6000, "bench": 1200}


def today_submitted(listed: tuple[str, ...]) -> list[str]:
    """What ``submit_jobs`` submitted per job before the table: the reference first when accuracy is listed,
    then quantize and export always, then the listed device stages in order."""
    head = [REFERENCE] if "accuracy" in listed else []
    return [*head, "quantize", "export", *(s for s in ("build", "infer", "accuracy", "bench") if s in listed)]


def test_the_derived_order_needs_timeouts_and_hosts_are_todays() -> None:
    assert [s for s in stages.order() if s in set(Stage)] == TODAY_ORDER == [s.value for s in Stage]
    assert stages.default_timeouts() == {**TODAY_TIMEOUTS, REFERENCE: 6000}
    assert stages.host_stages() == {"quantize", "export", REFERENCE}
    for stage, need in TODAY_NEEDS.items():
        assert stages.needs_problems([stage]) == [f"stage {stage} needs {need}, which is not in stages"]
    assert stages.needs_problems(["export", "build", "infer", "accuracy", "bench"]) == []  # quantize, ref implied
    assert [s.name for s in stages.STAGES.values() if s.implied] == [REFERENCE, "quantize"]
    assert not stages.spec(REFERENCE).recorded and all(stages.spec(s).recorded for s in Stage)
    assert stages.spec(REFERENCE).shared is Shared.MODEL and stages.spec("quantize").shared is Shared.CHECKPOINT
    assert stages.spec("export").shared is Shared.EXPORT and stages.spec("build").shared is Shared.JOB


def test_every_shipped_list_and_the_matrix_submit_what_they_did_before() -> None:
    """Per job, the stages the table makes the pipeline submit (and their order) equal the hand-wired DAG's."""
    seen = 0
    for name in list_names():
        for entry in load_list(name).entries:
            assert stages.closure(entry.stages) == today_submitted(entry.stages), (name, entry.test_id)
            seen += 1
    matrix = yaml.safe_load((MATRICES_DIR / "nightly.yml").read_text())
    for block in [matrix, *matrix.get("extra", [])]:
        listed = tuple((block.get("defaults") or {}).get("stages") or block.get("stages") or ())
        if listed:
            assert stages.closure(listed) == today_submitted(listed), listed
            seen += 1
    assert seen > 20 and Path(LISTS_DIR).is_dir()


def test_the_critical_path_is_todays_chain_formula() -> None:
    rng = random.Random(8)
    for _ in range(200):
        d = {s: rng.uniform(0, 10) for s in [*TODAY_ORDER, REFERENCE] if rng.random() < 0.8}

        def g(s: str, d: dict[str, float] = d) -> float:
            return d.get(s, 0.0)

        head = g("quantize") + g("export") + g("build")
        today = max(max(head + g("infer"), g(REFERENCE)) + g("accuracy"), head + g("bench"))
        assert max((end for _, end in stages.finish_times(d)), default=0.0) == pytest.approx(today)


def test_every_stage_names_a_function_and_its_cache_key() -> None:
    assert set(stage_work.WORK) == set(stages.STAGES)
    for spec in stages.STAGES.values():
        work = stage_work.work_of(spec.name)
        assert callable(work.runs), spec.name
        assert (work.key is not None) == (spec.cache is not None), f"{spec.name}: a key function iff cached"
        assert callable(work.key) or work.key is None, spec.name
    assert stage_work.work_of("build").verify is not None  # an engine still on its device
    with pytest.raises(ConfigurationError, match="names no work"):
        stage_work.work_of("nope")
    from edgefarm.tasks.reference import reference_key_inputs

    assert set(stages.spec(REFERENCE).cache_key) <= set(reference_key_inputs("a" * 64))


def test_the_table_refuses_a_duplicate_an_unknown_need_and_names_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="registered twice"):
        stages.register(stages.spec("build"))
    with pytest.raises(ConfigurationError, match="needs unregistered stage"):
        stages.register(StageSpec(name="x", needs=("nope",), where=Where.HOST, cache_key=(), timeout_s=1))
    with pytest.raises(ConfigurationError, match="did you mean 'bench'"):
        stages.spec("bnech")
    with pytest.raises(ConfigurationError, match="needed by build"):
        stages.unregister("export")


def test_an_unlisted_reference_spends_accuracys_timeout() -> None:
    assert stages.unlisted_timeout(REFERENCE, {"export": 90, "accuracy": 45}) == 45  # as before: accuracy's
    assert stages.unlisted_timeout("quantize", {"export": 90}) == 1200  # as before: the default


# -- a throwaway stage, end to end ------------------------------------------------------------------------------
SLEEP_S = 1.5


def probe(ctx: FarmContext, job: JobSpec, exported: StageOutcome) -> StageOutcome:
    raise TestFailure(f"probe found nothing in onnx {exported.outputs['onnx'].sha256[:12]}")


def echo(ctx: FarmContext, job: JobSpec, exported: StageOutcome) -> StageOutcome:
    time.sleep(SLEEP_S)
    out = StageOutcome(stage="echo", status=ResultStatus.PASS, device="orchestrator", reason="echoed")
    out.outputs["onnx"] = exported.outputs["onnx"]
    return out


def na(ctx: FarmContext, job: JobSpec, exported: StageOutcome) -> StageOutcome:
    return StageOutcome(stage="na", status=ResultStatus.NOT_APPLICABLE, reason="not for this model")


def never(ctx: FarmContext, job: JobSpec, upstream: StageOutcome) -> StageOutcome:
    raise AssertionError("a stage ran although what it needs did not pass")


def _throwaway(name: str, needs: str, timeout_s: int = 77) -> StageSpec:
    return StageSpec(name=name, needs=(needs,), where=Where.HOST, cache_key=(), timeout_s=timeout_s)


THROWAWAY = [(_throwaway("probe", "export"), probe), (_throwaway("lint", "probe"), never),
             (_throwaway("echo", "export"), echo), (_throwaway("na", "export"), na),
             (_throwaway("after_na", "na"), never)]


@pytest.fixture
def throwaway_stages() -> Iterator[list[str]]:
    with throwaway(THROWAWAY) as names:
        yield names


@flow(name="stage-table-test", task_runner=ThreadPoolTaskRunner(max_workers=8))
def _run(plan: Plan, settings: Settings) -> tuple[RunReport, dict[str, float]]:
    return execute_plan(plan, settings, trigger="test")


@pytest.mark.usefixtures("prefect_harness")
def test_a_stage_added_to_the_table_is_wired_ordered_timed_and_skipped(
        farm_dirs: dict[str, Path], tmp_path: Path, throwaway_stages: list[str]) -> None:
    matrix = tmp_path / "throwaway.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "throwaway", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
        # a test list names the new stages like any other: the table is what it is validated against
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                     "stages": ["export", *throwaway_stages], "timeout": {"probe": 66}}}))
    plan = plan_matrix(matrix, load_inventory(farm_dirs["inventory"], data_dir=farm_dirs["data"]), Catalog.load(),
                       data_dir=farm_dirs["data"])
    [job] = plan.runnable()
    listed = ("export", *throwaway_stages)
    assert job.entry.stages == listed
    # ordered: after what each needs, in the table's order; the progress display gets a column each
    order = stages.order()
    assert order.index("export") < order.index("probe") < order.index("lint")
    assert stages.closure(listed) == ["quantize", *listed]
    assert stages.progress_columns([listed]) == list(listed)
    spec = job_spec(plan.jobs[0], CheckpointRef(model="stories260K", path="/nowhere", sha256="0" * 64))
    assert spec.timeout("probe") == 66 and spec.timeout("echo") == 77 and spec.timeout("export") == 1200

    events: list[StageEvent] = []
    unsubscribe = subscribe(events.append)
    db = f"sqlite:///{tmp_path / 'throwaway.db'}"
    settings = Settings.resolve(db=db, data_dir=farm_dirs["data"], inventory=farm_dirs["inventory"],
                                docs_dir=tmp_path / "docs")
    try:
        report, timing = _run(plan, settings)
    finally:
        unsubscribe()

    got = report.outcomes[job.key]
    assert list(got) == list(listed)
    assert got["export"].status is ResultStatus.PASS, got["export"].reason
    # the stage's work got the outcome of what it needs (wired), and ran in the generic body (guarded, noted)
    assert got["echo"].status is ResultStatus.PASS and got["echo"].outputs["onnx"] == got["export"].outputs["onnx"]
    assert got["probe"].status is ResultStatus.FAIL and got["probe"].error_kind is ErrorKind.TEST_FAILURE
    assert got["probe"].reason is not None and got["probe"].reason.startswith("probe found nothing in onnx")
    # skipped when what it needs failed; not applicable when that was
    assert got["lint"].status is ResultStatus.SKIPPED and got["lint"].reason == "upstream probe fail"
    assert got["after_na"].status is ResultStatus.NOT_APPLICABLE and got["after_na"].reason == "not for this model"
    assert "quantize" in report.ran[job.key]  # implied: run although not listed

    # the Prefect task runs are the table's stages, and echo's run was wired to export's
    with get_client(sync_client=True) as client:
        runs = {name: client.read_task_run(uuid.UUID(o.task_run_id)) for name, o in got.items() if o.task_run_id}
    assert {name: r.name.split(" ")[0] for name, r in runs.items()} == {
        "export": "export", "probe": "probe", "echo": "echo", "na": "na"}
    upstream = {getattr(i, "id", None) for i in runs["echo"].task_inputs["upstream"]}
    assert runs["export"].id in upstream

    # timed: echo's chain (quantize, export, echo) is part of the critical path
    # (echo builds its outcome after sleeping: its time still counts from the body's start)
    assert report.runs[report.ran[job.key]["echo"]].duration_s >= SLEEP_S
    chain = sum(report.runs[report.ran[job.key][s]].duration_s for s in ("quantize", "export", "echo"))
    assert timing["critical_path_s"] >= chain - 1e-3

    # recorded: a stage added to the table is recorded like the pipeline's own, no migration (the database stores
    # stage names as strings the table checks); every listed stage reached the progress display
    with Session(make_engine(db)) as session:
        rows = session.scalars(select(Result).where(Result.run_id == report.run_id)).all()
    assert sorted((r.stage, r.status) for r in rows) == sorted([
        (Stage.EXPORT, ResultStatus.PASS), ("probe", ResultStatus.FAIL), ("lint", ResultStatus.SKIPPED),
        ("echo", ResultStatus.PASS), ("na", ResultStatus.NOT_APPLICABLE), ("after_na", ResultStatus.NOT_APPLICABLE)])
    # every listed stage ended, and so did the identity quantize its closure adds (it prints an end too, issue 41)
    assert sorted(e.stage for e in events if e.job == job.key and e.status != "start") == sorted(
        [*listed, "quantize"])
    # and each stage that ran said so when it started (those skipped without running did not start)
    assert {e.stage for e in events if e.status == "start"} >= {"export", "probe", "echo"}
    assert not {e.stage for e in events if e.status == "start"} & {"lint", "after_na"}
