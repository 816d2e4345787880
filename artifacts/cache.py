"""A worker's local read-through cache of a remote store's blobs, bounded in size.

It is a local ``ArtifactStore`` (same layout, atomic placement, read-only blobs, stale temp files swept by gc) plus:
an entry is handed out as an open file that holds a shared ``flock`` (``artifacts.inuse``) for as long as it is open;
``shrink`` evicts least recently used entries (by mtime, refreshed at every use) until the cache fits its bound, and
skips every entry someone holds, so an object in use is never evicted (the bound is exceeded by what is in use at
that moment, never more). Evicting only unlinks: a reader's open file keeps its bytes whatever happens to the name.
The cache trusts nothing it holds: the remote store re-hashes an entry whenever it hands it out.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edgefarm.artifacts.inuse import remove_if_free
from edgefarm.artifacts.store import ArtifactStore
from edgellm.errors import ConfigurationError

log = logging.getLogger(__name__)


class ReadThroughCache:
    def __init__(self, root: Path | str, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ConfigurationError(f"bad artifact cache bound {max_bytes!r} bytes: need >= 0")
        self.local = ArtifactStore(root)
        self.max_bytes = max_bytes

    def open(self, sha256: str) -> BinaryIO | None:
        """The cached entry, open and held in use until closed, marked as just used; None when not cached."""
        path = self.local.path(sha256)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)
            os.utime(path)  # least recently used goes first
        except FileNotFoundError:  # evicted between open and lock: our file is still whole, but no longer cached
            pass
        except BaseException:
            f.close()
            raise
        return f

    def add(self, sha256: str, fill: Callable[[BinaryIO], str]) -> BinaryIO:
        """A new entry written by ``fill`` (which returns the sha256 of what it wrote) and placed only if that is
        ``sha256``; returned open and held. A mismatch raises :class:`ContentMismatch` and leaves nothing."""
        dest = self.local.path(sha256)
        self.local.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.local.tmp, prefix="get-")
        f = os.fdopen(fd, "w+b")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # gc's sweep of temp files leaves it alone while it is written
            actual = fill(f)
            if actual != sha256:
                raise ContentMismatch(actual)
            f.flush()
            os.fsync(f.fileno())
            os.chmod(name, 0o444)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(name, dest)
        except BaseException:
            f.close()
            Path(name).unlink(missing_ok=True)
            raise
        f.seek(0)
        return f

    def evict(self, sha256: str) -> None:
        self.local.path(sha256).unlink(missing_ok=True)

    def size(self) -> int:
        total = 0
        for sha in self.local.list():
            try:
                total += self.local.path(sha).stat().st_size
            except FileNotFoundError:
                continue
        return total

    def shrink(self) -> list[str]:
        """Evict the least recently used entries nobody holds until the cache fits its bound; returns them."""
        entries = []
        for sha in self.local.list():
            try:
                st = self.local.path(sha).stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, sha))
        total = sum(size for _, size, _ in entries)
        evicted = []
        for _, size, sha in sorted(entries):
            if total <= self.max_bytes:
                break
            if remove_if_free(self.local.path(sha)):
                total -= size
                evicted.append(sha)
        if evicted:
            log.info("artifact cache %s: evicted %d least recently used entr(ies) to stay within %.2f GB",
                     self.local.root, len(evicted), self.max_bytes / (1 << 30))
        return evicted


class ContentMismatch(Exception):
    """What was written (or read) does not hash to the name it was to be stored under; ``etag``: the remote
    object's, when known (which object the bytes came from)."""

    def __init__(self, actual: str, etag: str | None = None) -> None:
        super().__init__(actual)
        self.actual = actual
        self.etag = etag
