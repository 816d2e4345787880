"""Content-addressed artifact store (sha256) on a local directory.

Layout: ``<root>/sha256/ab/cdef...`` (the first two hex digits fan out), ``<root>/tmp/`` for writes in progress.
A blob is written to a temp file while hashed, fsynced, then renamed into place (atomic; a crash leaves only a
temp file, which gc removes) and made read-only. Same content is stored once: putting it again only refreshes
the blob's mtime, so a fresh reference is never garbage collected before the caller records it; if the stored
copy no longer verifies, the new one replaces it (a put never hands out a reference to a corrupt blob) and the
corrupt one is moved aside to ``<root>/quarantine/`` (evidence is never destroyed; gc never walks it).

A directory is stored as ONE blob: a deterministic tar (members sorted by path, mtimes/uids/gids zeroed, owner
names empty, modes 0644/0755 keeping only the executable bit; symlinks and special files are refused). The same
tree therefore always has the same sha256, and ``extract`` restores it. ``ArtifactRef.packing`` says which.

Every read re-hashes the blob: a corrupt blob is never served (CorruptArtifactError names it); ``verify`` lists
every corrupt blob in the store. The store knows nothing of the database: ``gc`` takes the referenced set (or a
function reading it).

``gc`` and puts exclude each other on ``<root>/gc.lock`` (puts share it, a gc holds it alone): a put either
finishes before a gc starts, its blob pinned (``artifacts.pins``) until the store is closed, or waits for the gc to
end and then finds the blob gone and stores it again. A gc reads the referenced set and the live pins under the
lock, so what a put stored is kept until its caller recorded it and closed the store.

Names (``set_ref``/``get_ref``): a few blobs are found by a well-known name rather than by a sha256 recorded in the
database (e.g. a toolchain's mirrored wheels, ``toolchains.mirror``). A name is a small record ``<root>/refs/<name>``
(JSON: the blob it names and the blobs it keeps), replaced atomically; ``gc`` keeps every blob a name names or keeps.

``Store`` is the contract every backend keeps (this one, and ``artifacts.s3.S3ArtifactStore`` on a bucket);
``artifacts.location.open_store`` picks one by URL.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from edgefarm.artifacts import pins
from edgefarm.artifacts.inuse import new_file, release, remove_stale
from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgellm.errors import ConfigurationError, InfrastructureError
from edgellm.files import atomic_output

log = logging.getLogger(__name__)

SHA256_RE = re.compile(r"[0-9a-f]{64}")
# a name (``set_ref``): '/'-separated parts of letters, digits, '.', '_', '+', '-', each starting with a letter or digit
REF_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}(?:/[A-Za-z0-9][A-Za-z0-9._+-]{0,99}){0,7}")
MAX_REF_CHARS = 256
_CHUNK = 1 << 20
Shas = list[str]  # (stores have a method named list, which hides the builtin in their class bodies)


class StoreError(InfrastructureError):
    """The artifact store failed (unreachable after its retries, or its bytes corrupt): infrastructure, so the
    stage is retried, but never the fault of the device a stage was staging inputs for."""


class CorruptArtifactError(StoreError):
    """A stored blob's content no longer matches its sha256 (disk or tampering): it is not served."""


class UnsafeArchiveError(StoreError):
    """A stored tar whose members would land outside its directory (or are links out, devices, not a tar at all):
    refused whole, nothing extracted."""


class MissingArtifactError(ConfigurationError):
    """No blob with that sha256 in this store."""


@dataclass(frozen=True)
class ArtifactRef:
    sha256: str
    size: int
    kind: ArtifactKind
    packing: Packing = Packing.FILE


class Store(Protocol):
    """What the farm asks of an artifact store, whatever keeps the bytes."""

    def put(self, src: Path | str | bytes, kind: ArtifactKind | str = ArtifactKind.OTHER) -> ArtifactRef: ...
    def has(self, sha256: str) -> bool: ...
    def ref(self, sha256: str, kind: ArtifactKind, packing: Packing) -> ArtifactRef: ...
    def read_bytes(self, sha256: str) -> bytes: ...
    def get_file(self, sha256: str, dest: Path | str) -> Path: ...
    def extract(self, sha256: str, dest: Path | str) -> Path: ...
    def list(self) -> Iterator[str]: ...
    def verify(self) -> Shas: ...
    def gc(self, referenced: Collection[str] | Callable[[], Collection[str]], older_than_s: float) -> Shas: ...
    def close(self) -> None: ...
    def set_ref(self, name: str, sha256: str, keeps: Collection[str] = ()) -> None: ...
    def get_ref(self, name: str) -> str | None: ...


def check_ref_name(name: str) -> str:
    """``name`` when it can name a blob (see ``REF_NAME_RE``), else ConfigurationError naming it and what is valid."""
    if not (isinstance(name, str) and len(name) <= MAX_REF_CHARS and REF_NAME_RE.fullmatch(name)):
        raise ConfigurationError(f"bad artifact name {name!r}: need at most 8 '/'-separated parts of letters, digits, "
                                 f"'.', '_', '+' or '-', each starting with a letter or digit ({MAX_REF_CHARS} "
                                 f"characters in all)")
    return name


def ref_record(sha256: str, keeps: Collection[str]) -> bytes:
    """What a name's record holds: the blob it names and the blobs it keeps (from gc)."""
    kept = sorted({check_sha(s) for s in keeps} - {check_sha(sha256)})
    return json.dumps({"sha256": sha256, "keeps": kept}, sort_keys=True).encode()


def parse_ref(name: str, data: bytes, where: str) -> tuple[str, list[str]]:
    """A name's record -> (the blob it names, the blobs it keeps); a record that is not one is a StoreError."""
    try:
        found = json.loads(data)
        sha, keeps = check_sha(found["sha256"]), [check_sha(s) for s in found["keeps"]]
    except (ValueError, KeyError, TypeError, ConfigurationError):
        raise StoreError(f"artifact name {name!r} in {where} is not a name record (set it again)") from None
    return sha, keeps


def check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
        raise ConfigurationError(f"bad artifact sha256 {sha256!r}: need 64 lowercase hex digits")
    return sha256


def _tar_dir(src: Path, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(src.rglob("*"), key=lambda p: p.relative_to(src).as_posix()):
            rel = path.relative_to(src).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise ConfigurationError(f"cannot store {str(path)!r}: only regular files and directories "
                                         f"are stored (no symlinks or special files)")
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = path.stat().st_size
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)


def new_extract_dest(dest: Path | str) -> Path:
    """``dest`` for :func:`untar`, refused when something is already there (before any byte is read)."""
    dest = Path(dest)
    if dest.exists():
        raise ConfigurationError(f"cannot extract artifact into {str(dest)!r}: it already exists")
    return dest


def untar(tar: BinaryIO, dest: Path) -> Path:
    """Unpack a verified deterministic tar into ``dest``, all or nothing (staged beside it, then renamed)."""
    dest = new_extract_dest(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        try:
            with tarfile.open(fileobj=tar, mode="r") as archive:
                archive.extractall(staging, filter="data")
        except tarfile.TarError as exc:  # a member out of dest, a link out, a device node, or no tar at all
            raise UnsafeArchiveError(f"refusing to unpack the stored tar into {str(dest)!r}: {exc}; nothing was "
                                     f"extracted (the store holds a tar the farm never writes)") from None
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


class ArtifactStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)  # the farm keeps its store at <data dir>/artifacts
        self.blobs = self.root / "sha256"
        self.tmp = self.root / "tmp"
        self.refs = self.root / "refs"
        self._pins = pins.Pins(self.root / "pins")

    def close(self) -> None:
        """Drop this store's pins: what it put is kept from then on only if something refers to it."""
        self._pins.close()

    @contextlib.contextmanager
    def _gc_lock(self, mode: int) -> Iterator[None]:
        """``fcntl.LOCK_SH`` for a put, ``LOCK_EX`` for a gc (one descriptor per holder: threads too)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "gc.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def path(self, sha256: str) -> Path:
        check_sha(sha256)
        return self.blobs / sha256[:2] / sha256[2:]

    def has(self, sha256: str) -> bool:
        """Whether a blob is here *and* its content still hashes to its name (a cache hit is trusted only after
        its digest is checked, as ccache and Bazel do). A corrupt blob is moved aside (``_evict``), so the caller
        rebuilds it."""
        blob = self.path(sha256)
        if not blob.is_file():
            return False
        actual = self._hash_file(blob)
        if actual != sha256:
            self._evict(sha256, actual)
            return False
        return True

    def _evict(self, sha256: str, actual: str) -> None:
        """Move a corrupt blob aside to ``<root>/quarantine/<sha256>.<what it hashes to>``: out of the store (a
        miss, so it is rebuilt), never destroyed (gc never walks quarantine/; a person removes the evidence)."""
        aside = self.root / "quarantine" / f"{sha256}.{actual}"
        try:
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path(sha256), aside)
        except FileNotFoundError:  # moved or replaced by another process since it was hashed
            return
        log.warning("artifact sha256:%s is corrupt (content hashes to %s): moved aside to %s, it will be rebuilt",
                    sha256, actual, aside)

    def ref(self, sha256: str, kind: ArtifactKind, packing: Packing) -> ArtifactRef:
        """The reference of a stored blob (for a cache hit); MissingArtifactError if it is not here."""
        blob = self.path(sha256)
        if not blob.is_file():
            raise MissingArtifactError(f"artifact sha256:{sha256} is not in the store {str(self.root)!r}")
        return ArtifactRef(sha256, blob.stat().st_size, kind, packing)

    # writing ------------------------------------------------------------------------------------------------------
    def put(self, src: Path | str | bytes, kind: ArtifactKind | str = ArtifactKind.OTHER) -> ArtifactRef:
        """Store a file, a directory (as a deterministic tar) or bytes; returns its reference."""
        try:
            kind = ArtifactKind(kind)
        except ValueError:
            raise ConfigurationError(f"unknown artifact kind {kind!r}; valid: {', '.join(ArtifactKind)}") from None
        self.tmp.mkdir(parents=True, exist_ok=True)
        tmp, lock = new_file(self.tmp, "put-")  # gc leaves it alone while this put runs
        try:
            with open(tmp, "wb") as out:
                packing = self._write(src, out)
                out.flush()
                os.fsync(out.fileno())
            sha = self._hash_file(tmp)
            size = tmp.stat().st_size
            dest = self.path(sha)
            with self._gc_lock(fcntl.LOCK_SH):  # no gc between the check and the pin
                self._pins.add(sha)
                stored = self._hash_file(dest) if dest.is_file() else None
                if stored == sha:
                    os.utime(dest)  # deduplicated: refresh its age so gc spares the new reference
                else:
                    if stored is not None:  # the stored copy rotted: kept aside, the verified new one replaces it
                        self._evict(sha, stored)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.chmod(tmp, 0o444)
                    os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
            release(lock)
        return ArtifactRef(sha, size, kind, packing)

    @staticmethod
    def _write(src: Path | str | bytes, out: BinaryIO) -> Packing:
        if isinstance(src, bytes | bytearray | memoryview):
            out.write(src)
            return Packing.FILE
        path = Path(src)
        if path.is_dir():
            _tar_dir(path, out)
            return Packing.TAR
        if not path.is_file():
            raise ConfigurationError(f"cannot store {str(path)!r}: no such file or directory")
        with path.open("rb") as f:
            shutil.copyfileobj(f, out, _CHUNK)
        return Packing.FILE

    @staticmethod
    def _hash_file(path: Path) -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    # reading (always verified) ------------------------------------------------------------------------------------
    def _verified_copy(self, sha256: str, out: BinaryIO) -> None:
        blob = self.path(sha256)
        if not blob.is_file():
            raise MissingArtifactError(f"no artifact sha256:{sha256} in store {str(self.root)!r}")
        h = hashlib.sha256()
        with blob.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise CorruptArtifactError(
                f"artifact sha256:{sha256} at {str(blob)!r} is corrupt (content hashes to {h.hexdigest()}); "
                "not served; the next cache lookup evicts it and its stage runs again"
            )

    def read_bytes(self, sha256: str) -> bytes:
        buf = io.BytesIO()
        self._verified_copy(sha256, buf)
        return buf.getvalue()

    def get_file(self, sha256: str, dest: Path | str) -> Path:
        """Copy a blob to ``dest`` (atomically: nothing is written at ``dest`` unless it verifies)."""
        dest = Path(dest)
        with atomic_output(dest) as out:
            self._verified_copy(sha256, out)
        return dest

    def extract(self, sha256: str, dest: Path | str) -> Path:
        """Restore a directory stored with ``put(dir)`` into ``dest`` (which must not exist yet)."""
        dest = new_extract_dest(dest)
        with tempfile.TemporaryFile() as tf:
            self._verified_copy(sha256, tf)  # type: ignore[arg-type]
            tf.seek(0)
            return untar(tf, dest)  # type: ignore[arg-type]

    # names ----------------------------------------------------------------------------------------------------------
    def set_ref(self, name: str, sha256: str, keeps: Collection[str] = ()) -> None:
        """Name the stored blob ``sha256`` (and keep ``keeps`` from gc while the name stands); replaces the name's
        earlier blob. Every blob must be here (MissingArtifactError otherwise)."""
        path = self.refs / check_ref_name(name)
        record = ref_record(sha256, keeps)
        with self._gc_lock(fcntl.LOCK_SH):  # a gc sees the blobs and their name together, or neither
            for sha in {sha256, *keeps}:
                self.ref(sha, ArtifactKind.OTHER, Packing.FILE)
            with atomic_output(path) as out:
                out.write(record)

    def get_ref(self, name: str) -> str | None:
        """The blob ``name`` names, or None when no such name is set."""
        path = self.refs / check_ref_name(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_ref(name, data, repr(str(self.root)))[0]

    def _named(self) -> set[str]:
        """Every blob a name names or keeps."""
        named: set[str] = set()
        if self.refs.is_dir():
            for path in sorted(self.refs.rglob("*")):
                if path.is_file() and not path.name.startswith("."):
                    sha, keeps = parse_ref(path.relative_to(self.refs).as_posix(), path.read_bytes(),
                                           repr(str(self.root)))
                    named.update([sha, *keeps])
        return named

    # maintenance --------------------------------------------------------------------------------------------------
    def list(self) -> Iterator[str]:
        if not self.blobs.is_dir():
            return
        for sub in sorted(self.blobs.iterdir()):
            for blob in sorted(sub.iterdir()):
                name = sub.name + blob.name
                if SHA256_RE.fullmatch(name):
                    yield name

    def verify(self) -> Shas:
        """The sha256 of every corrupt blob (content no longer matches its name)."""
        return [sha for sha in self.list() if self._hash_file(self.path(sha)) != sha]

    def gc(self, referenced: Collection[str] | Callable[[], Collection[str]], older_than_s: float) -> Shas:
        """Remove blobs not in ``referenced`` whose last put is older than ``older_than_s`` (and stale temp
        files of puts no longer running); returns the removed sha256s. Referenced, named (``set_ref``), pinned
        (put by a store still open) or young blobs are never removed. A function as ``referenced`` is read once
        puts are held off, so a reference recorded just before is seen."""
        if not (math.isfinite(older_than_s) and older_than_s >= 0):
            raise ConfigurationError(f"bad gc age {older_than_s!r}: need a finite number of seconds >= 0")
        removed: list[str] = []
        if not self.root.is_dir():  # nothing stored yet (and nothing made by looking)
            return removed
        with self._gc_lock(fcntl.LOCK_EX):
            keep = pins.live(self.root / "pins") | self._named()
            keep |= set(referenced() if callable(referenced) else referenced)
            cutoff = time.time() - older_than_s
            for sha in self.list():
                blob = self.path(sha)
                if sha in keep:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if blob.stat().st_mtime < cutoff:
                        blob.unlink()
                        removed.append(sha)
            remove_stale(self.tmp, "*", older_than_s)  # never a put still in progress (it holds its lock)
        return removed
