"""Marking a temporary file or directory as in use, so housekeeping (``edgefarm gc``) never removes it.

The owner holds an exclusive ``flock`` on the path for as long as it works on it; the kernel drops the lock when
the owner exits, however it dies, so what a crashed process left behind is free to remove. ``gc`` removes an
entry only if it is old enough *and* it can take the lock itself (without waiting).

A new entry is unmarked for a moment between its creation and its lock, when a sweep may take it for abandoned:
:func:`claim` makes it again if that happened, so its owner always ends up holding an entry that is there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
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


def claim(make: Callable[[], Path]) -> tuple[Path, int]:
    """A new entry made by ``make`` (a fresh, uniquely named temporary file or directory), marked in use; made
    again when a sweep removed it before the mark took. Returns it and the descriptor for :func:`release`."""
    while True:
        path = make()
        try:
            fd = mark_in_use(path)
        except FileNotFoundError:  # swept before we could open it
            continue
        try:
            if os.path.samestat(os.lstat(path), os.fstat(fd)):
                return path, fd
        except FileNotFoundError:  # swept while we waited for the lock
            pass
        release(fd)


def new_file(directory: Path, prefix: str) -> tuple[Path, int]:
    """An empty temporary file in ``directory``, marked in use (see :func:`claim`)."""

    def make() -> Path:
        fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
        os.close(fd)
        return Path(name)

    return claim(make)


@contextlib.contextmanager
def held_dir(directory: Path, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``directory`` (made if missing), marked in use while the block runs and removed
    when it ends. What a killed owner left is removed by :func:`remove_stale` (the owner's lock died with it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path, fd = claim(lambda: Path(tempfile.mkdtemp(dir=directory, prefix=prefix)))
    owner = os.getpid()
    try:
        yield path
    finally:
        # never in a forked copy of the owner (code run there between fork and exec can finalize this block)
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)
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
    if not (math.isfinite(older_than_s) and older_than_s >= 0):
        raise ValueError(f"bad age {older_than_s!r}: need a finite number of seconds >= 0")
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
