"""How the scheduler hands a stage to Prefect (flows.pipeline): the context and the job quoted (Prefect does not walk
them), the upstream runs as they are for Prefect to resolve."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.utilities.annotations import allow_failure, quote

from edgefarm.flows import pipeline


class _Task:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def with_options(self, **_: Any) -> _Task:
        return self

    def submit(self, *args: Any) -> str:
        self.calls.append(args)
        return "future"


def test_the_context_and_job_go_quoted_the_upstream_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    task = _Task()
    monkeypatch.setattr(pipeline, "stage_task", lambda name: task)
    monkeypatch.setattr(pipeline, "task_run_name", lambda *a: "name")
    ctx, spec, crashed, upstream = object(), object(), SystemExit(3), object()
    submit = pipeline._stage_submitter(ctx, "infer", spec, [])  # type: ignore[arg-type]
    assert submit([upstream, crashed]) == "future"  # type: ignore[list-item]
    (args,) = task.calls
    assert isinstance(args[0], quote) and args[0].unquote() is ctx
    assert args[1] == "infer"
    assert isinstance(args[2], quote) and args[2].unquote() is spec
    (first, second) = args[3]
    assert isinstance(first, allow_failure) and first.unwrap() is upstream and second is crashed
