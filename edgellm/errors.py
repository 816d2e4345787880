"""Error types shared by the library and the farm.

Every failure carries a kind so callers can decide blame and retries by kind, never by message text:
only ``INFRASTRUCTURE`` errors are retried.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.StrEnum):
    INFRASTRUCTURE = "infrastructure"  # device unreachable, connection lost, disk full: retryable
    CONFIGURATION = "configuration"  # bad input, unsupported model or option: fix the input
    TEST_FAILURE = "test_failure"  # the thing under test ran and produced a wrong result
    BUG = "bug"  # an internal invariant broke: fix the code


class EdgeLLMError(Exception):
    """Base error of the library. ``str(err)`` is one line that names the bad value and what is valid."""

    kind: ErrorKind = ErrorKind.BUG

    def __init__(self, message: str, *, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class ConfigurationError(EdgeLLMError):
    """Input the user can fix: a bad flag, file, config key or an unsupported model."""

    kind = ErrorKind.CONFIGURATION


class CheckpointError(ConfigurationError):
    """A checkpoint that is malformed, incomplete or inconsistent. Names the file, tensor and rule."""

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None) -> None:
        where = ": ".join(p for p in (file, f"tensor {tensor!r}" if tensor else None) if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.file = file
        self.tensor = tensor


class UnsupportedError(ConfigurationError):
    """A valid input the library does not implement (a family, a rope scaling type, a quantization method)."""


class InfrastructureError(EdgeLLMError):
    """The machine failed, not the model: retryable."""

    kind = ErrorKind.INFRASTRUCTURE


class TestFailure(EdgeLLMError):
    """The model ran and produced a wrong result (accuracy below threshold, mismatched tokens)."""

    __test__ = False  # not a pytest class
    kind = ErrorKind.TEST_FAILURE


class BugError(EdgeLLMError):
    """An internal invariant broke."""

    kind = ErrorKind.BUG
