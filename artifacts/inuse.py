"""Marking a temporary file or directory as in use, so housekeeping (``edgefarm gc``) never removes it.

The owner holds an exclusive ``flock`` on the path for as long as it works on it; the kernel drops the lock when
the owner exits, however it dies, so what a crashed process left behind is free to remove. ``gc`` removes an
entry only if it is old enough *and* it can take the lock itself (without waiting).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def mark_in_use(path: Path) -> int:
    """Lock ``path`` (a file or directory); returns the descriptor to pass to :func:`release`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(fd: int) -> None:
    os.close(fd)  # closing the descriptor drops its flock


@contextlib.contextmanager
def in_use(path: Path) -> Iterator[None]:
    fd = mark_in_use(path)
    try:
        yield
    finally:
        release(fd)


def remove_if_free(path: Path) -> bool:
    """Remove ``path`` unless someone holds it in use (without waiting); whether it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its owner is still working on it
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def remove_stale(directory: Path, pattern: str, older_than_s: float) -> list[Path]:
    """Remove the entries of ``directory`` matching ``pattern`` last modified over ``older_than_s`` ago and not
    marked in use; returns what was removed."""
    if not directory.is_dir():
        return []
    cutoff = time.time() - older_than_s
    removed = []
    for path in sorted(directory.glob(pattern)):
        try:
            old = path.lstat().st_mtime < cutoff
        except FileNotFoundError:
            continue
        if old and remove_if_free(path):
            removed.append(path)
    if removed:
        log.info("removed %d stale %s entr(ies) from %s", len(removed), pattern, directory)
    return removed
