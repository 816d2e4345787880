"""Device-lease latency for benchmarks/bench_db.py: one worker alone, then N worker processes (each its own engine
and connection) started together and contending for a few shared devices with fewer slots than workers.

A worker (``python -m benchmarks.db_leases URL SPEC_JSON``) prints "ready", waits for the go file, then per cycle:
``try_acquire`` a device (round robin over the shared ones, so every device row is contended), hold it
``hold_ms`` if it got a slot, ``release``, pause ``think_ms`` (uniform 0..think_ms); it prints one JSON line of its
per-call latencies in ms.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine

from edgefarm.results.db import make_engine
from edgefarm.results.leases import release, try_acquire

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of values."""
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median_ms": round(statistics.median(values), 2), "p95_ms": round(pct(values, 0.95), 2),
            "max_ms": round(max(values), 2)}


def single(engine: Engine, n: int) -> dict[str, object]:
    """Acquire+release by one caller with nothing else running."""
    times = []
    for k in range(n + 10):
        t0 = time.perf_counter()
        lease = try_acquire(engine, "bench-dev", 1, ttl_s=30)
        assert lease is not None
        release(engine, lease)
        if k >= 10:  # warm-up
            times.append((time.perf_counter() - t0) * 1000)
    return summary(times)


def round_trips(engine: Engine) -> dict[str, int]:
    """Round trips to PostgreSQL of one try_acquire and of one release (a simple Query or a Sync the client sends:
    each waits for the server's answer), counted in libpq's protocol trace of the pooled connection (psycopg 3)."""
    pool = make_engine(engine.url, pool_size=1, max_overflow=0)  # one connection: the one traced
    try:
        lease = try_acquire(pool, "bench-trips", 1, ttl_s=30)  # warm: the connection open, its setup done
        assert lease is not None
        release(pool, lease)
        with pool.connect() as conn:
            pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
        counts = {}
        with tempfile.TemporaryFile("w+") as trace:
            for call in ("acquire", "release"):
                trace.seek(0)
                trace.truncate()
                pgconn.trace(trace.fileno())
                try:
                    if call == "acquire":
                        lease = try_acquire(pool, "bench-trips", 1, ttl_s=30)
                    else:
                        assert lease is not None and release(pool, lease)
                finally:
                    pgconn.untrace()
                trace.seek(0)
                sent = [line.split("\t") for line in trace.read().splitlines()]
                counts[call] = sum(1 for f in sent if len(f) > 3 and f[1] == "F" and f[3] in ("Query", "Sync"))
        return counts
    finally:
        pool.dispose()


def contended(url: str, workers: int, devices: int, max_jobs: int, cycles: int, hold_ms: float,
              think_ms: float) -> dict[str, object]:
    """``workers`` processes started together on ``devices`` devices of ``max_jobs`` slots each (``devices=0``:
    each worker its own device, to tell waiting for a device's lock from waiting for a CPU)."""
    spec = {"devices": [f"bench-shared-{d}" for d in range(devices)], "max_jobs": max_jobs, "cycles": cycles,
            "hold_ms": hold_ms, "think_ms": think_ms}
    own = devices == 0  # each worker its own device: the same CPU load, no device row lock shared
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.db_leases", url,
                                   json.dumps({**spec, "go": str(go), "seed": w,
                                               **({"devices": [f"bench-own-{w}"]} if own else {})})],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for w in range(workers)]
        try:
            for p in procs:
                assert p.stdout is not None
                line = p.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"lease worker {p.pid} did not start: {line!r} (exit {p.poll()})")
            t0 = time.perf_counter()
            load0 = os.getloadavg()[0]
            go.touch()
            outs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
            wall = time.perf_counter() - t0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    acq = [t for o in outs for t in o["acquire"]]
    got = [t for o in outs for t in o["acquire_ok"]]
    rel = [t for o in outs for t in o["release"]]
    pairs = [a + r for o in outs for a, r in zip(o["acquire_ok"], o["release"], strict=True)]
    client = [t for o in outs for t in o["client_cpu_ms_per_attempt"]]
    server = [t for o in outs for t in o["server_cpu_ms_per_attempt"]]
    return {**spec, "devices": "one per worker" if own else spec["devices"], "workers": workers,
            "wall_s": round(wall, 1), "loadavg_1m_at_start": round(load0, 2),
            "attempts_per_s": round(len(acq) / wall, 1), "granted": len(got), "refused": len(acq) - len(got),
            # CPU per attempt (acquire, and release when granted): with the attempt rate, the cores the workers use
            "client_cpu_ms_per_attempt": round(statistics.mean(client), 2),
            "server_cpu_ms_per_attempt": round(statistics.mean(server), 2) if server else None,
            "try_acquire": summary(acq), "acquire_granted": summary(got), "release": summary(rel),
            "acquire_plus_release": summary(pairs)}


def _worker(url: str, spec: dict[str, object]) -> None:
    engine = make_engine(url)
    rng = random.Random(int(spec["seed"]))  # type: ignore[call-overload]
    devices: list[str] = spec["devices"]  # type: ignore[assignment]
    max_jobs, cycles = int(spec["max_jobs"]), int(spec["cycles"])  # type: ignore[call-overload]
    hold, think = float(spec["hold_ms"]) / 1000, float(spec["think_ms"]) / 1000  # type: ignore[arg-type]
    with engine.connect() as conn:  # open the connection before the start line; its server process's CPU is read
        backend = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()) if conn.dialect.name == \
            "postgresql" else None
    cpu0, server0 = time.process_time(), _cpu_s(backend)
    print("ready", flush=True)
    go = Path(str(spec["go"]))
    while not go.exists():
        time.sleep(0.002)
    out: dict[str, list[float]] = {"acquire": [], "acquire_ok": [], "release": []}
    for k in range(cycles):
        device = devices[(k + int(spec["seed"])) % len(devices)]  # type: ignore[call-overload]
        t0 = time.perf_counter()
        lease = try_acquire(engine, device, max_jobs, ttl_s=30)
        ms = (time.perf_counter() - t0) * 1000
        out["acquire"].append(ms)
        if lease is not None:
            out["acquire_ok"].append(ms)
            time.sleep(hold)
            t0 = time.perf_counter()
            release(engine, lease)
            out["release"].append((time.perf_counter() - t0) * 1000)
        time.sleep(rng.uniform(0, think))
    cycles_done = len(out["acquire"])
    out["client_cpu_ms_per_attempt"] = [(time.process_time() - cpu0) * 1000 / cycles_done]
    out["server_cpu_ms_per_attempt"] = [(_cpu_s(backend) - server0) * 1000 / cycles_done] if backend else []
    engine.dispose()
    print(json.dumps(out), flush=True)


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process of this host (the worker's PostgreSQL server process), 0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    _worker(sys.argv[1], json.loads(sys.argv[2]))
