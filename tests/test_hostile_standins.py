"""A result made on test stand-ins of a toolchain's tools is never evidence (issue 24 item 12): ``passing_rows``
(the SQL count of supported rows) must not count it, as the row verdict does not (only the docs path was tested).
Property-based: for any mix of statuses and stand-in flags, ``passing_rows`` is exactly the rows whose latest
verdict is ``pass``."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.queries import latest_status, passing_rows
from edgefarm.results.recorder import Recorder

STAGES = ("export", "build", "infer", "accuracy")
ROWS = [("stories260K", "fp16", "x86-cpu"), ("tiny-qwen3", "fp32", "x86-cpu"), ("stories260K", "fp32", "orin")]


def _record(rec: Recorder, rows: dict[tuple[str, str, str], tuple[str, bool]]) -> int:
    run = rec.start_run("nightly", "schedule", "abc123", toolchain={"edgellm-farm": "0.1.0"})
    for (model, precision, platform), (status, standin) in rows.items():
        for stage in STAGES:
            rec.record_result(run, model=model, precision=precision, platform=platform, stage=stage,
                              test_id=f"{model}-{precision}", status=status if stage == "accuracy" else "pass",
                              device="d", toolchain="edgellm-ort", toolchain_version="0.1.0", standin=standin)
    rec.finish_run(run, "passed")
    return run


def _passing(engine: object) -> set[tuple[str, str, str]]:
    return {(k.model, k.precision.value, k.platform) for k in passing_rows(engine)}  # type: ignore[arg-type]


def test_a_stand_in_pass_is_not_a_passing_row(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade(engine)
    rec = Recorder(engine)
    _record(rec, {ROWS[0]: ("pass", False), ROWS[1]: ("pass", True)})
    assert _passing(engine) == {ROWS[0]}
    verdicts = {(r.key.model, r.key.precision.value, r.key.platform): r.verdict.value for r in latest_status(engine)}
    assert verdicts == {ROWS[0]: "pass", ROWS[1]: "incomplete"}
    # the next run on the real tools makes it evidence
    _record(rec, {ROWS[1]: ("pass", False)})
    assert _passing(engine) == {ROWS[0], ROWS[1]}
    engine.dispose()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Recorder:
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('standins') / 'r.db'}")
    upgrade(engine)
    return Recorder(engine)


OUTCOMES = list(itertools.product(("pass", "fail", "skipped", "waived"), (False, True)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(OUTCOMES), min_size=len(ROWS), max_size=len(ROWS)))
def test_passing_rows_are_the_rows_whose_latest_verdict_is_pass(db: Recorder,
                                                                 outcomes: list[tuple[str, bool]]) -> None:
    _record(db, dict(zip(ROWS, outcomes, strict=True)))
    pass_verdicts = {(r.key.model, r.key.precision.value, r.key.platform) for r in latest_status(db.engine)
                     if r.verdict.value == "pass"}
    assert _passing(db.engine) == pass_verdicts
    assert all((status, standin) == ("pass", False) for row, (status, standin) in zip(ROWS, outcomes, strict=True)
               if row in pass_verdicts)
