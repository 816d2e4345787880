"""The docs' read (pages/docs.py ``matrix_rows`` -> results/pages.py ``matrix_evidence`` -> results/support.py
``row_supports`` -> ``supports_of``) and ``edgefarm query`` ask the database a fixed number of questions whatever the
number of rows (reasons, and failing rows' streaks a window of runs at a time: one statement per 200 rows), and
answer what the one-row functions answer (``support_of``, a row's results and metrics in its latest run). Before,
the docs asked three per row: 63 s for the docs of 20,000 rows at 10M results (benchmarks/bench_db.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from edgefarm.pages.docs import matrix_rows
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.models import Metric, Result
from edgefarm.results.pages import ResultLine, matrix_evidence
from edgefarm.results.recorder import Recorder
from edgefarm.results.support import NIGHTLY_PAGE_KINDS, latest_status_of_runs, row_supports, support_of

PIPE = ("export", "build", "infer", "accuracy", "bench")


def _engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'docs.db'}")
    upgrade(engine)
    return engine


def _nightly(rec: Recorder, models: int, *, fail: set[str] = frozenset(), kind: str = "nightly") -> int:  # type: ignore[assignment]
    """One published run: each model a row on orin; a model in ``fail`` fails its infer stage with a reason."""
    run = rec.start_run(kind, "schedule", "abc")
    results = []
    for i in range(models):
        model = f"m{i:03d}"
        for stage in PIPE:
            status = "fail" if model in fail and stage == "infer" else "pass"
            results.append(dict(model=model, precision="fp16", platform="orin", stage=stage, test_id=f"{model}-fp16",
                                status=status, toolchain="edgellm-ort", toolchain_version="1.0", device="orin-1",
                                reason="decode diverged" if status == "fail" else None,
                                metrics={"tokens_per_s": (10.0 + i, "tok/s")} if stage == "bench" else None))
    # a row whose two compared versions ran side by side, and one skipped with its reason
    for chosen in ("edgellm-ort==1.0", "edgellm-ort==1.1"):
        for stage in ("infer", "accuracy"):
            results.append(dict(model="side", precision="bf16", platform="orin", stage=stage, test_id=f"side-{chosen}",
                                status="pass" if chosen.endswith("1.0") else "skipped", toolchain="edgellm-ort",
                                toolchain_version=chosen.split("==")[1], chosen_versions=chosen,
                                reason=None if chosen.endswith("1.0") else "no device of this version"))
    rec.record_results(run, results)
    rec.finish_run(run, "failed" if fail else "passed")
    return run


@contextmanager
def _counted(engine: Engine | type[Engine]) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


def _two_nightlies(tmp_path: Path, models: int) -> str:
    """A database of two published nightlies of ``models`` rows (and the side-by-side row), a quarter of the rows
    failing in the second (their streaks are read); its URL."""
    url = f"sqlite:///{tmp_path / f'{models}.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    _nightly(rec, models)
    _nightly(rec, models, fail={f"m{i:03d}" for i in range(0, models, 4)})
    engine.dispose()
    return url


def test_the_docs_read_asks_the_same_number_of_questions_for_4_rows_and_for_40(tmp_path: Path) -> None:
    counts = []
    for models in (4, 40):
        engine = make_engine(_two_nightlies(tmp_path, models))
        with _counted(engine) as statements:
            rows = matrix_rows(engine)
        assert len(rows) == models + 2  # the side-by-side row: one per chosen version
        counts.append(len(statements))
        engine.dispose()
    assert counts[0] == counts[1] <= 12, counts


def test_the_query_command_asks_the_same_number_of_questions_for_4_rows_and_for_40(tmp_path: Path) -> None:
    """``edgefarm query`` decides each row's support as the pages do (``supports_of``), in a few statements."""
    from edgefarm.cli.query import query_rows

    counts = []
    for models in (4, 40):
        url = _two_nightlies(tmp_path, models)
        with _counted(Engine) as statements:  # every engine: the command opens its own
            rows = query_rows(url, model=None, precision=None, platform=None, status=None)
        assert len(rows) == models + 2
        assert sum(r["status"] == "failing" for r in rows) == len(range(0, models, 4))
        assert {r["reason"] for r in rows if r["status"] == "failing"} == {"decode diverged"}
        counts.append(len(statements))
    assert counts[0] == counts[1], counts


def test_the_batched_read_answers_what_the_one_row_functions_answer(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    rec = Recorder(engine)
    _nightly(rec, 6, fail={"m002"})
    _nightly(rec, 6, fail={"m002"}, kind="l0")  # not a nightly: never on its pages (its history still counts)
    last = _nightly(rec, 6, fail={"m002", "m004"})
    supports = row_supports(engine, kinds=NIGHTLY_PAGE_KINDS)
    evidence = matrix_evidence(engine, kinds=NIGHTLY_PAGE_KINDS)
    with Session(engine) as s:
        statuses = latest_status_of_runs(s, kinds=NIGHTLY_PAGE_KINDS)
        one_by_one = [(st, support_of(s, st)) for st in statuses]
        assert supports == one_by_one and len(supports) == 8
        assert [ev.status for ev in evidence] == statuses
        assert [ev.support for ev in evidence] == [x for _, x in supports]
        for ev in evidence:  # the row's results in its run, and their metrics, read alone
            st = ev.status
            mine = s.scalars(select(Result).where(
                Result.run_id == st.run_id, Result.model == st.key.model, Result.precision == st.key.precision,
                Result.platform == st.key.platform, Result.job_toolchain == st.key.toolchain,
                Result.variant == st.key.variant,
                Result.chosen_versions.is_(None) if st.chosen_versions is None
                else Result.chosen_versions == st.chosen_versions).order_by(Result.id)).all()
            assert ev.results == tuple(ResultLine(r.stage.value, r.status.value, r.reason, r.device) for r in mine)
            assert dict(ev.metrics) == dict(s.execute(select(Metric.name, Metric.value).where(
                Metric.result_id.in_([r.id for r in mine]))).all())
    by_model = {(ev.status.key.model, ev.status.chosen_versions): ev for ev in evidence}
    assert by_model[("m004", None)].support.status.value == "failing"
    assert by_model[("m004", None)].support.since_run == last and by_model[("m002", None)].support.since_run == 1
    assert by_model[("m004", None)].support.reason == "decode diverged"
    assert by_model[("m005", None)].metrics == {"tokens_per_s": 15.0}
    skipped = by_model[("side", "edgellm-ort==1.1")]
    assert skipped.support.status.value == "skipped" and skipped.support.reason == "no device of this version"
    assert by_model[("side", "edgellm-ort==1.0")].support.status.value == "l0_covered"
    engine.dispose()


@pytest.mark.parametrize("window", [1, 3, 64])
def test_failing_streaks_walk_as_the_rows_whole_histories_do(tmp_path: Path, window: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``supports_of`` reads one line per (row, run) for the failing streaks, a window of runs at a time back from
    each row's latest (a window of 1 and 3 run ids: most streaks need several, widening); the reference walks each
    failing row's whole history (``row_history`` -> ``failing_since``): the same support for every row, on generated
    histories with fails, errors, skipped-only runs and passes in any order."""
    from edgefarm.results import support

    monkeypatch.setattr(support, "STREAK_WINDOW", window)
    from benchmarks.db_data import Shape, load
    from edgefarm.results.queries import row_history
    from edgefarm.results.support import classify, row_reasons, supports_of

    engine = _engine(tmp_path)
    load(engine, Shape.for_results(rows=300, runs=40, results=300 * 40 // 2))
    rec = Recorder(engine)
    patterns = {  # a row's runs, oldest first: f fail, e error, s only skipped, p pass, - not in that run
        "streak": "pfsfe", "broken": "ffpf", "whole": "fff", "skips": "sfss-f", "one": "pppf", "errors": "peeef"}
    for i in range(6):
        run = rec.start_run("nightly", "schedule", "abc")
        results = []
        for model, runs in patterns.items():
            mark = runs[i] if i < len(runs) else "-"
            if mark == "-":
                continue
            for stage in ("infer", "accuracy"):
                status = {"f": "fail" if stage == "infer" else "skipped", "e": "error", "s": "skipped",
                          "p": "pass"}[mark]
                results.append(dict(model=model, precision="fp16", platform="thor", stage=stage, test_id=model,
                                    status=status, toolchain="edgellm-ort", toolchain_version="1.0",
                                    reason=None if status == "pass" else f"{model} {i}"))
        rec.record_results(run, results)
        rec.finish_run(run, "failed")
    with Session(engine) as s:
        statuses = latest_status_of_runs(s)
        got = supports_of(s, statuses)
        reasons = row_reasons(s, statuses)
        want = [classify(st, row_history(s, st.key.model, st.key.precision, st.key.platform,
                                         toolchain=st.key.toolchain, variant=st.key.variant),
                         reasons.get((st.key, st.run_id, st.chosen_versions), {})) for st in statuses]
    engine.dispose()
    assert got == want
    since = [(sup.since_run, st.run_id) for st, sup in zip(statuses, got, strict=True) if sup.status.value == "failing"]
    assert any(a < b for a, b in since) and any(a == b for a, b in since), since  # streaks of several runs and of one
    by_model = {st.key.model: (sup, st.run_id) for st, sup in zip(statuses, got, strict=True)}
    streak = {m: by_model[m][1] - by_model[m][0].since_run for m in patterns}  # runs back from the latest
    assert streak == {"streak": 3, "broken": 0, "whole": 2, "skips": 4, "one": 0, "errors": 3}, streak
