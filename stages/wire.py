"""A job and a stage outcome as plain JSON, for a stage sent to another worker (``tasks.dispatch``): what goes
over Prefect's API as a flow parameter and comes back through the results database (``RunWorker.outcome``).
Round trips are exact (tests/test_dispatch.py); an artifact a stage hands on travels as its reference only."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pydantic import TypeAdapter, ValidationError

from edgefarm.artifacts.store import ArtifactRef
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgellm.errors import ConfigurationError

_REF = "__artifact__"
_CHECKPOINT = "__checkpoint__"


@functools.cache
def _adapter(kind: type) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def job_to_json(job: JobSpec) -> dict[str, Any]:
    return _adapter(JobSpec).dump_python(job, mode="json")  # type: ignore[no-any-return]


def job_from_json(data: Any) -> JobSpec:
    try:
        return _adapter(JobSpec).validate_python(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise ConfigurationError(f"a dispatched job does not read as a job: {exc.errors()[0]['msg']} at "
                                 f"{'.'.join(str(x) for x in exc.errors()[0]['loc'])}") from None


def outcome_to_json(out: StageOutcome) -> dict[str, Any]:
    plain = dataclasses.replace(out, outputs={})
    data: dict[str, Any] = _adapter(StageOutcome).dump_python(plain, mode="json")
    data["outputs"] = {k: _value_to_json(v) for k, v in out.outputs.items()}
    return data


def outcome_from_json(data: Any) -> StageOutcome:
    if not isinstance(data, dict):
        raise ConfigurationError(f"a dispatched stage's outcome is not a JSON object: {type(data).__name__}")
    outputs = data.get("outputs") or {}
    try:
        out: StageOutcome = _adapter(StageOutcome).validate_python({**data, "outputs": {}})
    except ValidationError as exc:
        raise ConfigurationError(f"a dispatched stage's outcome does not read as one: {exc.errors()[0]['msg']} at "
                                 f"{'.'.join(str(x) for x in exc.errors()[0]['loc'])}") from None
    out.outputs = {str(k): _value_from_json(v) for k, v in outputs.items()}
    out.metrics = {k: (float(v[0]), str(v[1])) for k, v in out.metrics.items()}
    return out


def _value_to_json(value: Any) -> Any:
    if isinstance(value, ArtifactRef):
        return {_REF: _adapter(ArtifactRef).dump_python(value, mode="json")}
    if isinstance(value, CheckpointRef):
        return {_CHECKPOINT: _adapter(CheckpointRef).dump_python(value, mode="json")}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ConfigurationError(f"a stage output of type {type(value).__name__} cannot be sent between workers")


def _value_from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {_REF}:
        return _adapter(ArtifactRef).validate_python(value[_REF])
    if isinstance(value, dict) and set(value) == {_CHECKPOINT}:
        return _adapter(CheckpointRef).validate_python(value[_CHECKPOINT])
    return value
