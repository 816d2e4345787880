"""Which processes this process can ask about: a pid means something only in its own pid space.

A host name is no machine's identity (two machines, or two containers, may share one on one results database), so
a run and a lease name their orchestrator as ``<host name>#<machine key>``: the key digests ``/etc/machine-id``,
this boot's id and the pid namespace, the space a pid lives in. Only a process of the same key can be asked whether
it lives (``process_gone``); of any other, or of a record without a key (written by an older edgefarm), only a
missed heartbeat says it died.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from pathlib import Path

_IDENTITY_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/random/boot_id")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")[:200].strip()
    except OSError:
        return ""


@functools.cache
def machine_key() -> str | None:
    """16 hex digits naming this machine's boot and pid namespace; None where none of them can be read."""
    parts = [_read(p) for p in _IDENTITY_FILES]
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        parts.append("")
    if not any(parts):
        return None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def this_host() -> str:
    """How a run or lease of this process names its host: ``<host name>#<machine key>`` (at most 200 chars)."""
    key = machine_key()
    return f"{socket.gethostname()[:180]}#{key}" if key else socket.gethostname()[:200]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_gone(host: str | None, pid: int | None) -> bool:
    """Whether process ``pid`` of ``host`` (as ``this_host`` wrote it) is known to be gone: only processes of this
    machine key can be asked (never this process itself); anything else may live, whatever its host name."""
    key = machine_key()
    if not host or key is None or pid is None or pid == os.getpid():
        return False
    _, sep, theirs = host.rpartition("#")
    return bool(sep) and theirs == key and not pid_alive(pid)
