"""The farm at lab scale: a simulated lab of N devices and M rows through the real orchestrator (plan, Prefect flow
and tasks, device leases, retries, the results database, the docs); only the devices and the toolchain's tools are
stand-ins (benchmarks/farm_sim.py: stage durations drawn from the stage times this farm records, optional failure
rates; exports and builds write small real artifacts).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_farm_scale.py --devices 20 --rows 200 --output FILE
    PYTHONPATH=. .venv/bin/python benchmarks/bench_farm_scale.py --devices 20,200 --rows 200,2000 --output FILE
        [--time-scale 0.25] [--infra-failure-rate 0.01] [--stage-times-db sqlite:///.data/edgefarm.db]
        [--host-slots 2]

Each (devices, rows) configuration runs in a process of its own (its peak memory is its own): a warm-up nightly of
one row (it starts Prefect's temporary server and computes the one transformers reference every simulated model
shares), then the measured nightly of every row. Reported per configuration:
  - wall_s: the flow's stage DAG, submission to the last record;
  - lower_bound_s: the largest of the simulated device work / devices, the host stages' work / host slots, the
    longest chain of one row, and per platform the shortest host chain then its devices' work / its devices (a
    device runs its own platform's stages only): what a perfect orchestrator could not beat;
    ``wall_over_lower_bound``; beside it the farm's own critical path from the measured stage times
    (``wall_over_measured_critical_path``: a device stage's lease held, staging and cache checks included);
  - orchestrator_cpu_ms_per_stage: this process's CPU (user+sys) during the run / stage runs, less what the
    devices' commands took (the simulated tools sleep; the farm's agent runs in the calling thread and its thread
    CPU is counted apart; the cache scripts run as child processes): those are device_commands_cpu_ms_per_stage;
  - peak_rss_mb: the process's peak resident memory; db_ms_per_stage and db_statements_per_stage (every SQL
    statement timed); prefect_overhead_ms (median, Prefect's time around a task body) and task start latency.
Targets (issue 25): at 200 devices and 2,000 rows, wall <= 1.15x the lower bound, <= 10 ms of orchestrator CPU per
stage, <= 1 GiB peak. Prints a table; writes the JSON (with the machine's load before and after each run).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGETS = {"devices": 200, "rows": 2000, "wall_over_lower_bound": 1.15, "orchestrator_cpu_ms_per_stage": 10.0,
           "peak_rss_mb": 1024.0}


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class SqlClock:
    """Every SQL statement this process runs, timed (SQLAlchemy's cursor events)."""

    def __init__(self) -> None:
        self.seconds, self.count, self._local = 0.0, 0, threading.local()
        self.kinds: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def install(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        words = statement.split()
        table = next((w for prev, w in itertools.pairwise(words) if prev.upper() in ("FROM", "INTO", "UPDATE")), "")
        kind = f"{words[0].upper() if words else ''} {table.strip(chr(34))}"
        with self._lock:
            self.kinds[kind] += 1
        self._local.t0 = time.perf_counter()

    def _after(self, *_: Any) -> None:
        elapsed = time.perf_counter() - getattr(self._local, "t0", time.perf_counter())
        with self._lock:
            self.seconds += elapsed
            self.count += 1


def lower_bound(work: list[tuple[str, str, float, str]], devices: int, host_slots: int,
                platform_of: Mapping[str, str] | None = None) -> dict[str, float]:
    """What no orchestrator could beat: the device work spread over every device, the host stages' work over the
    host slots, the longest row (quantize, export, build, then infer + accuracy beside bench), and per platform
    (``platform_of``: device -> platform; a device runs its platform's stages only) its devices' work spread over
    them, after the shortest host chain (quantize + export of one row: no device stage starts before one row's)."""
    device_s = sum(s for _, where, s, _ in work if where != "host")
    host_s = sum(s for _, where, s, _ in work if where == "host")
    per_row: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for stage, _, seconds, row in work:
        per_row[row][stage] += seconds
    rows = {row: r for row, r in per_row.items() if row != "?"}
    longest = max((r["quantize"] + r["export"] + r["build"] + max(r["infer"] + r["accuracy"], r["bench"])
                   for r in rows.values()), default=0.0)
    first_export = min((r["quantize"] + r["export"] for r in rows.values() if r["export"]), default=0.0)
    platform_s: dict[str, float] = defaultdict(float)
    for _, where, seconds, _ in work:
        if where != "host" and platform_of:
            platform_s[platform_of.get(where, where)] += seconds
    counts: dict[str, int] = defaultdict(int)
    for kind in (platform_of or {}).values():
        counts[kind] += 1
    platform_bound = max((first_export + w / max(1, counts[p]) for p, w in platform_s.items()), default=0.0)
    bounds = (device_s / devices, host_s / host_slots, longest, platform_bound)
    return {"device_work_s": round(device_s, 3), "host_work_s": round(host_s, 3),
            "device_bound_s": round(device_s / devices, 3), "host_bound_s": round(host_s / host_slots, 3),
            "longest_chain_s": round(longest, 3), "platform_bound_s": round(platform_bound, 3),
            "lower_bound_s": round(max(bounds), 3)}


def run_one(args: argparse.Namespace, root: Path | None = None) -> dict[str, Any]:
    """One configuration, in this process (its files under ``root``, default a new temporary directory)."""
    from benchmarks import farm_sim
    from edgefarm.flows.prefect_env import configure_prefect

    root = root or Path(tempfile.mkdtemp(prefix="farm-scale-"))
    os.environ["EDGEFARM_HOST_SLOTS"] = str(args.host_slots)  # the host stages sleep: a lab's orchestrator (and its
    # quantize workers) runs many at once
    data, inventory = root / "data", root / "inventory"
    configure_prefect(data)
    # whole models: a model's rows are its precisions on every platform (--rows is rounded up to that)
    per_model = len(farm_sim.PRECISIONS) * len(farm_sim.PLATFORMS)
    models = farm_sim.write_catalog(root / "models.yml", -(-args.rows // per_model))
    rows = len(models) * per_model
    farm_sim.write_inventory(inventory, root / "devices", args.devices)
    full, warm = root / "matrix.yml", root / "warm.yml"
    farm_sim.write_matrix(full, models)
    farm_sim.write_matrix(warm, [models[0]], ("fp16",), ("x86-cpu",))
    times = farm_sim.stage_times_from_db(args.stage_times_db) if args.stage_times_db else farm_sim.STAGE_TIMES
    times = {**times, **(getattr(args, "stage_times", None) or {})}  # a caller's own (tests)
    lab = farm_sim.Lab(devices=args.devices, time_scale=args.time_scale, infra_failure_rate=args.infra_failure_rate,
                       test_failure_rate=args.test_failure_rate, seed=args.seed, stage_times=times)
    clock = SqlClock()
    clock.install()
    from edgefarm.flows.nightly import nightly_support_matrix
    from edgefarm.flows.run_state import flow_summary

    common = {"data_dir": str(data), "inventory": str(inventory), "docs_dir": str(root / "docs")}
    with farm_sim.install(lab, root / "models.yml"):
        t0 = time.perf_counter()
        flow_summary(nightly_support_matrix(matrix=str(warm), return_state=True, **common))
        warm_s = time.perf_counter() - t0
        lab.work.done.clear()
        lab.work.failures.clear()
        lab.work.commands.clear()
        lab.work.device_cpu_s, lab.work.peak_running = 0.0, 0
        load_before = os.getloadavg()
        cpu0, child0, sql0, n0 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN), clock.seconds, \
            clock.count
        kinds0 = dict(clock.kinds)
        t0 = time.perf_counter()
        summary = flow_summary(nightly_support_matrix(matrix=str(full), return_state=True, **common))
        process_s = time.perf_counter() - t0
        cpu = _cpu_s(resource.RUSAGE_SELF) - cpu0 - lab.work.device_cpu_s
        child = _cpu_s(resource.RUSAGE_CHILDREN) - child0
        sql_s, statements = clock.seconds - sql0, clock.count - n0
        load_after = os.getloadavg()
        sql_kinds = {k: n - kinds0.get(k, 0) for k, n in clock.kinds.items() if n > kinds0.get(k, 0)}
    timing = summary["timing"]
    stage_runs = sum(summary["stages"].values())
    bound = lower_bound(lab.work.done, args.devices, args.host_slots, farm_sim.platforms_of(args.devices))
    wall = float(timing["wall_s"])
    per_device: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # device -> [stages, simulated seconds]
    for _, where, seconds, _ in lab.work.done:
        if where != "host":
            per_device[where][0] += 1
            per_device[where][1] += seconds
    return {
        "devices": args.devices, "rows": rows, "platforms": len(farm_sim.PLATFORMS), "time_scale": args.time_scale,
        "host_slots": args.host_slots,
        "infra_failure_rate": args.infra_failure_rate, "test_failure_rate": args.test_failure_rate,
        "stage_results": stage_runs, "stage_counts": summary["stages"], "failed_rows": len(summary["failed"]),
        "simulated_failures": dict(lab.work.failures),
        "peak_device_commands_at_once": lab.work.peak_running,
        "lease_attempts_per_device_command": round(sql_kinds.get("INSERT lease_devices", 0) / max(
            1, sum(1 for _, where, _, _ in lab.work.done if where != "host")), 2),
        "device_commands": dict(sorted(lab.work.commands.items(), key=lambda kv: -kv[1])),
        # how evenly the scheduler spread the work: stages and simulated seconds per device
        "stages_per_device": {d: int(n) for d, (n, _) in sorted(per_device.items())},
        "busiest_device_simulated_s": round(max((t for _, t in per_device.values()), default=0.0), 2),
        "idlest_device_simulated_s": round(min((t for _, t in per_device.values()), default=0.0), 2),
        "sql_by_kind": dict(sorted(sql_kinds.items(), key=lambda kv: -kv[1])[:25]),
        "warmup_s": round(warm_s, 2), "wall_s": round(wall, 2), "flow_process_s": round(process_s, 2),
        **bound, "wall_over_lower_bound": round(wall / max(bound["lower_bound_s"], 1e-9), 3),
        "orchestrator_cpu_s": round(cpu, 2),
        "orchestrator_cpu_ms_per_stage": round(cpu * 1000 / max(1, stage_runs), 2),
        "device_commands_cpu_ms_per_stage": round((child + lab.work.device_cpu_s) * 1000 / max(1, stage_runs), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "db_ms_per_stage": round(sql_s * 1000 / max(1, stage_runs), 2),
        "db_statements_per_stage": round(statements / max(1, stage_runs), 1),
        # the farm's own critical path from the stages' measured times (a device stage's: its lease held, staging
        # and cache checks included): how well the scheduler packs what the lab really took
        "measured_critical_path_s": timing.get("critical_path_s"),
        "wall_over_measured_critical_path": timing.get("wall_over_critical_path"),
        "prefect_overhead_ms": timing.get("median_task_overhead_ms"),
        "task_start_latency_ms": timing.get("median_task_start_latency_ms"),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
        "data_dir": str(root),
    }


def table(results: list[dict[str, Any]]) -> str:
    cols = ["devices", "rows", "stage_results", "wall_s", "lower_bound_s", "wall_over_lower_bound",
            "orchestrator_cpu_ms_per_stage", "peak_rss_mb", "db_ms_per_stage", "prefect_overhead_ms",
            "task_start_latency_ms", "loadavg_before"]
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    lines += [" | ".join(str(r.get(c, "")) for c in cols) for r in results]
    return "\n".join(lines)


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        if r["devices"] != TARGETS["devices"] or not TARGETS["rows"] <= r["rows"] < TARGETS["rows"] + 18:
            continue
        for name in ("wall_over_lower_bound", "orchestrator_cpu_ms_per_stage", "peak_rss_mb"):
            out.append({"name": name, "at": f"{r['devices']} devices x {r['rows']} rows", "target": TARGETS[name],
                        "measured": r[name], "met": r[name] <= TARGETS[name]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="20", help="comma-separated device counts")
    p.add_argument("--rows", default="200", help="comma-separated row counts (each with each device count)")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "farm_scale.json")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every drawn stage duration")
    p.add_argument("--infra-failure-rate", type=float, default=0.0)
    p.add_argument("--test-failure-rate", type=float, default=0.0)
    p.add_argument("--stage-times-db", default=None, help="a results database URL to draw stage times from")
    p.add_argument("--host-slots", type=int, default=2, help="the orchestrator's host slots (execute_plan's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite",
                   help="the results database: the embedded SQLite file, or a throwaway PostgreSQL cluster")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single configuration, in-process
    args = p.parse_args(argv)
    if args.one:
        args.devices, args.rows = int(args.devices), int(args.rows)
        print(json.dumps(run_one(args)))
        return 0
    results = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stop = None
    if args.backend == "postgresql":  # the URL (its password) reaches the runs through the environment only
        from tests.fixtures.postgres import start_postgres

        server, stop = start_postgres()
    try:
        for config in _configs(args):
            if stop is not None:
                env["EDGEFARM_DB_URL"] = server.create_database()
            results.append(_run_config(args, *config, env))
    finally:
        if stop is not None:
            stop()
    report = {"benchmark": "farm_scale", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "backend": args.backend,
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version()},
              "results": results, "targets": targets([r for r in results if "error" not in r])}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(table([r for r in results if "error" not in r]))
    for t in report["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        print(f"target {t['name']} at {t['at']}: {t['measured']} vs {t['target']} -> {verdict}")
    return 0


def _configs(args: argparse.Namespace) -> list[tuple[int, int]]:
    return [(int(d), int(r)) for d in args.devices.split(",") for r in args.rows.split(",")]


def _run_config(args: argparse.Namespace, devices: int, rows: int, env: dict[str, str]) -> dict[str, Any]:
    """One configuration in a process of its own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--devices", str(devices), "--rows",
           str(rows), "--time-scale", str(args.time_scale), "--infra-failure-rate",
           str(args.infra_failure_rate), "--test-failure-rate", str(args.test_failure_rate),
           "--host-slots", str(args.host_slots), "--seed", str(args.seed)]
    if args.stage_times_db:
        cmd += ["--stage-times-db", args.stage_times_db]
    print(f"== {devices} devices x {rows} rows ({args.backend})", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {"devices": devices, "rows": rows, "error": done.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = {**json.loads(done.stdout.strip().splitlines()[-1]), "backend": args.backend}
    print(table([result]), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
