"""Embedded-default nightly: first run vs a second run with nothing changed (every export and engine cached),
the run's wall time over its critical path, and the per-task orchestration overhead.

    .venv/bin/python benchmarks/bench_nightly.py [--matrix FILE] [--keep DIR]

Runs `edgefarm nightly --json` twice in a fresh data dir (separate processes, as a user would), prints a table
and writes benchmarks/results/nightly.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "nightly.json"


def run_nightly(data_dir: Path, matrix: Path | None) -> tuple[float, dict[str, object]]:
    argv = [sys.executable, "-m", "edgefarm.cli", "nightly", "--json", "--data-dir", str(data_dir)]
    if matrix is not None:
        argv += ["--matrix", str(matrix)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("EDGEFARM_DB_URL", None)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"nightly failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    start = proc.stdout.index('{\n  "run_id"')
    summary, _ = json.JSONDecoder().raw_decode(proc.stdout[start:])
    return wall, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="use (and keep) this data dir instead of a temp one")
    args = ap.parse_args()
    data_dir = args.keep or Path(tempfile.mkdtemp(prefix="bench-nightly-"))
    if args.keep and data_dir.exists():
        shutil.rmtree(data_dir)
    try:
        first_wall, first = run_nightly(data_dir, args.matrix)
        second_wall, second = run_nightly(data_dir, args.matrix)
    finally:
        if args.keep is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    rows = []
    for name, wall, s in (("first", first_wall, first), ("second (cached)", second_wall, second)):
        t = s["timing"]
        rows.append({"run": name, "process_wall_s": round(wall, 1), "flow_wall_s": t["wall_s"],
                     "critical_path_s": t["critical_path_s"], "wall_over_critical_path": t["wall_over_critical_path"],
                     "median_task_overhead_ms": t["median_task_overhead_ms"],
                     "median_task_start_latency_ms": t.get("median_task_start_latency_ms"),
                     "cache_hits": s["cache_hits"],
                     "stages": s["stages"], "failed": len(s["failed"])})
    result = {
        "machine": {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg()},
        "runs": rows,
        "second_over_first": round(second_wall / first_wall, 3),
        "targets": {"first_run_s": 300, "second_over_first": 0.30, "wall_over_critical_path": 1.3},
    }
    cols = ("run", "process_wall_s", "flow_wall_s", "critical_path_s", "wall_over_critical_path",
            "median_task_overhead_ms", "median_task_start_latency_ms", "cache_hits")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"second / first (process wall): {result['second_over_first']} (target <= 0.30); "
          f"first run {first_wall:.0f} s (target < 300 s)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
