"""results/support.py: every support status from a row's latest status, the failing-since streak, waivers' expiry
and bug, and marks that no two statuses share."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from edgefarm.results.models import ResultStatus
from edgefarm.results.queries import RowKey, RowStatus, Verdict
from edgefarm.results.support import Support, SupportStatus, classify, failing_since, support_of
from edgefarm.stages import Stage
from edgellm.types import Precision

KEY = RowKey("m", Precision("fp16"), "orin", "tensorrt-edgellm")
PIPE = (Stage.EXPORT, Stage.BUILD, Stage.INFER, Stage.ACCURACY)


def _status(run: int, verdict: Verdict, stages: dict[Stage, ResultStatus], *, route: str | None = None,
            standin: bool = False, key: RowKey = KEY) -> RowStatus:
    return RowStatus(key, run, verdict, stages, route=route, standin=standin)


def _all(status: ResultStatus) -> dict[Stage, ResultStatus]:
    return dict.fromkeys(PIPE, status)


FAILED = {Stage.EXPORT: ResultStatus.PASS, Stage.BUILD: ResultStatus.FAIL, Stage.INFER: ResultStatus.SKIPPED,
          Stage.ACCURACY: ResultStatus.SKIPPED}


def test_marks_and_labels_are_distinct_and_never_blank() -> None:
    marks = [s.mark for s in SupportStatus]
    labels = [s.label for s in SupportStatus]
    assert len(set(marks)) == len(marks) == 8 and len(set(labels)) == len(labels)
    assert all(m.strip() and (len(m.split()) == 1 or m == s.label) for m, s in zip(marks, SupportStatus, strict=True))
    assert SupportStatus.NEVER_TESTED.mark == SupportStatus.NEVER_TESTED.display == "never tested"  # one spelling
    assert {s.value for s in SupportStatus} == {"l0_covered", "implemented", "checkpoint_direct", "failing",
                                                "waived", "not_applicable", "skipped", "never_tested"}


def test_every_status() -> None:
    assert classify(None) == Support(SupportStatus.NEVER_TESTED)
    assert classify(_status(3, Verdict.PASS, _all(ResultStatus.PASS))) == Support(SupportStatus.L0_COVERED, run_id=3)
    assert classify(_status(3, Verdict.PASS, _all(ResultStatus.PASS), route="direct")).status \
        is SupportStatus.CHECKPOINT_DIRECT
    assert classify(_status(3, Verdict.PASS, _all(ResultStatus.PASS), route="direct, onnx")).status \
        is SupportStatus.L0_COVERED
    export_only = {Stage.QUANTIZE: ResultStatus.PASS, Stage.EXPORT: ResultStatus.PASS,
                   Stage.BUILD: ResultStatus.SKIPPED, Stage.INFER: ResultStatus.SKIPPED}
    assert classify(_status(3, Verdict.INCOMPLETE, export_only)).status is SupportStatus.IMPLEMENTED
    built = {**export_only, Stage.BUILD: ResultStatus.PASS}
    assert classify(_status(3, Verdict.INCOMPLETE, built)).status is SupportStatus.SKIPPED
    na = classify(_status(3, Verdict.NOT_APPLICABLE, _all(ResultStatus.NOT_APPLICABLE)),
                  reasons={"export": "fp8 needs SM89+"})
    assert na == Support(SupportStatus.NOT_APPLICABLE, reason="fp8 needs SM89+", run_id=3)
    skipped = classify(_status(3, Verdict.INCOMPLETE, _all(ResultStatus.SKIPPED)), reasons={"build": "no device"})
    assert skipped.status is SupportStatus.SKIPPED and skipped.reason == "no device"
    standin = classify(_status(3, Verdict.INCOMPLETE, _all(ResultStatus.PASS), standin=True))
    assert standin.status is SupportStatus.SKIPPED and "stand-in" in (standin.reason or "")


def test_waived_carries_its_expiry_and_bug() -> None:
    reason = "waived until 2027-01-31 (https://bugs.example/issue/42)"
    got = classify(_status(4, Verdict.INCOMPLETE, _all(ResultStatus.WAIVED)), reasons={Stage.EXPORT: reason})
    assert got == Support(SupportStatus.WAIVED, reason=reason, until=dt.date(2027, 1, 31),
                          link="https://bugs.example/issue/42", run_id=4)
    bare = classify(_status(4, Verdict.INCOMPLETE, _all(ResultStatus.WAIVED)), reasons={"export": "known issue"})
    assert bare.status is SupportStatus.WAIVED and bare.until is None and bare.link is None


def test_failing_names_the_root_cause_and_the_start_of_its_streak() -> None:
    reasons = {"build": "TensorRT: no kernel for head size 8", "infer": "skipped: build failed"}
    history = [
        _status(1, Verdict.FAIL, FAILED),
        _status(2, Verdict.PASS, _all(ResultStatus.PASS)),  # ends the older streak
        _status(3, Verdict.ERROR, FAILED),
        _status(4, Verdict.INCOMPLETE, _all(ResultStatus.SKIPPED)),  # ran nothing: neither breaks nor extends
        _status(5, Verdict.FAIL, FAILED),
        _status(5, Verdict.PASS, _all(ResultStatus.PASS), key=RowKey("other", Precision("fp16"), "orin", "x")),
    ]
    latest = _status(6, Verdict.FAIL, FAILED)
    got = classify(latest, [*history, latest], reasons)
    assert got == Support(SupportStatus.FAILING, since_run=3, reason="TensorRT: no kernel for head size 8", run_id=6)
    assert failing_since(latest, []) == 6
    assert failing_since(latest, [_status(5, Verdict.INCOMPLETE, _all(ResultStatus.WAIVED))]) == 6


def test_support_of_reads_reasons_and_history_from_the_database(tmp_path: Path) -> None:
    from sqlalchemy.orm import Session

    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.queries import latest_status
    from edgefarm.results.recorder import Recorder

    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade(engine)
    rec = Recorder(engine)
    for verdict in ("pass", "fail", "fail"):
        run = rec.start_run("nightly", "schedule", "abc")
        for stage in ("export", "build", "infer", "accuracy"):
            status = "fail" if verdict == "fail" and stage == "infer" else "pass"
            rec.record_result(run, model="m", precision="fp16", platform="orin", stage=stage, test_id="m-fp16",
                              status=status, toolchain="tensorrt-edgellm", toolchain_version="0.11.0",
                              reason="decode diverged" if status == "fail" else None)
        rec.finish_run(run, "failed" if verdict == "fail" else "passed")
    with Session(engine) as s:
        (latest,) = latest_status(s)
        got = support_of(s, latest)
    engine.dispose()
    assert got == Support(SupportStatus.FAILING, since_run=2, reason="decode diverged", run_id=3)


def test_status_from_a_row_status_is_what_classify_says() -> None:
    """The function the CLI and the pages call for a row's status without the database (``status_from``) agrees
    with :func:`classify` for every status, given a ``RowStatus`` or the same fields as plain names."""
    from edgefarm.results.support import status_from

    export_only = {Stage.QUANTIZE: ResultStatus.PASS, Stage.EXPORT: ResultStatus.PASS,
                   Stage.BUILD: ResultStatus.SKIPPED}
    cases = [_status(1, Verdict.PASS, _all(ResultStatus.PASS)),
             _status(1, Verdict.PASS, _all(ResultStatus.PASS), route="direct"),
             _status(1, Verdict.INCOMPLETE, export_only), _status(1, Verdict.FAIL, FAILED),
             _status(1, Verdict.ERROR, {Stage.EXPORT: ResultStatus.ERROR}),
             _status(1, Verdict.INCOMPLETE, _all(ResultStatus.WAIVED)),
             _status(1, Verdict.NOT_APPLICABLE, _all(ResultStatus.NOT_APPLICABLE)),
             _status(1, Verdict.INCOMPLETE, _all(ResultStatus.SKIPPED)),
             _status(1, Verdict.INCOMPLETE, _all(ResultStatus.PASS), standin=True)]
    got = [status_from(r.verdict, r.stages, route=r.route, standin=r.standin) for r in cases]
    assert got == [classify(r).status for r in cases]
    assert set(got) == set(SupportStatus) - {SupportStatus.NEVER_TESTED}
    plain = status_from("incomplete", {"quantize": "pass", "export": "pass", "build": "skipped"})
    assert plain is SupportStatus.IMPLEMENTED


def test_latest_status_of_runs_keeps_each_kind_apart(tmp_path: Path) -> None:
    """The nightly's pages read each row's latest nightly run (never a bring-up's); a test list's page its one run."""
    from sqlalchemy.orm import Session

    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.queries import SUPPORT_REQUIRED, latest_status
    from edgefarm.results.recorder import Recorder
    from edgefarm.results.support import NIGHTLY_PAGE_KINDS, latest_status_of_runs

    engine = make_engine(f"sqlite:///{tmp_path / 'k.db'}")
    upgrade(engine)
    rec = Recorder(engine)
    runs = {}
    for kind, status in (("nightly", "pass"), ("l0", "fail"), ("nightly", "pass"), ("l1", "pass")):
        run = rec.start_run(kind, "t", "v")
        for stage in ("infer", "accuracy"):
            rec.record_result(run, model="m", precision="fp16", platform="x86-cpu", stage=stage, test_id="m",
                              status=status if stage == "accuracy" else "pass", toolchain="edgellm-ort",
                              toolchain_version="1")
        rec.finish_run(run, "passed")
        runs.setdefault(kind, []).append(run)
    with Session(engine) as s:
        nightly = latest_status_of_runs(s, kinds=NIGHTLY_PAGE_KINDS)
        assert [(st.run_id, st.verdict) for st in nightly] == [(runs["nightly"][1], Verdict.PASS)]
        listed = latest_status_of_runs(s, run_id=runs["l0"][0])
        assert [(st.run_id, st.verdict) for st in listed] == [(runs["l0"][0], Verdict.FAIL)]
        anything = latest_status_of_runs(s)
        assert anything == latest_status(s, required=SUPPORT_REQUIRED)  # no kinds: the queries' own answer
    engine.dispose()
