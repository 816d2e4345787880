"""Whether a CPU engine's intra-op threads spin, chosen from the host's CPU contention measured when it opens.

A spinning thread pool polls for the next parallel section instead of sleeping: on an idle host that saves the
wake-ups between a decode step's GEMMs, on a busy one it burns the CPU time the decode (and the other tenants) need
(edgellm.backends.ort says by how much). ``"auto"`` spins only while the host has an idle CPU for every intra-op
thread; ``True`` / ``False`` decide without measuring.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError

SPINNING_SETTINGS: tuple[bool | str, ...] = (True, False, "auto")
PROC_STAT = Path("/proc/stat")
# 100 ms: /proc/stat counts in ticks of 10 ms per CPU, so the busy CPUs it gives are known to 0.1 CPU; the sample
# costs the session open 0.1 s (opening a model's session takes longer).
SAMPLE_S = 0.1
# How far below one idle CPU per thread still counts as idle: an otherwise idle host's daemons and interpreter
# threads, and one tick of the sample's resolution each way (0.2 CPU), stay under it; any competing job that keeps a
# process runnable (even half of one CPU) exceeds it, and then a spinning pool's polling takes the time slices that
# job and the decode's own threads need (1.5-2.5x slower decode measured), a worse loss than not spinning idle.
IDLE_TOLERANCE_CPUS = 0.25
# Sessions opened in a row (a run's engines, a layer-by-layer comparison) share one sample taken within this long:
# the host's load over seconds is what the choice is about, and a sample per open would add 0.1 s to each.
REUSE_S = 5.0
_recent: dict[str, tuple[float, Contention | None]] = {}
_recent_lock = threading.Lock()


@dataclass(frozen=True)
class Contention:
    """The host's CPU load over a short sample: ``busy_cpus`` of its ``host_cpus`` kept busy by other processes
    (this process's own CPU time taken out), of which this process may use ``usable_cpus`` (its affinity)."""

    host_cpus: int
    usable_cpus: int
    busy_cpus: float
    source: str  # "/proc/stat" or "loadavg 1m"
    sample_s: float | None = None

    @property
    def idle_cpus(self) -> float:
        return max(0.0, min(float(self.usable_cpus), self.host_cpus - self.busy_cpus))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "idle_cpus": round(self.idle_cpus, 3), "busy_cpus": round(self.busy_cpus, 3)}


@dataclass(frozen=True)
class SpinChoice:
    """What ``choose_spinning`` decided, from what (``contention`` is None unless the setting was "auto")."""

    setting: bool | str
    spinning: bool
    reason: str
    contention: Contention | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "spinning": self.spinning, "reason": self.reason,
                "contention": self.contention.as_dict() if self.contention is not None else None}


def choose_spinning(setting: bool | str, threads: int,
                    measure: Callable[[], Contention | None] | None = None) -> SpinChoice:
    """The one place the intra-op spinning of a session is decided: ``True`` / ``False`` as given; ``"auto"``
    spins when the host has at least ``threads`` idle CPUs (less ``IDLE_TOLERANCE_CPUS``), measured by ``measure``
    (default ``measure_contention``). Decided once, at session open: ONNX Runtime fixes spinning when it creates
    the session's thread pool, so a long decode keeps the choice while the host's load changes; another choice
    needs another session (seconds to open for a large engine: not worth redoing per generation)."""
    if setting is True or setting is False:
        return SpinChoice(setting, setting, "explicit")
    if not isinstance(setting, str) or setting != "auto":
        valid = ", ".join(repr(s) for s in SPINNING_SETTINGS)
        raise ConfigurationError(f"intra_op_spinning {setting!r}: must be one of {valid}")
    contention = (measure or recent_contention)()
    if contention is None:
        return SpinChoice(setting, False, "the host's CPU load cannot be measured here: not spinning")
    spinning = contention.idle_cpus >= threads - IDLE_TOLERANCE_CPUS
    reason = (f"{contention.idle_cpus:.2f} idle CPUs {'>=' if spinning else '<'} {threads} intra-op threads "
              f"- {IDLE_TOLERANCE_CPUS} ({contention.source})")
    return SpinChoice(setting, spinning, reason, contention)


def recent_contention() -> Contention | None:
    """``measure_contention()``, or the one this process took less than ``REUSE_S`` ago."""
    with _recent_lock:
        taken = _recent.get("last")
        if taken is not None and time.monotonic() - taken[0] < REUSE_S:
            return taken[1]
        contention = measure_contention()
        _recent["last"] = (time.monotonic(), contention)
        return contention


def measure_contention(sample_s: float = SAMPLE_S, stat: Path = PROC_STAT) -> Contention | None:
    """The host's busy CPUs over ``sample_s`` from ``stat`` (/proc/stat), less this process's own CPU time; where
    it is missing, the 1-minute load average (which counts this process when it runs); None where neither is."""
    try:
        before = stat.read_text()
        _jiffies(before)
    except (OSError, ValueError):
        return _from_loadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(sample_s)
    after = stat.read_text()
    wall, own = time.perf_counter() - t0, time.process_time() - c0
    return contention_from_stat(before, after, own_cpu_s=own, wall_s=wall, usable_cpus=_usable_cpus())


def contention_from_stat(before: str, after: str, *, own_cpu_s: float, wall_s: float,
                         usable_cpus: int | None = None) -> Contention | None:
    """Two /proc/stat samples ``wall_s`` apart, this process having used ``own_cpu_s`` between them (None when no
    tick passed between them)."""
    (busy0, total0), (busy1, total1) = _jiffies(before), _jiffies(after)
    host = sum(1 for ln in after.splitlines() if ln.startswith("cpu") and ln[3:4].isdigit()) or 1
    if total1 <= total0:
        return None
    busy = host * (busy1 - busy0) / (total1 - total0) - (own_cpu_s / wall_s if wall_s > 0 else 0.0)
    return Contention(host, usable_cpus or host, max(0.0, busy), "/proc/stat", round(wall_s, 4))


def _jiffies(stat_text: str) -> tuple[int, int]:
    """(busy, total) ticks of all CPUs from /proc/stat's first line: user nice system idle iowait irq softirq steal
    (guest and guest_nice are already counted in user and nice)."""
    line = stat_text.split("\n", 1)[0].split()
    if len(line) < 5 or line[0] != "cpu":
        raise ValueError(f"/proc/stat does not start with the all-CPU line: {stat_text[:80]!r}")
    ticks = [int(x) for x in line[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _from_loadavg() -> Contention | None:
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    host = os.cpu_count() or 1
    return Contention(host, _usable_cpus(), min(float(host), load), "loadavg 1m")
