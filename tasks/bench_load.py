"""The load around each benchmark command, and when a benchmark counts as taken *under load* (defined here, once).

Just before and just after each benchmark command, in the same device lease (and host gate: ``tasks.host_gate``),
the farm runs its own probe there (``devices/load_probe.py``: standard-library Python pushed like the agent, so it
runs beside any toolchain's tools): the host's load average, ``/proc/stat``'s CPU jiffies, and a short copy-bandwidth
measurement. From a pair of probes this module makes the round's figures:

- ``load1`` before and after (``os.getloadavg()[0]``) and the host's CPU count;
- ``copy_gb_per_s`` before and after (bytes read + written per second of the probe's copy, in GB/s);
- ``others_cores``: CPU time other processes took during the round, in cores. Between the two probes the host's busy
  jiffies say how much CPU everything took; on a local device the command's own share is known exactly (this
  process's waited-for children: the command, the environment snapshots around it, nothing else runs here under the
  host gate) and is subtracted. On a remote device the command's share is unknown, so the figure is what others took
  while each probe ran (its busy jiffies minus its own CPU time), the larger of the two.

A benchmark is **under load** when, in any of its rounds, other processes took more than ``OTHERS_SHARE_LIMIT`` of
the host's cores, or the copy bandwidth (the lower of before and after) fell below ``BANDWIDTH_DROP_LIMIT`` of the
device's recent median (its last ``BANDWIDTH_HISTORY`` benchmarks not under load; judged once it has
``MIN_BANDWIDTH_HISTORY``). The load average is recorded but not judged: a one-minute average still carries the
stages that drained just before (the gate makes them finish first), so it would mark a quiet host as loaded. A result
under load carries the ``results.regressions.UNDER_LOAD_METRIC`` marker (1; 0 otherwise) and says so in its reason:
it is kept out of regression baselines and never judged itself (``results/regressions.py``).
"""

from __future__ import annotations

import json
import resource
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from artifacts.kinds import ArtifactKind
from artifacts.store import ArtifactRef
from devices import load_probe
from devices.inventory import Device, TransportKind
from devices.transport import Transport
from edgellm.errors import InfrastructureError
from results.models import Metric, Result, ResultStatus
from results.regressions import UNDER_LOAD_METRIC
from stages import Stage
from tasks import device_cache
from tasks.farm import Farm

OTHERS_SHARE_LIMIT = 0.25  # of the host's cores, taken by other processes during a round
BANDWIDTH_DROP_LIMIT = 0.8  # of the device's recent median copy bandwidth
BANDWIDTH_HISTORY = 7
MIN_BANDWIDTH_HISTORY = 3
PROBE_FILE = Path(load_probe.__file__).resolve()
PROBE_TIMEOUT_S = 120.0
COPY_METRICS = ("copy_gb_per_s_before", "copy_gb_per_s_after")  # each prefixed with the mode


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
    try:
        data = json.loads(result.stdout)
    except ValueError:
        raise InfrastructureError(f"{what} printed no JSON: {result.stdout[:200]!r}") from None
    if not isinstance(data, dict):
        raise InfrastructureError(f"{what} printed {type(data).__name__}, not a JSON object")
    return data


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


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _jiffies(probe: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    pair = probe.get(key)
    if isinstance(pair, list) and len(pair) == 2 and all(_number(v) is not None for v in pair):
        return float(pair[0]), float(pair[1])
    return None


def _window_others(probe: Mapping[str, Any]) -> float | None:
    others, window = _number(probe.get("others_cpu_s")), _number(probe.get("window_s"))
    return others / window if others is not None and window else None


def round_figures(before: Mapping[str, Any], after: Mapping[str, Any], own_cpu_s: float | None) -> dict[str, Any]:
    """The round's figures from its two probes (see the module doc); None where a probe could not read one."""
    cpus = _number(before.get("cpus")) or _number(after.get("cpus"))
    hz = _number(before.get("hz")) or 100.0
    out: dict[str, Any] = {"cpus": int(cpus) if cpus else None}
    for when, probe in (("before", before), ("after", after)):
        load = probe.get("loadavg")
        out[f"load1_{when}"] = _number(load[0]) if isinstance(load, list) and load else None
        copy = _number(probe.get("copy_bytes_per_s"))
        out[f"copy_gb_per_s_{when}"] = copy / 1e9 if copy is not None else None
    start, end = _jiffies(before, "stat_end"), _jiffies(after, "stat_start")
    busy = wall = None
    if start is not None and end is not None and cpus:
        busy, wall = (end[0] - start[0]) / hz, (end[1] - start[1]) / hz / cpus
    out["round_s"] = wall
    out["busy_cores"] = busy / wall if busy is not None and wall else None
    out["own_cpu_s"] = own_cpu_s
    if busy is not None and wall and own_cpu_s is not None:
        out["others_cores"], out["others_during"] = max(0.0, busy - own_cpu_s) / wall, "round"
    else:
        windows = [x for x in (_window_others(before), _window_others(after)) if x is not None]
        out["others_cores"], out["others_during"] = (max(windows) if windows else None), "probes"
    return out


def metrics(mode: str, figures: Mapping[str, Any]) -> dict[str, tuple[float, str]]:
    """A round's figures as metrics of the bench result (prefixed with the mode, like its temperatures)."""
    named = {"host_load1_before": ("load1_before", ""), "host_load1_after": ("load1_after", ""),
             "copy_gb_per_s_before": ("copy_gb_per_s_before", "GB/s"),
             "copy_gb_per_s_after": ("copy_gb_per_s_after", "GB/s"), "others_cpu_cores": ("others_cores", "cores")}
    return {f"{mode}_{name}": (float(figures[key]), unit) for name, (key, unit) in named.items()
            if _number(figures.get(key)) is not None}


def lowest_copy(figures: Mapping[str, Any]) -> float | None:
    found = [v for v in (_number(figures.get(k)) for k in ("copy_gb_per_s_before", "copy_gb_per_s_after"))
             if v is not None]
    return min(found) if found else None


def recent_copy_median(engine: Engine, device_id: str) -> float | None:
    """The median of the lowest copy bandwidth of the device's last ``BANDWIDTH_HISTORY`` passing benchmarks not
    under load (None with fewer than ``MIN_BANDWIDTH_HISTORY``)."""
    loaded = select(Metric.result_id).where(Metric.name == UNDER_LOAD_METRIC, Metric.value >= 0.5)
    recent = (select(Result.id).where(Result.device == device_id, Result.stage == Stage.BENCH,
                                      Result.status == ResultStatus.PASS, Result.id.not_in(loaded))
              .order_by(Result.id.desc()).limit(BANDWIDTH_HISTORY).subquery())
    names = [f"{m}_{c}" for m in ("prefill", "decode") for c in COPY_METRICS]
    lowest: dict[int, float] = {}
    with engine.connect() as conn:
        for rid, value in conn.execute(select(Metric.result_id, Metric.value)
                                       .where(Metric.result_id.in_(select(recent.c.id)), Metric.name.in_(names))):
            lowest[rid] = min(value, lowest.get(rid, value))
    return statistics.median(lowest.values()) if len(lowest) >= MIN_BANDWIDTH_HISTORY else None


def under_load(rounds: Sequence[tuple[str, Mapping[str, Any]]], copy_median: float | None) -> str | None:
    """Why a benchmark of these rounds (mode, figures) was taken under load, or None (see the module doc)."""
    why = []
    for mode, fig in rounds:
        others, cpus = _number(fig.get("others_cores")), _number(fig.get("cpus"))
        if others is not None and cpus and others > OTHERS_SHARE_LIMIT * cpus:
            during = "during the" if fig.get("others_during") == "round" else "around the"
            why.append(f"other processes took {others:.2f} of {cpus:.0f} cores {during} {mode} round (limit "
                       f"{OTHERS_SHARE_LIMIT:.0%} of the cores)")
        copy = lowest_copy(fig)
        if copy is not None and copy_median is not None and copy < BANDWIDTH_DROP_LIMIT * copy_median:
            why.append(f"copy bandwidth {copy:.1f} GB/s in the {mode} round, {copy / copy_median:.0%} of the "
                       f"device's recent median {copy_median:.1f} GB/s (limit {BANDWIDTH_DROP_LIMIT:.0%})")
    return "; ".join(why) or None
