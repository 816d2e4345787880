"""Does the benchmark load probe (devices/load_probe.py, read by tasks/bench_load.py) see load that is really there?

A stand-in "benchmark" command (one core busy for ``--busy-s``) runs on a local device between the probes, as the
bench stage runs it, in three interleaved scenarios: nothing added; one extra busy process beside it (pure Python
spin: one core); a memory hog beside it (a process copying 256 MiB buffers in a loop). Reported per scenario: the
CPU other processes took during the round (``others_cores``, the command's own CPU time subtracted), the copy
bandwidth the probe measured, and the one-minute load. Compared within this run, as differences and ratios to the
"nothing added" scenario (the machine this runs on is shared, so absolute figures carry its background load).

Targets: one injected busy process shows as +1 core of others (0.7..1.3); the under-load verdict
(``tasks.bench_load.under_load``) marks every round with a busy process added; the memory hog lowers the copy probe
(median ratio < 1; whether it crosses the 80 % threshold is reported, not required).

    python benchmarks/bench_load_probe.py [--rounds 3] [--busy-s 1.5]   (writes benchmarks/results/load_probe.json)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from artifacts.kinds import ArtifactKind  # noqa: E402
from artifacts.store import ArtifactRef  # noqa: E402
from devices.inventory import Device  # noqa: E402
from devices.transport import open_transport  # noqa: E402
from tasks import bench_load  # noqa: E402

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"
HOG = ("b = bytearray(b'x') * (256 << 20)\nc = bytearray(len(b))\nm, n = memoryview(b), memoryview(c)\n"
       "while True: n[:] = m\n")
FOREVER = "while True: pass\n"


def one_round(device: Device, probe: ArtifactRef, busy_s: float, beside: str | None) -> dict[str, Any]:
    helper = subprocess.Popen([sys.executable, "-c", beside]) if beside else None
    try:
        if helper is not None:
            time.sleep(0.5)  # running before the first probe, as another process's work would be
        with open_transport(device) as transport:
            load = bench_load.LoadRound(probe)
            load.start(device, transport)
            result = transport.run([sys.executable, "-c", SPIN.format(s=busy_s)], timeout=60)
            assert result.ok, result.stderr
            load.end(device, transport)
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
    assert load.before is not None and load.after is not None
    fig = bench_load.round_figures(load.before, load.after, load.own_cpu_s)
    fig["under_load"] = bench_load.under_load([("bench", fig)], None)
    return fig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--busy-s", type=float, default=1.5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "load_probe.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="load-probe-"))
    try:
        sha = hashlib.sha256(bench_load.PROBE_FILE.read_bytes()).hexdigest()
        (work / "cache").mkdir()
        shutil.copy(bench_load.PROBE_FILE, work / "cache" / sha)
        probe = ArtifactRef(sha, bench_load.PROBE_FILE.stat().st_size, ArtifactKind.OTHER)
        device = Device(id="local-probe", type="x86-cpu", transport="local", work_dir=str(work))
        scenarios = {"nothing added": None, "one busy process": FOREVER, "memory hog": HOG}
        load_start = os.getloadavg()
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in scenarios}
        for _ in range(args.rounds):  # interleaved: drift in the machine's own load hits every scenario alike
            for name, beside in scenarios.items():
                rounds[name].append(one_round(device, probe, args.busy_s, beside))
        load_end = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in rounds[name])

    base_others, base_copy = med("nothing added", "others_cores"), med("nothing added", "copy_gb_per_s_before")
    added = med("one busy process", "others_cores") - base_others
    hog_ratio = med("memory hog", "copy_gb_per_s_before") / base_copy
    summary = {name: {"others_cores_median": med(name, "others_cores"),
                      "copy_gb_per_s_before_median": med(name, "copy_gb_per_s_before"),
                      "own_cpu_s_median": med(name, "own_cpu_s"), "load1_before_median": med(name, "load1_before"),
                      "marked_under_load": sum(1 for r in rounds[name] if r["under_load"])} for name in scenarios}
    targets = [
        {"target": "one injected busy process shows as +1 core of others (0.7..1.3)", "measured": added,
         "met": 0.7 <= added <= 1.3},
        {"target": "every round with a busy process added is marked under load",
         "measured": summary["one busy process"]["marked_under_load"],
         "met": summary["one busy process"]["marked_under_load"] == args.rounds},
        {"target": "a memory hog lowers the copy probe (median ratio < 1)", "measured": hog_ratio,
         "met": hog_ratio < 1.0},
        {"target": "(reported) the memory hog crosses the 80% bandwidth threshold", "measured": hog_ratio,
         "met": hog_ratio < bench_load.BANDWIDTH_DROP_LIMIT},
    ]
    report = {"command": "python benchmarks/bench_load_probe.py " + " ".join(sys.argv[1:]),
              "cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": load_end,
              "rounds": args.rounds, "busy_s": args.busy_s, "summary": summary, "targets": targets,
              "per_round": rounds}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'scenario':<18} {'others cores':>13} {'copy GB/s':>10} {'own cpu s':>10} {'load1':>7} {'marked':>7}")
    for name, s in summary.items():
        print(f"{name:<18} {s['others_cores_median']:>13.2f} {s['copy_gb_per_s_before_median']:>10.1f} "
              f"{s['own_cpu_s_median']:>10.2f} {s['load1_before_median']:>7.2f} "
              f"{s['marked_under_load']:>4}/{args.rounds}")
    for t in targets:
        print(f"{'MET ' if t['met'] else 'NOT MET'} {t['target']}: {t['measured']:.3g}")
    print(f"load average {load_start[0]:.2f} -> {load_end[0]:.2f} on {os.cpu_count()} cpus; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
