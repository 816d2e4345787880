"""What Prefect shows of a stage, decided here once: its task run name (``<stage> <model> <precision> [<variant>]
@<platform>``) and its final state (the stage's status: Failed with the reason when it failed or broke, Completed
named Skipped / Waived / Not applicable / Cached otherwise); a failing row's root cause and the ids of its logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prefect.states import Completed, Failed, State

from edgefarm import stages
from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.location import redact_url
from edgefarm.results.models import ResultStatus
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import StageOutcome

FAILED = (ResultStatus.FAIL, ResultStatus.ERROR)
RAN = (ResultStatus.PASS, ResultStatus.FAIL, ResultStatus.ERROR)
MESSAGE_CHARS = 2000  # Prefect shows the message in the run's header: the rows, not a wall of text
_NAMED = {ResultStatus.SKIPPED: "Skipped", ResultStatus.WAIVED: "Waived", ResultStatus.NOT_APPLICABLE: "Not applicable"}


def row_name(model: str, precision: str, variant: str, platforms: Iterable[str]) -> str:
    """``<model> <precision> [<variant>] @<platform>``."""
    return f"{model} {precision}{f' [{variant}]' if variant else ''} @{','.join(sorted(set(platforms)))}"


def task_run_name(stage: str, spec: JobSpec, sharers: Iterable[JobSpec] = ()) -> str:
    """``<stage> <model> <precision> [<variant>] @<platform>``; a run shared by several jobs (the reference of a
    model, a quantize or export serving several platforms) names what they differ in, comma-joined."""
    jobs = [spec, *sharers]

    def joined(values: Iterable[str]) -> str:
        return ",".join(sorted(set(values)))

    row = row_name(joined(j.model for j in jobs), joined(j.precision.value for j in jobs),
                   joined(j.variant for j in jobs if j.variant), (j.platform for j in jobs))
    return f"{stage} {row}"


def first_line(text: str | None, limit: int = 300) -> str:
    """The first line of a reason as Prefect shows it: shortened, any URL's credentials hidden."""
    line = redact_url((text or "").strip().splitlines()[0]) if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def stage_state(outcome: StageOutcome) -> State[StageOutcome]:
    """The task run's final state for a stage that ended with ``outcome`` (its data: the outcome, which the stages
    after it read and the scheduler records, whatever the state)."""
    took = f"{outcome.duration_s:.1f} s"
    if outcome.status in FAILED:
        kind = f" ({outcome.error_kind.value})" if outcome.error_kind is not None else ""
        return Failed(message=f"{outcome.status.value}{kind} after {took}: {first_line(outcome.reason)}",
                      data=outcome)
    if outcome.status is ResultStatus.PASS:
        name = "Cached" if outcome.cached else "Completed"
        return Completed(name=name, message=f"pass in {took}" + (" (reused)" if outcome.cached else ""),
                         data=outcome)
    return Completed(name=_NAMED.get(outcome.status, outcome.status.value), message=first_line(outcome.reason),
                     data=outcome)


def root_cause(stages_of_row: Mapping[str, StageOutcome]) -> tuple[str, StageOutcome] | None:
    """The row's first stage (in pipeline order) that failed or broke, or None."""
    failed = [(name, o) for name, o in stages_of_row.items() if o.status in FAILED]
    return min(failed, key=lambda pair: stages.rank(str(pair[0]))) if failed else None


def log_ids(outcome: StageOutcome) -> list[str]:
    """The ids ``edgefarm show`` opens for the stage's logs (``log:<sha256 prefix>``, as the run pages cite them); a
    stage that failed or errored cites its own check's evidence first (``report:<prefix>``: what the farm judged),
    then the tools' logs (a vendor tool's log may end "Export complete" when the farm's check failed)."""
    logs = [f"log:{a.sha256[:12]}" for a in outcome.artifacts if a.kind == ArtifactKind.LOG]
    if outcome.status not in FAILED:
        return logs
    return [f"report:{a.sha256[:12]}" for a in outcome.artifacts if a.kind == ArtifactKind.REPORT] + logs


def failures(outcomes: Mapping[str, Mapping[str, StageOutcome]], rows: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every failing row (job key -> its recorded stages) with its root cause: stage, status, error kind, reason and
    the ids of that stage's logs. ``rows``: job key -> its display name (:func:`row_name`)."""
    found = []
    for key in sorted(outcomes):
        cause = root_cause(outcomes[key])
        if cause is None:
            continue
        stage, o = cause
        found.append({"job": key, "row": rows.get(key, key), "stage": str(stage), "status": o.status.value,
                      "error_kind": o.error_kind.value if o.error_kind is not None else None,
                      "reason": o.reason or "", "device": o.device, "logs": log_ids(o)})
    return found
