"""Blobs a live process put, which ``gc`` keeps whether or not anything records them yet.

A put hands out a reference that its caller records in the database a moment (or a whole stage) later; until
then only the process knows it. Each store that puts keeps a pin file ``<store>/pins/<pid>-*`` listing the
sha256s it put, marked in use (``artifacts.inuse``) while the store is open: the kernel drops the mark when the
process ends, however it ends, so ``gc`` reads the pins of live processes and deletes the files of dead ones.
Pins are written and read under the store's lock (``ArtifactStore``), so a sweep never sees half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

from edgefarm.artifacts.inuse import new_file, release


class Pins:
    """This store object's pins (one file, opened on the first put, dropped by :meth:`close`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: tuple[Path, int] | None = None
        self._guard = threading.Lock()

    def add(self, sha256: str) -> None:
        with self._guard:
            if self._file is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._file = new_file(self.directory, f"{os.getpid()}-")
            path, _ = self._file
            with open(path, "a", encoding="ascii") as out:
                out.write(f"{sha256}\n")

    def close(self) -> None:
        with self._guard:
            if self._file is not None:
                path, lock = self._file
                path.unlink(missing_ok=True)
                release(lock)
                self._file = None


def live(directory: Path) -> set[str]:
    """Every sha256 pinned by a live process; the pin files of dead ones are removed."""
    pinned: set[str] = set()
    if not directory.is_dir():
        return pinned
    for path in sorted(directory.iterdir()):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # its store closed meanwhile
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its owner lives: keep what it put
                with os.fdopen(os.dup(fd), encoding="ascii", errors="replace") as pins:
                    pinned.update(line.strip() for line in pins if line.strip())
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        finally:
            os.close(fd)
    return pinned
