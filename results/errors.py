"""Give every exception that can reach a farm command or a stage its kind (so its exit code and retry follow).

Database and Alembic errors come from SQLAlchemy; disk and memory ones from the OS. A full disk is the machine's
fault (infrastructure, retried elsewhere), never the model's or the code's.
"""

from __future__ import annotations

import errno

from edgellm.errors import BugError, ConfigurationError, EdgeLLMError, InfrastructureError

# The machine is short of something, or its storage broke: another try (or another device) may succeed.
INFRA_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM, errno.EMFILE,
                          errno.ENFILE, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.EHOSTUNREACH,
                          errno.ENETUNREACH, errno.EPIPE, errno.ESTALE})
# A path the user named is wrong.
CONFIG_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EEXIST,
                           errno.ENAMETOOLONG})


class RunReaped(InfrastructureError):
    """The run was ended by another process (reaped as dead) while this one still ran it: nothing it did after
    that is evidence (never published)."""


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:500]


def classify(exc: BaseException) -> EdgeLLMError:
    """The error with its kind: an EdgeLLMError as is, a known foreign one wrapped, anything else a bug."""
    from alembic.util import CommandError
    from sqlalchemy.exc import (
        DatabaseError,
        DataError,
        IntegrityError,
        InterfaceError,
        OperationalError,
        ProgrammingError,
        SQLAlchemyError,
        StatementError,
    )
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, EdgeLLMError):
        return exc
    if isinstance(exc, StatementError) and isinstance(exc.orig, EdgeLLMError):
        return exc.orig  # a column type refused a value (results.models.VocabularyName): the value's fault
    if isinstance(exc, MemoryError):
        return InfrastructureError("out of memory")
    if isinstance(exc, OSError) and exc.errno is not None:
        where = f" ({exc.filename})" if exc.filename else ""
        text = f"{exc.strerror or exc}{where}"
        if exc.errno in INFRA_ERRNOS:
            return InfrastructureError(text)
        if exc.errno in CONFIG_ERRNOS:
            return ConfigurationError(text)
        return InfrastructureError(text)
    if isinstance(exc, IntegrityError | ProgrammingError | DataError):
        return BugError(f"database statement failed: {_first_line(exc)}")
    if isinstance(exc, OperationalError | InterfaceError | DatabaseError):
        return InfrastructureError(f"database failed: {_first_line(exc)}")
    if isinstance(exc, PoolTimeout):  # every connection of the process's pool stayed busy: the database is slow
        return InfrastructureError(f"no database connection free in time: {_first_line(exc)}")
    if isinstance(exc, SQLAlchemyError):
        return BugError(f"database layer: {type(exc).__name__}: {_first_line(exc)}")
    if isinstance(exc, CommandError):
        return InfrastructureError(f"database migration: {_first_line(exc)}")
    return BugError(f"{type(exc).__name__}: {_first_line(exc)}")
