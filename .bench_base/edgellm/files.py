"""The one way edgellm (and the farm) writes an output file: whole or not at all, never through a planted link.

The temporary file is created with exclusive create (``tempfile.mkstemp``: O_CREAT|O_EXCL, mode 0600, never
following a link) in the target's own directory, so the final ``rename`` is atomic and replaces the directory
entry itself, never what a symlink points to. Only a regular file (or nothing) is replaced: a symlink, a
directory, a device node, a FIFO or a socket at the output path is refused (exit 2) before anything is
written. No temporary file survives any error.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from edgellm.errors import ConfigurationError, InfrastructureError

# errors of the machine (storage exhausted or failing), not of the path the user gave
_INFRA_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.ENOMEM}
_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


def output_error(path: Path, exc: OSError) -> ConfigurationError | InfrastructureError:
    """An OSError met while writing ``path``, with its kind: full/failing storage is infrastructure."""
    reason = exc.strerror or str(exc)
    if exc.errno in _INFRA_ERRNOS:
        return InfrastructureError(f"cannot write output {path}: {reason}")
    return ConfigurationError(f"cannot write output {path}: {reason}")


def check_output_path(path: Path) -> os.stat_result | None:
    """The ``lstat`` of an existing regular file at ``path``, None if nothing is there; anything else refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise output_error(path, exc) from None
    if not stat.S_ISREG(st.st_mode):
        what = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise ConfigurationError(
            f"output {path} is {what}; refusing to replace it: give the path of a regular file or a new name"
        )
    return st


@contextlib.contextmanager
def atomic_output(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` only if the block ends normally.

    The new file keeps an existing file's permission bits (else ``mode``, default 0644).
    """
    path = Path(path)
    existing = check_output_path(path)
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=parent)
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), stat.S_IMODE(existing.st_mode) if existing else (mode or 0o644))
                yield f
                f.flush()
                os.fsync(f.fileno())
            check_output_path(path)  # refuse a link or node planted while we wrote
            os.replace(tmp, path)
        except OSError as exc:
            raise output_error(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (a new or existing regular file) atomically."""
    with atomic_output(path) as f:
        f.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any, *, sort_keys: bool = False) -> None:
    """``data`` as indented JSON (NaN/inf refused: make them JSON-safe first) written atomically."""
    text = json.dumps(data, indent=2, sort_keys=sort_keys, allow_nan=False) + "\n"
    write_text_atomic(path, text)
