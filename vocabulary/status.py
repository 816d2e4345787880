"""How a stage or a result ended (the results database stores it; ``results.models`` keeps its CHECK list)."""

from __future__ import annotations

import enum


class ResultStatus(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    WAIVED = "waived"  # failed, but a known issue accepted by policy: not a failure, not a proof
    SKIPPED = "skipped"  # not run (an earlier stage failed, no device...)
    NOT_APPLICABLE = "not_applicable"  # the test does not apply to this model/precision/platform
