"""What Prefect shows of a run, decided here once: the flow run's final state (Failed naming the failed rows and
their root causes; Failed "nothing ran" when no stage ran, with why; else Completed), its data the run summary.
Stages' task runs: ``tasks.states``.

Callers of a flow in this process read its summary with :func:`flow_summary` from the state (``return_state=True``):
a Failed flow run is how the run says it failed, never an exception for the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect.states import Completed, Failed, State

from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.states import MESSAGE_CHARS, RAN, first_line


def nothing_ran(outcomes: Mapping[str, Mapping[str, StageOutcome]]) -> bool:
    """No stage of any job ran (all skipped, waived or not applicable, or no job at all): pytest's "no tests ran"."""
    return not any(o.status in RAN for stages in outcomes.values() for o in stages.values())


def flow_state(summary: dict[str, Any]) -> State[dict[str, Any]]:
    """The flow run's final state: Failed naming each failed row and its root cause, or "nothing ran" with why;
    else Completed. Its data is the summary either way."""
    run = f"run {summary['run_id']}: " if summary.get("run_id") is not None else ""  # the farm's run number first
    failed = summary.get("failures") or []
    if failed:
        parts = [f"{f['row']}: {f['stage']} {f['status']}: {first_line(f['reason'], 160)}" for f in failed]
        message = f"{run}{len(failed)} row(s) failed: " + "; ".join(parts)
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS - 1] + "…"
        return Failed(message=message, data=summary)
    if summary.get("nothing_ran"):
        why = "; ".join(summary.get("why_nothing_ran") or ["the plan has no job to run"])
        message = f"{run}nothing ran: {why}"
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS - 1] + "…"
        return Failed(name="Nothing ran", message=message, data=summary)
    stages = summary.get("stages") or {}
    return Completed(message=run + (", ".join(f"{n} {s}" for s, n in sorted(stages.items())) or "done"),
                     data=summary)


def flow_summary(state: State[Any]) -> dict[str, Any]:
    """The summary a flow run of this farm ended with, whatever its state; a flow that broke off (an exception:
    infrastructure, bad input) raises it here, for the command line to map to its exit code."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, BaseException):
        raise data
    if not isinstance(data, dict):
        raise TypeError(f"flow run ended {state.name} with {type(data).__name__}, not a run summary")
    return data
