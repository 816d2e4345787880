"""What a stage returns (its status, where it ran, why, its metrics and the artifacts it produced), what a cached
stage's key function hands the generic body (``Keyed``), and how a command's exit reads as an outcome (``classify``:
the exit codes of edgellm's commands, ``ErrorKind.exit_code``). Stages' work lives in ``tasks/`` and in toolchain
drivers alike; both build these."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgefarm.artifacts.store import ArtifactRef
from edgefarm.devices.transport.base import TIMEOUT_EXIT_CODE, CommandResult
from edgefarm.vocabulary.status import ResultStatus
from edgellm.errors import EdgeLLMError, ErrorKind, InfrastructureError

REASON_CHARS = 2000  # a stage's reason as recorded: its first line, this long at most (an ellipsis where cut)


@dataclass
class StageOutcome:
    stage: str  # its name in the stage table (a recorded one is a Stage)
    status: ResultStatus
    device: str | None = None
    reason: str | None = None
    error_kind: ErrorKind | None = None
    duration_s: float = 0.0
    metrics: dict[str, tuple[float, str]] = field(default_factory=dict)
    artifacts: list[ArtifactRef] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # refs the next stage needs (onnx, engine, checkpoint)
    toolchain_version: str | None = None  # of the job's toolchain where this stage ran; None when it did not run
    toolchain: str | None = None  # the toolchain that made it when not the job's (quantize: the quantizer's)
    cached: bool = False
    route: str | None = None  # how the engine was made (onnx | direct) for toolchains with routes, else None
    standin: bool = False  # ran on test stand-ins of the toolchain's tools: recorded, never evidence
    started_at: float = field(default_factory=time.time)  # wall clock when the task body began
    ended_at: float = 0.0
    task_run_id: str | None = None  # the Prefect task run that produced it (orchestration overhead is measured)
    environment: dict[str, Any] | None = None  # where it ran (tasks.environment); None: the orchestrator's
    bench_conditions: str | None = None  # how a benchmark's board differed from its type's declared conditions

    @property
    def passed(self) -> bool:
        return self.status is ResultStatus.PASS

    def done(self) -> StageOutcome:
        self.ended_at = time.time()
        if not self.duration_s:
            self.duration_s = self.ended_at - self.started_at
        return self

    @classmethod
    def from_error(cls, stage: str, exc: BaseException, device: str | None = None) -> StageOutcome:
        kind = exc.kind if isinstance(exc, EdgeLLMError) else ErrorKind.BUG
        reason = str(exc) if isinstance(exc, EdgeLLMError) else f"{type(exc).__name__}: {exc}"
        status = ResultStatus.FAIL if kind is ErrorKind.TEST_FAILURE else ResultStatus.ERROR
        first = (reason.splitlines() or [""])[0]
        first = first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 1] + "…"  # cut, and says so
        return cls(stage=stage, status=status, device=device, reason=first, error_kind=kind).done()

    @classmethod
    def skipped(cls, stage: str, reason: str) -> StageOutcome:
        return cls(stage=stage, status=ResultStatus.SKIPPED, reason=reason).done()


@dataclass
class Keyed:
    """A cached stage's key (``stages.StageCache``): the inputs its content key is the digest of, whose product the
    cached artifact is, and what a hit's outcome records. The work of a miss gets it and calls ``made``."""

    inputs: dict[str, Any]
    toolchain: str | None  # whose product it is (None: no toolchain's, the transformers reference)
    toolchain_version: str | None  # that toolchain's here; the work's outcome gets it where it names none
    device: str | None = None  # what a hit's outcome records of where and how it was made
    route: str | None = None
    standin: bool = False
    on_hit: Callable[[ArtifactRef], StageOutcome] | None = None  # a hit's outcome, where not the generic one
    product: ArtifactRef | None = None  # set by made()
    product_version: str | None = None

    def made(self, ref: ArtifactRef, toolchain_version: str | None = None) -> None:
        """The work stored its product and vouches for it: the body remembers it under the key once the work ended
        (whatever it did after). ``toolchain_version``: what made it, where not the key's."""
        self.product = ref
        self.product_version = toolchain_version if toolchain_version is not None else self.toolchain_version


def classify(result: CommandResult, timeout: float) -> tuple[ResultStatus, ErrorKind | None, str | None]:
    if result.timed_out or result.exit_code == TIMEOUT_EXIT_CODE:
        return ResultStatus.FAIL, ErrorKind.TEST_FAILURE, f"timed out after {timeout:.0f} s (stage timeout)"
    kind = ErrorKind.from_exit_code(result.exit_code)  # the exit codes of edgellm's commands (edgellm.errors)
    if kind is ErrorKind.INFRASTRUCTURE:
        raise InfrastructureError(f"the device reported an infrastructure failure: {last_line(result.stderr)}")
    if kind is None:
        return ResultStatus.PASS, None, None
    status = ResultStatus.FAIL if kind is ErrorKind.TEST_FAILURE else ResultStatus.ERROR
    return status, kind, last_line(result.stderr) or f"exit code {result.exit_code}"


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:2000] if lines else ""
