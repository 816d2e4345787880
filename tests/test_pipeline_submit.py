"""The scheduler (flows.pipeline): how it hands a stage to Prefect (the context and the job quoted, so Prefect does not
walk them; the upstream runs as they are, for Prefect to resolve), and runs pinned to one device (an engine's) never
filling a lane while its other devices idle."""

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


class _Future:
    """Ends when the test says so (``end``), calling back as Prefect's futures do."""

    def __init__(self, outcome: Any) -> None:
        self.outcome, self.callbacks = outcome, []  # type: ignore[var-annotated]

    def add_done_callback(self, fn: Any) -> None:
        self.callbacks.append(fn)

    def result(self, raise_on_failure: bool = True) -> Any:
        return self.outcome

    def end(self) -> None:
        for fn in self.callbacks:
            fn(self)


def test_runs_pinned_to_a_busy_device_let_the_runs_behind_them_go_first() -> None:
    """Engine stages wait for the device that built their engine: a lane of 3 once filled with runs for device A while
    B stood idle (each ends only when the test ends it, in order: A's three, then B's)."""
    import threading

    from edgefarm.results.models import ResultStatus
    from edgefarm.stages.outcome import StageOutcome

    submitted: list[str] = []
    futures: dict[str, _Future] = {}
    lock = threading.Condition()

    def node(key: str, needs: tuple[str, ...] = (), device: str = "") -> pipeline._Node:
        def submit(_: list[Any]) -> _Future:
            with lock:
                submitted.append(key)
                futures[key] = _Future(StageOutcome(stage="build", status=ResultStatus.PASS, device=device or None))
                lock.notify_all()
                return futures[key]

        pin = (lambda ended: ended[0].device) if needs else None
        return pipeline._Node(key, submit, needs, "device:p", lambda _: None, pin)  # type: ignore[arg-type]

    scheduler = pipeline.Scheduler({"device:p": 3}, {"A": 2, "B": 2})
    scheduler.add(node("build-a", device="A"))
    scheduler.add(node("build-b", device="B"))
    for i in range(4):
        scheduler.add(node(f"a{i}", ("build-a",)))
    scheduler.add(node("b0", ("build-b",)))
    runner = threading.Thread(target=scheduler.run)
    runner.start()

    def end(key: str, then: int) -> None:
        with lock:
            assert lock.wait_for(lambda: key in futures, timeout=10), submitted
        futures[key].end()
        with lock:
            assert lock.wait_for(lambda: len(submitted) >= then, timeout=10), submitted

    end("build-a", 4)  # a0 and a1 (A's fill: one running, one waiting for it); a2 and a3 held back, the lane full
    end("build-b", 5)  # a lane slot: b0 goes before a2 and a3, which wait for A
    assert submitted == ["build-a", "build-b", "a0", "a1", "b0"], submitted
    for key, then in [("a0", 6), ("a1", 7), ("b0", 7), ("a2", 7), ("a3", 7)]:
        end(key, then)
    assert submitted[5:] == ["a2", "a3"], submitted
    runner.join(timeout=10)
    assert not runner.is_alive() and len(scheduler.results) == 7
