"""The row summaries kept when a run is published (results.summaries): "which rows pass" and the pages' query read
them instead of the results, so every write that changes a published row's results must refresh them. After each
step the kept summaries equal the ones rebuilt from the results (rebuild_row_latest recomputes everything)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from edgefarm.results.db import make_engine, read_session
from edgefarm.results.models import RowLatestKind, RowTally
from edgefarm.results.queries import RowKey, latest_status, passing_rows
from edgefarm.results.recorder import Recorder, rebuild_row_latest
from edgefarm.results.support import NIGHTLY_PAGE_KINDS, row_supports

P, TC = "x86-cpu", "edgellm-ort"


@pytest.fixture
def rec(migrated_db_url: str) -> Iterator[Recorder]:
    r = Recorder(make_engine(migrated_db_url))
    yield r
    r.engine.dispose()


def _row(rec: Recorder, run: int, model: str, **stages: str) -> None:
    for stage, status in stages.items():
        rec.record_result(run, model=model, precision="fp16", platform=P, stage=stage, test_id="t", status=status,
                          toolchain=TC, toolchain_version="1.0")


def _passing(rec: Recorder) -> list[str]:
    return [k.model for k in passing_rows(rec.engine)]


def _per_kind(rec: Recorder) -> list[tuple[str, ...]]:
    """The kept latest run of each row and run kind (row_latest_kind: what the nightly's pages read)."""
    t = RowLatestKind
    with read_session(rec.engine) as s:
        return sorted(tuple(str(v) for v in r) for r in s.execute(
            select(t.model, t.precision, t.platform, t.toolchain, t.variant, t.kind, t.run_id)))


def _kept_equals_rebuilt(rec: Recorder) -> None:
    kept = (latest_status(rec.engine), passing_rows(rec.engine), passing_rows(rec.engine, required=["export"]),
            _per_kind(rec), row_supports(rec.engine, kinds=NIGHTLY_PAGE_KINDS))
    rebuild_row_latest(rec.engine)
    assert kept == (latest_status(rec.engine), passing_rows(rec.engine),
                    passing_rows(rec.engine, required=["export"]), _per_kind(rec),
                    row_supports(rec.engine, kinds=NIGHTLY_PAGE_KINDS))


def _tallies(rec: Recorder) -> int:
    with read_session(rec.engine) as s:
        return int(s.scalar(select(func.count()).select_from(RowTally)) or 0)


def test_summaries_follow_publishing_and_late_writes(rec: Recorder) -> None:
    run1 = rec.start_run("nightly", "cron", "abc")
    _row(rec, run1, "a", export="pass", infer="pass", accuracy="pass")
    _row(rec, run1, "b", export="pass", infer="fail")
    assert _passing(rec) == [] and _tallies(rec) == 0  # nothing published yet: nothing kept
    rec.finish_run(run1, "passed")
    assert _passing(rec) == ["a"] and _tallies(rec) == 2
    _kept_equals_rebuilt(rec)

    # a late write into the published run changes a published row: the kept verdict follows at once
    _row(rec, run1, "a", accuracy="fail")
    assert _passing(rec) == []
    assert [s.verdict.value for s in latest_status(rec.engine)] == ["fail", "fail"]
    _kept_equals_rebuilt(rec)

    # a newer run moves row b: its older tallies go, only the latest run's are kept
    run2 = rec.start_run("nightly", "cron", "def")
    _row(rec, run2, "b", export="pass", infer="pass", accuracy="pass")
    assert _passing(rec) == []  # running, not published: the pages still show run 1
    rec.finish_run(run2, "passed")
    assert _passing(rec) == ["b"] and _tallies(rec) == 2
    assert {s.key.model: s.run_id for s in latest_status(rec.engine)} == {"a": run1, "b": run2}
    _kept_equals_rebuilt(rec)

    # a cancelled run is never published: nothing it wrote reaches the summaries
    run3 = rec.start_run("nightly", "cron", "ghi")
    _row(rec, run3, "b", export="pass", infer="fail")
    rec.finish_run(run3, "cancelled")
    assert _passing(rec) == ["b"]
    assert passing_rows(rec.engine, required=["export"]) == [RowKey("b", "fp16", P, TC)]  # a failed (any fail)
    _kept_equals_rebuilt(rec)

    # a test list's run moves the row's latest, never its latest nightly (what the nightly's pages show)
    run4 = rec.start_run("l0", "manual", "jkl")
    _row(rec, run4, "a", export="pass", infer="pass", accuracy="pass")
    rec.finish_run(run4, "passed")
    assert {s.key.model: s.run_id for s in latest_status(rec.engine)} == {"a": run4, "b": run2}
    nightly = row_supports(rec.engine, kinds=NIGHTLY_PAGE_KINDS)
    assert {st.key.model: st.run_id for st, _ in nightly} == {"a": run1, "b": run2}
    assert ("a", "fp16", P, TC, "", "l0", str(run4)) in _per_kind(rec)
    _kept_equals_rebuilt(rec)
