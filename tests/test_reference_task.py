"""The farm's reference task pieces: its cache key and how a reference failure lands on the accuracy stage."""

from __future__ import annotations

import importlib.metadata

from edgefarm import stages
from edgefarm.results import cache
from edgefarm.results.models import ResultStatus
from edgefarm.stages import REFERENCE, Stage
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.common import adopted_problem
from edgefarm.tasks.reference import EVAL_MAX_TOKENS, REFERENCE_WINDOW, reference_key_inputs
from edgellm.errors import ConfigurationError, ErrorKind, InfrastructureError


def test_reference_key_covers_checkpoint_settings_and_versions() -> None:
    a, b = reference_key_inputs("a" * 64), reference_key_inputs("b" * 64)
    assert cache.cache_key(a) == cache.cache_key(reference_key_inputs("a" * 64))
    assert cache.cache_key(a) != cache.cache_key(b)
    assert a["transformers"] == importlib.metadata.version("transformers") and a["edgellm"]
    assert a["settings"]["max_tokens"] == EVAL_MAX_TOKENS and a["settings"]["window"] == REFERENCE_WINDOW
    assert len(a["settings"]["text_sha256"]) == 64 and a["stage"] == "reference"


def reference_problem(reference: StageOutcome | BaseException) -> StageOutcome | None:
    return adopted_problem(Stage.ACCURACY, REFERENCE, reference)


def test_reference_failure_is_the_accuracy_stage_error_with_its_reason() -> None:
    # the reference is a stage without result rows, so the generic body has accuracy adopt its failure
    assert REFERENCE in stages.spec(Stage.ACCURACY).needs and not stages.spec(REFERENCE).recorded
    failed = StageOutcome(stage=REFERENCE, status=ResultStatus.ERROR, device="orchestrator",
                          error_kind=ErrorKind.CONFIGURATION,
                          reason="edgellm reference: error (configuration): checkpoint x has no config.json")
    out = reference_problem(failed)
    assert out is not None and out.stage is Stage.ACCURACY and out.status is ResultStatus.ERROR
    assert out.error_kind is ErrorKind.CONFIGURATION and out.reason == f"reference: {failed.reason}"
    crashed = reference_problem(ConfigurationError("bad checkpoint"))
    assert crashed is not None and crashed.status is ResultStatus.ERROR
    assert crashed.reason == "reference: bad checkpoint"
    infra = reference_problem(InfrastructureError("host disk full"))
    assert infra is not None and infra.error_kind is ErrorKind.INFRASTRUCTURE and "host disk full" in infra.reason
    ok = StageOutcome(stage=REFERENCE, status=ResultStatus.PASS)
    assert reference_problem(ok) is None
