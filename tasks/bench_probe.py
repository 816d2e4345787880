"""Running the load probe (``devices/load_probe.py``) around a benchmark command on its device, and the device's
recent copy bandwidth; what the figures mean and when a benchmark is under load: ``tasks.bench_load``."""

from __future__ import annotations

import resource
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.devices import agent_client, load_probe
from edgefarm.devices.inventory import Device, TransportKind
from edgefarm.devices.transport import Transport
from edgefarm.results.db import Engine
from edgefarm.results.regressions import recent_lowest
from edgefarm.tasks import device_cache
from edgefarm.tasks.bench_load import BANDWIDTH_HISTORY, COPY_METRICS, MIN_BANDWIDTH_HISTORY
from edgefarm.tasks.farm import Farm
from edgellm.errors import InfrastructureError

PROBE_FILE = Path(load_probe.__file__).resolve()
PROBE_TIMEOUT_S = 120.0


def probe_ref(farm: Farm) -> ArtifactRef:
    """The probe in the store: staged into the device's cache like any input (verified, reused)."""
    return farm.store.put(PROBE_FILE, ArtifactKind.OTHER)


def run_probe(device: Device, transport: Transport, probe: ArtifactRef) -> dict[str, Any]:
    """Run the staged probe on ``device``; its JSON. A probe that cannot run there is the device's problem."""
    result = transport.run([device.interpreter, "-I", "-S", device_cache.entry(probe.sha256)],
                           timeout=PROBE_TIMEOUT_S)
    what = f"{device.id}: load probe"
    if not result.ok:
        tail = (result.stderr.strip().splitlines() or [""])[-1][:300]
        raise InfrastructureError(f"{what} exited {result.exit_code}: {tail}")
    return agent_client.json_object(what, result.stdout)


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@dataclass
class LoadRound:
    """The probes around one benchmark command (made again when the stage moves to another device)."""

    probe: ArtifactRef
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    own_cpu_s: float | None = None  # the command's CPU time (and the snapshots'), on a local device
    _children: float | None = field(default=None, repr=False)

    def start(self, device: Device, transport: Transport) -> None:
        """Just before the command (the stage's argv callback)."""
        self.before, self.after, self.own_cpu_s = run_probe(device, transport, self.probe), None, None
        self._children = _children_cpu_s() if device.transport is TransportKind.LOCAL else None

    def end(self, device: Device, transport: Transport) -> None:
        """Just after the command (run_stage's ``after``, still in the lease)."""
        if self._children is not None:
            self.own_cpu_s = _children_cpu_s() - self._children
        self.after = run_probe(device, transport, self.probe)


def recent_copy_median(engine: Engine, device_id: str) -> float | None:
    """The median of the lowest copy bandwidth of the device's last ``BANDWIDTH_HISTORY`` passing benchmarks not
    under load (None with fewer than ``MIN_BANDWIDTH_HISTORY``)."""
    names = [f"{m}_{c}" for m in ("prefill", "decode") for c in COPY_METRICS]
    lowest = recent_lowest(engine, device_id, names, BANDWIDTH_HISTORY)
    return statistics.median(lowest) if len(lowest) >= MIN_BANDWIDTH_HISTORY else None
