"""The device-side artifact cache (``cache/<sha256>`` under a device's work dir), trusted only after a check.

A file entry is checked with ``sha256sum`` against its name. A directory entry (an unpacked tar: its own files
cannot re-make the tar's digest) is sealed with ``cache/<sha256>.sha256sums`` when it is made from verified
content, and checked against that list (every file, and no extra one) before each use. An entry that fails
its check (or has no seal) is evicted, so the caller stages it again instead of every later run failing on it.
What an upload left when it died with its orchestrator or its device (``.<sha>.partial-*``, which only the
transport that made it knew) is swept once it has not been written for ``STALE_PARTIAL_MIN`` minutes.
"""

from __future__ import annotations

import logging

from edgefarm.artifacts.kinds import Packing
from edgefarm.devices.transport import Transport
from edgellm.errors import InfrastructureError

log = logging.getLogger(__name__)

SUMS_SUFFIX = ".sha256sums"
CHECK_TIMEOUT_S = 3600.0
STALE_PARTIAL_MIN = 360  # an upload writes all the time: a partial untouched for 6 h is a dead upload's

# $1 = entry dir, $2 = its sums file relative to $1: every listed file matches, and no file is unlisted
_CHECK_DIR = (
    'cd -- "$1" && test -s "$2" && sha256sum --quiet --strict -c -- "$2" >/dev/null '
    '&& test "$(find . -type f | wc -l)" -eq "$(wc -l < "$2")"'
)
_SEAL_DIR = (
    'cd -- "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum -- > "$2.$$" '
    '&& mv -f -- "$2.$$" "$2"'
)
# $1 = cache dir, $2 = minutes: remove each partial in which nothing was written for that long; print its name
_SWEEP = (
    'cd -- "$1" 2>/dev/null || exit 0; for p in .*.partial-*; do [ -e "$p" ] || continue; '
    'if [ -z "$(find "$p" -mmin -"$2" -print | head -n 1)" ]; then rm -rf -- "$p" && echo "$p"; fi; done'
)


def entry(sha256: str) -> str:
    return f"cache/{sha256}"


def _sums(sha256: str) -> str:
    return f"{sha256}{SUMS_SUFFIX}"  # relative to the entry dir's parent, i.e. ../<sha>.sha256sums from inside


def usable(transport: Transport, sha256: str, packing: Packing) -> bool:
    """Whether ``cache/<sha256>`` is there and intact; a damaged entry is evicted (then False)."""
    remote = entry(sha256)
    if transport.run(["test", "-e", remote], timeout=60).exit_code != 0:
        return False
    if packing is Packing.TAR:
        check = transport.run(["sh", "-c", _CHECK_DIR, "sh", remote, f"../{_sums(sha256)}"], timeout=CHECK_TIMEOUT_S)
        ok = check.ok
    else:
        check = transport.run(["sha256sum", "--", remote], timeout=CHECK_TIMEOUT_S)
        ok = check.ok and check.stdout[:64] == sha256
    if ok:
        return True
    log.warning("%s: device cache entry %s failed its sha256 check (%s): evicted, staging it again",
                transport.device_id, remote, (check.stderr or check.stdout).strip()[:200] or "no seal")
    evict(transport, sha256)
    return False


def evict(transport: Transport, sha256: str) -> None:
    result = transport.run(["rm", "-rf", "--", entry(sha256), f"cache/{_sums(sha256)}"], timeout=600)
    if not result.ok:
        raise InfrastructureError(f"{transport.device_id}: cannot evict {entry(sha256)}: {result.stderr.strip()}")


def seal(transport: Transport, sha256: str, packing: Packing) -> None:
    """Record the per-file digests of a directory entry just made from verified content."""
    if packing is not Packing.TAR:
        return
    result = transport.run(["sh", "-c", _SEAL_DIR, "sh", entry(sha256), f"../{_sums(sha256)}"],
                           timeout=CHECK_TIMEOUT_S)
    if not result.ok:
        raise InfrastructureError(f"{transport.device_id}: cannot seal {entry(sha256)}: {result.stderr.strip()}")


def sweep_partials(transport: Transport, older_than_min: int = STALE_PARTIAL_MIN) -> list[str]:
    """Remove what dead uploads left in the device cache; returns the names removed."""
    result = transport.run(["sh", "-c", _SWEEP, "sh", "cache", str(older_than_min)], timeout=600)
    if not result.ok:  # housekeeping: never fails a stage
        log.warning("%s: sweeping dead uploads from cache/ failed: %s", transport.device_id,
                    result.stderr.strip()[:200])
        return []
    swept = result.stdout.split()
    if swept:
        log.info("%s: removed %d dead upload(s) from cache/: %s", transport.device_id, len(swept), ", ".join(swept))
    return swept
