"""A separate process contending for a device lease (run as ``python -m tests.helpers.lease_worker``).

hammer URL DEVICE:MAX_JOBS[,DEVICE:MAX_JOBS...] N HOLD_S GO_FILE: prints "ready", waits for GO_FILE, then per
device N times acquires, holds, releases; prints one JSON line {device: [[start, end], ...]} (measured inside
the held period).
die URL DEVICE MAX_JOBS TTL_S [HOLDER]: acquires (as HOLDER if given), prints the lease id, then sleeps until
killed (a dead holder).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from edgefarm.results.db import make_engine
from edgefarm.results.leases import acquire, release


def main(argv: list[str]) -> int:
    mode, url = argv[0], argv[1]
    engine = make_engine(url)
    if mode == "die":
        holder = argv[5] if len(argv) > 5 else None
        lease = acquire(engine, argv[2], int(argv[3]), ttl_s=float(argv[4]), wait_s=10, holder=holder)
        print(lease.id, flush=True)
        time.sleep(600)
        return 1
    devices = [(d, int(m)) for d, m in (spec.split(":") for spec in argv[2].split(","))]
    n, hold_s, go = int(argv[3]), float(argv[4]), Path(argv[5])
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    intervals: dict[str, list[tuple[float, float]]] = {}
    for device, max_jobs in devices:
        for _ in range(n):
            lease = acquire(engine, device, max_jobs, ttl_s=30, wait_s=60, poll_s=0.002, max_poll_s=0.02)
            start = time.time()
            time.sleep(hold_s)
            intervals.setdefault(device, []).append((start, time.time()))
            release(engine, lease)
    print(json.dumps(intervals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
