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

This module is the arithmetic and the verdict (standard library only: it also runs where the farm's packages are not
installed, e.g. ``benchmarks/bench_load_probe.py``); ``tasks.bench_probe`` runs the probes and reads the device's
history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OTHERS_SHARE_LIMIT = 0.25  # of the host's cores, taken by other processes during a round
BANDWIDTH_DROP_LIMIT = 0.8  # of the device's recent median copy bandwidth
BANDWIDTH_HISTORY = 7  # the device's recent median: of its last benchmarks not under load
MIN_BANDWIDTH_HISTORY = 3
COPY_METRICS = ("copy_gb_per_s_before", "copy_gb_per_s_after")  # each prefixed with the mode


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

