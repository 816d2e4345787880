"""The transport interface every device speaks, and the local-side halves of verified, atomic transfers.

Failure kinds (callers decide retries by kind, never by message):
- ``InfrastructureError`` (retryable): unreachable, authentication refused, connection lost, a transfer whose
  checksum does not match, the transport itself not answering in time.
- ``HostKeyError`` (a ConfigurationError, NOT retryable): the device's host key differs from the pinned one, or
  none is pinned. Either the device was reinstalled or someone is in the middle; a person must check and update
  the inventory. Retrying would only hammer a possibly hostile host.
- ``RemoteNameError`` (a ConfigurationError, NOT retryable): the device listed a name that is not a plain
  relative path in the fixed charset (``/`` tricks, ``..``, NUL, control characters), as OpenSSH's scp refuses
  since CVE-2019-6111. Our own ``edgellm`` writes only such names, so the device's tools are broken or hostile:
  a person must look at it; retrying (here or elsewhere) would hide that. Nothing is written outside the target.
- ``ConfigurationError``: a transfer's source does not exist.
- A command that ran and exited non-zero is not an exception: it is ``CommandResult.exit_code``.
  A command that ran past its ``timeout`` is killed (with its process group) and reported as
  ``exit_code=124, timed_out=True``.
"""

from __future__ import annotations

import abc
import hashlib
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from edgellm.errors import ConfigurationError

TIMEOUT_EXIT_CODE = 124  # as coreutils timeout(1)
_CHUNK = 1 << 20


class HostKeyError(ConfigurationError):
    """The device's host key is not the pinned one (or none is pinned). Security/configuration: not retried."""


class RemoteNameError(ConfigurationError):
    """A device listed an unsafe file name. Security/configuration: not retried."""


# One path component: printable ASCII but '/' and '\\' (no separators, NUL, control or terminal characters;
# no backslash, which sha256sum would escape). Quotes and spaces are harmless: argv is always shlex-quoted.
_NAME_PART = re.compile(r"[\x20-\x2e\x30-\x5b\x5d-\x7e]{1,255}\Z")
MAX_REMOTE_PATH = 1024


def check_remote_name(rel: str, *, where: str) -> str:
    """``rel`` (a relative POSIX path a device reported) if every component is a plain name, else RemoteNameError."""
    parts = rel.split("/")
    plain = all(_NAME_PART.match(part) and part not in (".", "..") for part in parts)
    if len(rel) > MAX_REMOTE_PATH or not plain:
        raise RemoteNameError(
            f"{where}: refusing the remote name {rel!r}: each '/'-separated part must be printable ASCII "
            f"without '\\', and not '.' or '..' (no absolute path, NUL or control characters), "
            f"at most {MAX_REMOTE_PATH} characters in all"
        )
    return rel


def inside(root: Path, rel: str) -> Path:
    """``root / rel``, verified (after resolving symlinks) to stay under ``root``."""
    target = root / rel
    if not target.resolve().is_relative_to(root.resolve()):
        raise RemoteNameError(f"{rel!r} resolves to {target.resolve()}, outside {root}")
    return target


@dataclass
class TransferCounts:
    """Bytes and files moved to (put) and from (get) one device; ``got_names`` counts the base names fetched (so a
    run can show that no engine file came back)."""

    put_files: int = 0
    put_bytes: int = 0
    get_files: int = 0
    get_bytes: int = 0
    got_names: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"put_files": self.put_files, "put_bytes": self.put_bytes, "get_files": self.get_files,
                "get_bytes": self.get_bytes, "got_names": dict(sorted(self.got_names.items()))}


_transfers: dict[str, TransferCounts] = {}
_transfers_lock = threading.Lock()


def count_transfer(device_id: str, direction: str, files: list[Path]) -> None:
    """Count a verified transfer of ``files`` (local paths: what was sent, or what arrived) for ``device_id``."""
    sizes = [f.stat().st_size for f in files]
    with _transfers_lock:
        counts = _transfers.setdefault(device_id, TransferCounts())
        if direction == "put":
            counts.put_files += len(files)
            counts.put_bytes += sum(sizes)
        else:
            counts.get_files += len(files)
            counts.get_bytes += sum(sizes)
            for f in files:
                counts.got_names[f.name] = counts.got_names.get(f.name, 0) + 1


def transfer_counts() -> dict[str, TransferCounts]:
    """This process's transfers so far, per device (a snapshot: a run reports the difference of two)."""
    with _transfers_lock:
        return {d: TransferCounts(c.put_files, c.put_bytes, c.get_files, c.get_bytes, dict(c.got_names))
                for d, c in _transfers.items()}


def transfers_since(before: dict[str, TransferCounts]) -> dict[str, TransferCounts]:
    """What moved since the snapshot ``before``, per device that moved anything."""
    out: dict[str, TransferCounts] = {}
    for device, now in transfer_counts().items():
        was = before.get(device, TransferCounts())
        names = {n: c - was.got_names.get(n, 0) for n, c in now.got_names.items() if c > was.got_names.get(n, 0)}
        diff = TransferCounts(now.put_files - was.put_files, now.put_bytes - was.put_bytes,
                              now.get_files - was.get_files, now.get_bytes - was.get_bytes, names)
        if diff.put_files or diff.get_files:
            out[device] = diff
    return out


# what a command's result keeps of each of its streams in memory: the first and the last half of this; the bytes
# between are counted, not kept (a device printing 400 MB costs the orchestrator 2 x 16 MiB). The log file, when
# the caller gives one, still receives everything.
MAX_KEPT_OUTPUT_BYTES = 16 << 20


class OutputBuffer:
    """One stream of a command's output as it arrives, bounded: its first ``limit // 2`` bytes and its last
    ``limit // 2`` bytes are kept; ``dropped`` counts the bytes between, which are not."""

    def __init__(self, limit: int = MAX_KEPT_OUTPUT_BYTES) -> None:
        if limit < 2:
            raise ValueError(f"an output limit must be at least 2 bytes, got {limit}")
        self.half = limit // 2
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._dropped = 0

    def extend(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(bytes(chunk))
        self._tail_bytes += len(chunk)
        while self._tail_bytes - len(self._tail[0]) >= self.half:  # whole chunks that fell out of the tail
            gone = len(self._tail.popleft())
            self._tail_bytes -= gone
            self._dropped += gone

    def _tail_kept(self) -> bytes:
        tail = b"".join(self._tail)
        return tail[len(tail) - self.half:] if len(tail) > self.half else tail

    @property
    def dropped(self) -> int:
        """How many bytes of the stream were not kept (0: all of it was)."""
        return self._dropped + max(0, self._tail_bytes - self.half)

    def text(self) -> str:
        """What was kept, decoded; where bytes were dropped a line says how many."""
        if not self.dropped:  # one stream: a character split between head and tail decodes whole
            return (bytes(self.head) + self._tail_kept()).decode(errors="replace")
        head = self.head.decode(errors="replace")
        return (f"{head}\n<<< {self.dropped} bytes dropped here: only the first and the last {self.half} bytes of "
                f"this output are kept >>>\n{self._tail_kept().decode(errors='replace')}")


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    duration: float  # seconds
    timed_out: bool = False
    stdout_dropped: int = 0  # bytes of stdout not kept (OutputBuffer: its first and last part are)
    stderr_dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Transport(abc.ABC):
    """Runs argument lists on a device and moves files/directories to and from it (sha256-verified, atomic)."""

    device_id: str

    @abc.abstractmethod
    def run(
        self,
        argv: list[str],
        *,
        timeout: float,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        """Run ``argv`` (never a shell string) in ``cwd`` (default: the device's work dir).

        ``log`` receives stdout and stderr as they arrive (appended). ``env`` adds variables.
        """

    @abc.abstractmethod
    def put(self, local_path: Path, remote_path: str) -> None:
        """Copy a file or directory to the device; the destination appears whole or not at all."""

    @abc.abstractmethod
    def get(self, remote_path: str, local_path: Path) -> None:
        """Copy a file or directory from the device; the destination appears whole or not at all."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Transport:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def check_argv(argv: list[str]) -> list[str]:
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError(f"argv must be a non-empty list of strings, got {argv!r}")
    return list(argv)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def temp_name(final: str) -> str:
    """A hidden sibling of ``final`` (same directory, so the rename is atomic)."""
    head, _, tail = final.rstrip("/").rpartition("/")
    name = f".{tail}.partial-{uuid.uuid4().hex[:12]}"
    return f"{head}/{name}" if head else name


def local_tree(root: Path) -> tuple[list[str], list[str]]:
    """(directories, files) under ``root`` as sorted POSIX relative paths; symlinks and specials refused."""
    dirs: list[str] = []
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                raise ConfigurationError(f"{path}: symbolic links are not transferred; copy the target instead")
            if path.is_dir():
                dirs.append(rel)
            elif path.is_file():
                files.append(rel)
            else:
                raise ConfigurationError(f"{path}: not a regular file or directory")
    return sorted(dirs), sorted(files)


def replace_local(tmp: Path, final: Path) -> None:
    """Move a verified ``tmp`` (file or directory) to ``final``, replacing what was there."""
    if final.exists() and (tmp.is_dir() or final.is_dir()):
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:12]}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        os.replace(tmp, final)


def remove_local(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def make_local_temp(final: Path, *, directory: bool) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.partial-"
    if directory:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, dir=final.parent)
    os.close(fd)
    return Path(name)
