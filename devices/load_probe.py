"""The load and memory-bandwidth probe the farm runs on a device just before and just after each benchmark command
(``tasks/bench_load.py``): ``python3 -I -S load_probe.py [--copy-mib N] [--window-s S]``. Standard library only,
Python 3.8+ (it is pushed into the device's cache like the agent, never installed; any toolchain's device has it).

It prints one JSON object:
- ``loadavg``: ``os.getloadavg()`` (1, 5, 15 minutes) and ``cpus`` (the online CPUs ``/proc/stat`` lists);
- ``stat_start``/``stat_end``: ``[busy, total]`` jiffies of all CPUs from ``/proc/stat`` when it started and ended
  (``hz`` of them a second), so the farm can tell how busy the host was between two probes;
- ``copy_bytes_per_s``: the best of ``ROUNDS`` single-threaded copies of a ``--copy-mib`` buffer (bytes read +
  written per second: memcpy through ``memoryview`` slices), a memory-bandwidth probe;
- ``others_cpu_s`` over ``window_s``: CPU time the host spent on other processes while the probe ran (busy jiffies
  minus its own CPU time), ``--window-s`` long at least (it sleeps out the rest).
What cannot be read (no ``/proc/stat``, no load average) is null.
"""

import argparse
import json
import os
import sys
import time

ROUNDS = 5


def cpu_jiffies():
    """(busy, total) jiffies of all CPUs and how many CPUs, from /proc/stat; None when unreadable."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if not lines or not lines[0].startswith("cpu "):
        return None
    values = [int(v) for v in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(values) - idle, sum(values), cpus


def copy_bandwidth(nbytes):
    src = bytearray(b"\xa5") * nbytes  # every page written: a fresh zeroed buffer would read one shared zero page
    dst = bytearray(src)
    s, d = memoryview(src), memoryview(dst)
    best = 0.0
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        d[:] = s
        dt = time.perf_counter() - t0
        if dt > 0:
            best = max(best, 2.0 * nbytes / dt)
    return best


def main(argv):
    p = argparse.ArgumentParser(prog="load_probe")
    p.add_argument("--copy-mib", type=int, default=64)
    p.add_argument("--window-s", type=float, default=0.25)
    args = p.parse_args(argv)
    if not 1 <= args.copy_mib <= 4096 or not 0 <= args.window_s <= 60:
        sys.stderr.write(f"load_probe: --copy-mib must be 1..4096 and --window-s 0..60, got {args.copy_mib!r} "
                         f"and {args.window_s!r}\n")
        return 2
    t0 = time.monotonic()
    own0 = os.times()
    start = cpu_jiffies()
    try:
        loadavg = list(os.getloadavg())
    except OSError:
        loadavg = None
    bandwidth = copy_bandwidth(args.copy_mib * 2**20)
    left = args.window_s - (time.monotonic() - t0)
    if left > 0:
        time.sleep(left)
    end = cpu_jiffies()
    own1 = os.times()
    window = time.monotonic() - t0
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    own = (own1.user - own0.user) + (own1.system - own0.system)
    others = None
    if start is not None and end is not None:
        others = max(0.0, (end[0] - start[0]) / hz - own)
    report = {"loadavg": loadavg, "cpus": start[2] if start else os.cpu_count(), "hz": hz,
              "stat_start": list(start[:2]) if start else None, "stat_end": list(end[:2]) if end else None,
              "copy_bytes": args.copy_mib * 2**20, "copy_bytes_per_s": bandwidth, "window_s": window,
              "own_cpu_s": own, "others_cpu_s": others}
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
