"""The host gate: a benchmark on a device that shares its host with the farm runs while nothing else of the farm
runs on that host.

A host-wide reader/writer lock: every stage that works on this host (a host stage: quantize, export, reference; a
device stage on a device of this host) holds it *shared*, and a benchmark on a device of this host holds it
*exclusive* (``tasks.device_exec.run_stage``: after its device's lease, so every holder takes the two in the same
order). It is two ``flock`` files under ``<data dir>/host/gate/``, so separate processes on the host (two runs of
one data dir, a worker) respect it as threads do, and a holder that dies drops its hold with its descriptors:

- ``turnstile``: an exclusive entry taker holds it from the moment it starts waiting until it is done; a shared one
  passes through it (takes it and lets it go at once). So a waiting benchmark blocks new shared entries: a stream of
  short stages never starves it.
- ``rw``: held shared by the stages inside, exclusively by the benchmark once they drained.

The cost, by design: while a benchmark waits for a long host stage (a quantizer run) to drain, nothing new starts on
this host, and the benchmark's device stays leased to it; host stages and benchmarks of this host alternate instead of
overlapping. A host stage sent to another pool (``quantize_on``) still holds this host's gate shared while it waits
for that pool (``tasks.common`` cannot tell it apart): benchmarks here wait for it too.

Nested entries of one thread are no-ops (a shared entry inside a shared or an exclusive one); an exclusive entry
inside a shared one of the same thread would wait for itself, and is refused as a bug. Waiting is bounded
(``GATE_WAIT_S``); past it a :class:`HostGateTimeout` (an infrastructure error: retried) names who holds the gate.
Who holds it is written under ``holders/`` (one small file per hold, gone with it; a dead process's is ignored).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from edgefarm.devices.inventory import Device, TransportKind
from edgefarm.results.liveness import pid_alive
from edgellm.errors import BugError, InfrastructureError

GATE_WAIT_S = 6 * 3600.0  # as long as a device lease may wait: a busy host queues work, it is not an error
POLL_S = (0.01, 0.25)  # first and longest pause between attempts
SHARED, EXCLUSIVE = "shared", "exclusive"
_LOOPBACK = ("localhost", "localhost.localdomain", "127.0.0.1", "::1", "ip6-localhost")
_held = threading.local()  # directory -> (mode, depth) of this thread's hold


class HostGateTimeout(InfrastructureError):
    """The host gate did not open within the wait."""


def shares_host(device: Device) -> bool:
    """Whether ``device`` runs on the orchestrating host: a local device, or an ssh one whose host names this
    machine (loopback or its own host name)."""
    if device.transport is TransportKind.LOCAL:
        return True
    host = (device.host or "").strip("[]").lower()
    me = socket.gethostname().lower()
    return host in _LOOPBACK or host.startswith("127.") or host in (me, me.split(".")[0])


def gate_dir(data_dir: Path | str) -> Path:
    return Path(data_dir) / "host" / "gate"


class HostGate:
    """The gate of the host whose farm data dir holds ``directory`` (see the module doc)."""

    def __init__(self, directory: Path, *, wait_s: float | None = None) -> None:
        self.directory = Path(directory)
        self.wait_s = wait_s

    def shared(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Held while an ordinary stage works on this host."""
        return self._hold(SHARED, what)

    def exclusive(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Held while a benchmark on a device of this host runs: nothing else of the farm runs here meanwhile."""
        return self._hold(EXCLUSIVE, what)

    @contextlib.contextmanager
    def _hold(self, mode: str, what: str) -> Iterator[None]:
        key = str(self.directory.resolve())
        holds: dict[str, tuple[str, int]] = _held.__dict__.setdefault("holds", {})
        mine = holds.get(key)
        if mine is not None:
            if mode == EXCLUSIVE and mine[0] == SHARED:
                raise BugError(f"{what}: wants the host gate {self.directory} exclusive while this thread holds it "
                               f"shared (it would wait for itself)")
            holds[key] = (mine[0], mine[1] + 1)
            try:
                yield
            finally:
                holds[key] = mine
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            deadline = time.monotonic() + (GATE_WAIT_S if self.wait_s is None else self.wait_s)
            turnstile = stack.enter_context(self._open("turnstile"))
            self._lock(turnstile, fcntl.LOCK_EX, deadline, mode, what)
            rw = stack.enter_context(self._open("rw"))
            if mode == SHARED:
                try:
                    self._lock(rw, fcntl.LOCK_SH, deadline, mode, what)
                finally:
                    fcntl.flock(turnstile, fcntl.LOCK_UN)  # passed through: the next one may come
            else:
                self._lock(rw, fcntl.LOCK_EX, deadline, mode, what)  # the turnstile stays held: no new entries
            stack.enter_context(self._registered(mode, what))
            holds[key] = (mode, 1)
            try:
                yield
            finally:
                del holds[key]

    @contextlib.contextmanager
    def _open(self, name: str) -> Iterator[int]:
        fd = os.open(self.directory / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            yield fd
        finally:
            os.close(fd)  # drops its flock

    def _lock(self, fd: int, op: int, deadline: float, mode: str, what: str) -> None:
        pause = POLL_S[0]
        while True:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostGateTimeout(
                    f"host gate {self.directory}: {what} waited {self._waited(deadline):.0f} s to enter {mode} "
                    f"(a benchmark on a device of this host runs with nothing else of the farm beside it); held by: "
                    f"{self.holders() or 'no live process (the lock is held by one that wrote no record)'}")
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, POLL_S[1])

    def _waited(self, deadline: float) -> float:
        return (GATE_WAIT_S if self.wait_s is None else self.wait_s) + time.monotonic() - deadline

    @contextlib.contextmanager
    def _registered(self, mode: str, what: str) -> Iterator[None]:
        folder = self.directory / "holders"
        folder.mkdir(exist_ok=True)
        path = folder / f"{os.getpid()}-{secrets.token_hex(4)}.json"
        path.write_text(json.dumps({"mode": mode, "what": what[:300], "pid": os.getpid(), "since": time.time()}),
                        encoding="utf-8")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def holders(self) -> str:
        """Who holds the gate now (live processes' records), one ``what (mode, pid, for N s)`` each."""
        found = []
        for path in sorted((self.directory / "holders").glob("*.json")):
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
                pid = int(rec["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not pid_alive(pid):
                path.unlink(missing_ok=True)  # its process died; its flocks went with it
                continue
            found.append(f"{rec.get('what')} ({rec.get('mode')}, pid {pid}, for "
                         f"{time.time() - float(rec.get('since') or 0):.0f} s)")
        return "; ".join(found)
