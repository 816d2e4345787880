"""``tasks.build.with_engine``: a stage whose engine's device was lost builds it again once; a rebuild that does not
pass is reported with the build's own verdict (a test failure stays a test failure, never an infrastructure error
that Prefect would retry)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

import edgefarm.tasks.build as build
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.engines import DeviceEngine
from edgellm.errors import ErrorKind, InfrastructureError

LOST = DeviceEngine(digest="a" * 64, device="dev-a", platform="orin", toolchain="t", toolchain_version="1",
                    bytes=1, files=1, onnx="b" * 64)
NEW = DeviceEngine(digest="c" * 64, device="dev-b", platform="orin", toolchain="t", toolchain_version="1",
                   bytes=1, files=1, onnx="b" * 64)


@pytest.fixture
def farm(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    fake = SimpleNamespace(lock=threading.Lock(), bad_devices=set(),
                           store=SimpleNamespace(ref=lambda sha, kind, packing: SimpleNamespace(sha256=sha)))
    monkeypatch.setattr(build.Farm, "get", staticmethod(lambda ctx: fake))
    monkeypatch.setattr(build.engines, "load", lambda f, ref: NEW if ref == "new" else LOST)
    return fake


def _holder() -> StageOutcome:
    return StageOutcome(stage=Stage.BUILD, status=ResultStatus.PASS, outputs={"engine": "old"})


def _run(farm: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, rebuilt: StageOutcome) -> tuple[StageOutcome,
                                                                                                   list[Any]]:
    seen: list[Any] = []

    def attempt(holder: StageOutcome) -> StageOutcome:
        seen.append(holder.outputs["engine"])
        if holder.outputs["engine"] == "old":
            farm.bad_devices.add("dev-a")  # what run_stage's failure on every holder leaves
            raise InfrastructureError("dev-a: unreachable")
        return StageOutcome(stage=Stage.INFER, status=ResultStatus.PASS, device="dev-b")

    monkeypatch.setattr(build, "work_again", lambda ctx, stage, job, ready: rebuilt)
    job = SimpleNamespace(key="j")
    return build.with_engine(None, job, Stage.INFER, _holder(), attempt), seen  # type: ignore[arg-type]


def test_a_lost_engine_is_built_again_and_the_stage_runs_with_it(farm: SimpleNamespace,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    rebuilt = StageOutcome(stage=Stage.BUILD, status=ResultStatus.PASS, outputs={"engine": "new"})
    out, seen = _run(farm, monkeypatch, rebuilt)
    assert seen == ["old", "new"] and out.status is ResultStatus.PASS
    assert out.reason == f"engine built again on dev-b ({'c' * 12}): dev-a, which held {'a' * 12}, was lost"


def test_a_rebuild_that_fails_its_check_is_that_failure_not_infrastructure(farm: SimpleNamespace,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rebuilt = StageOutcome(stage=Stage.BUILD, status=ResultStatus.FAIL, error_kind=ErrorKind.TEST_FAILURE,
                           device="dev-b", reason="asked for fp16 but the built engine holds fp32 weights")
    out, seen = _run(farm, monkeypatch, rebuilt)
    assert seen == ["old"]
    assert (out.stage, out.status, out.error_kind, out.device) == (Stage.INFER, ResultStatus.FAIL,
                                                                   ErrorKind.TEST_FAILURE, "dev-b")
    assert out.reason.endswith("building it again did not pass: asked for fp16 but the built engine holds fp32 "
                               "weights")
