"""Error types shared by the library and the farm.

Every failure carries a kind so callers can decide blame and retries by kind, never by message text:
only ``INFRASTRUCTURE`` errors are retried.
"""

from __future__ import annotations

import enum

EXIT_OK = 0  # every command of edgellm and edgefarm: success (any other code is an error kind's, below)


class ErrorKind(enum.StrEnum):
    INFRASTRUCTURE = "infrastructure"  # device unreachable, connection lost, disk full: retryable
    CONFIGURATION = "configuration"  # bad input, unsupported model or option: fix the input
    TEST_FAILURE = "test_failure"  # the thing under test ran and produced a wrong result
    BUG = "bug"  # an internal invariant broke: fix the code
    # the job needed more than the machine had (memory, disk): a finding about the row on that machine, with the
    # figures; not retried (the same job on the same machine runs out again)
    RESOURCE = "resource"

    @property
    def exit_code(self) -> int:
        """The exit code of every ``edgellm`` and ``edgefarm`` command that ends with this kind of error (the one
        definition: 1 test failure, 2 bad input, 3 infrastructure, 4 bug, 5 out of resources)."""
        return _EXIT_CODES[self]

    @classmethod
    def from_exit_code(cls, code: int) -> ErrorKind | None:
        """The kind an ``edgellm`` exit code stands for; None for 0 (success); BUG for a code no kind has (a crash,
        a signal: the command broke its own contract)."""
        if code == EXIT_OK:
            return None
        return next((kind for kind, known in _EXIT_CODES.items() if known == code), cls.BUG)


_EXIT_CODES = {ErrorKind.TEST_FAILURE: 1, ErrorKind.CONFIGURATION: 2, ErrorKind.INFRASTRUCTURE: 3, ErrorKind.BUG: 4,
               ErrorKind.RESOURCE: 5}
EXIT_CODES_HELP = "exit codes: 0 ok, 1 test failure, 2 bad input, 3 infrastructure, 4 bug, 5 out of resources"


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


class DeviceConfigurationError(InfrastructureError):
    """A device is set up wrong for a job's tools (a tool, library or plugin missing, a build of another version):
    the job is not to blame. The farm quarantines the device with this reason (a passing health check releases it)
    and moves the job to another device."""


class ResourceError(EdgeLLMError):
    """The job needed more than the machine had (killed for memory, out of device memory, a full disk); the
    message carries the figures."""

    kind = ErrorKind.RESOURCE


class TestFailure(EdgeLLMError):
    """The model ran and produced a wrong result (accuracy below threshold, mismatched tokens)."""

    __test__ = False  # not a pytest class
    kind = ErrorKind.TEST_FAILURE


class BugError(EdgeLLMError):
    """An internal invariant broke."""

    kind = ErrorKind.BUG
