"""Chaos on runs (issue 40 items 2 and 8): real processes on one SQLite results database, heartbeats shortened
through $EDGEFARM_HEARTBEAT_S (1 s: a run is dead, and a device lease expires, after 3 s without one).

  suspended    a real ``edgefarm nightly`` SIGSTOPped while a stage runs on the local device, for twice the stale
               limit; meanwhile a second orchestrator process reaps its run and the device's lease is taken (and
               freed 5 s after the SIGCONT). Expected: the resumed run ends as infrastructure (exit 3, "reaped"),
               takes no device, its run stays ``error`` and is never published (it used to exit 0 as ``passed``,
               published).
  same name    an orchestrator on a "second machine" with this host's name (a process in its own pid namespace:
               its pid means nothing here) holds a run with a fresh heartbeat and a device lease; a second
               orchestrator process here reaps dead runs. Expected: the twin's run and lease stay (they used to be
               reaped at once, because its pid is no process of this namespace).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm.results.db import make_engine
from edgefarm.results.leases import live_leases, release, try_acquire
from edgefarm.results.machine import pid_alive
from edgefarm.results.models import RowLatest, Run, RunStatus

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / ".data" / "test-artifacts" / "chaos-runs.json"
MATRIX = {"name": "suspend", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
          "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                       "stages": ["export", "build", "infer", "accuracy"]}}
NOTHING = {**MATRIX, "name": "nothing", "platforms": ["orin"]}  # nothing to run here: the run only opens and reaps
BEAT_S = 1.0


@pytest.fixture(scope="module")
def table() -> Iterator[list[dict[str, Any]]]:
    """The rows (fault, expected, observed, ok) both scenarios add; written to TABLE for benchmarks/chaos.py."""
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    yield rows
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    phases = {row["fault"]: row.pop("wall_s") for row in rows}
    TABLE.write_text(json.dumps({"table": rows, "wall_s": round(time.monotonic() - t0, 1), "phases_s": phases},
                                indent=2) + "\n")


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EDGEFARM_"))}
    env.update({"EDGEFARM_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "EDGEFARM_HEARTBEAT_S": str(BEAT_S), "PYTHONPATH": str(REPO)})
    return env


def _nightly(matrix: Path, inventory: Path, data: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "edgefarm.cli", "nightly", *extra, "--matrix", str(matrix), "--inventory",
            str(inventory), "--data-dir", str(data)]


def _running(db: Path) -> list[int]:
    if not db.exists():
        return []
    engine = make_engine(f"sqlite:///{db}")
    try:
        with Session(engine) as s:
            return list(s.scalars(select(Run.id).where(Run.status == RunStatus.RUNNING)))
    except Exception:  # the schema is still being created
        return []
    finally:
        engine.dispose()


_REAPER = """
import json, sys
from edgefarm.flows.settings import Settings
from edgefarm.results.db import make_engine
from edgefarm.results.liveness import reap_stale_runs
settings = Settings.resolve(data_dir=sys.argv[1])  # $EDGEFARM_HEARTBEAT_S: the stale limit, as a run's start reads it
print(json.dumps(reap_stale_runs(make_engine(settings.db_url))))
"""


def _reap_here(tmp_path: Path, inventory: Path, data: Path) -> subprocess.CompletedProcess[str]:
    """A second orchestrator process on this machine reaping dead runs, as every run's start does
    (flows.execute.execute_plan). A nightly with nothing to run no longer opens a run, so it reaps nothing."""
    return subprocess.run([sys.executable, "-c", _REAPER, str(data)], env=_env(data), cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def _reaped(done: subprocess.CompletedProcess[str]) -> dict[int, str]:
    assert done.returncode == 0, done.stdout + done.stderr
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def test_a_suspended_orchestrator_reaped_meanwhile_is_not_passed_when_it_resumes(
        farm_dirs: dict[str, Path], tmp_path: Path, migrated_prefect_home: Callable[[Path], Path],
        table: list[dict[str, Any]]) -> None:
    t0 = time.monotonic()
    data = tmp_path / "data"
    migrated_prefect_home(data / "prefect")
    db = data / "edgefarm.db"
    (tmp_path / "suspend.yml").write_text(yaml.safe_dump(MATRIX))
    first = subprocess.Popen(_nightly(tmp_path / "suspend.yml", farm_dirs["inventory"], data), env=_env(data),
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    me = psutil.Process(first.pid)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and first.poll() is None:
            stages = [p for p in me.children(recursive=True) if "edgellm" in p.cmdline() and p.ppid() == me.pid]
            if stages and _running(db):
                break
            time.sleep(0.2)
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        (run_id,) = _running(db)
        first.send_signal(signal.SIGSTOP)  # a laptop lid, a VM pause
        time.sleep(6 * BEAT_S)  # twice the stale limit
        reaped = _reaped(_reap_here(tmp_path, farm_dirs["inventory"], data))
        assert run_id in reaped, reaped
        engine = make_engine(f"sqlite:///{db}")
        taken = try_acquire(engine, "local-cpu", 2, slots=2, ttl_s=600)  # the second run takes the device
        assert taken is not None, live_leases(engine, "local-cpu")
        first.send_signal(signal.SIGCONT)
        time.sleep(5 * BEAT_S)
        assert release(engine, taken)  # the second run is done with the device: it is free again
        out, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    with Session(engine) as s:
        run = s.get(Run, run_id)
        latest = s.scalar(select(RowLatest.run_id).where(RowLatest.run_id == run_id))
    held = live_leases(engine, "local-cpu")
    engine.dispose()
    said = next((ln for ln in out.splitlines() if "was ended as" in ln), "(nothing about it)")
    observed = (f"resumed run {run_id} exited {first.returncode}: {said[:300]}; its run is "
                f"{run.status.value if run else 'missing'}, published {run.published_at if run else None}, "
                f"latest for {'no' if latest is None else 'a'} row; device leases after: {len(held)}")
    ok = (first.returncode == 3 and "reaped" in said and run is not None and run.status is RunStatus.ERROR
          and run.published_at is None and latest is None and held == [])
    table.append({"fault": "orchestrator SIGSTOPped 6 s (twice the stale limit) while a stage runs; a second "
                           "nightly reaps its run and takes the device; SIGCONT",
                  "expected": "the resumed run ends as infrastructure (exit 3, 'reaped'), stays error, unpublished, "
                              "takes no device", "observed": observed, "ok": ok,
                  "wall_s": round(time.monotonic() - t0, 1)})
    assert first.returncode == 3, out
    assert f"run {run_id} was ended as 'error'" in out and "reaped" in out, out
    assert run is not None and run.status is RunStatus.ERROR and run.published_at is None
    assert latest is None
    assert held == []  # the resumed run took no device after it learnt it was reaped


_TWIN = """
import sys, time
from edgefarm.results.db import make_engine
from edgefarm.results.leases import hold
from edgefarm.results.liveness import heartbeat
from edgefarm.results.recorder import Recorder
engine = make_engine(sys.argv[1])
rec = Recorder(engine)
run_id = rec.start_run("nightly", "schedule", "abc123")
with heartbeat(rec, run_id), hold(engine, "local-cpu", 2, ttl_s=3 * float(sys.argv[2])) as lease:
    print(run_id, __import__("os").getpid(), lease.holder, flush=True)
    sys.stdin.read()  # until the test closes it
rec.finish_run(run_id, "passed", publish=False)
"""


def _free_pid_base() -> int:
    """A pid from which 30 pids are no process here (the twin's pid must mean nothing in this namespace)."""
    return next(b for b in range(400, 30_000, 50) if not any(pid_alive(p) for p in range(b, b + 30)))


def test_a_twin_machines_live_run_with_this_host_name_is_not_reaped(
        farm_dirs: dict[str, Path], tmp_path: Path, migrated_prefect_home: Callable[[Path], Path],
        table: list[dict[str, Any]]) -> None:
    t0 = time.monotonic()
    data = tmp_path / "data"
    migrated_prefect_home(data / "prefect")
    db = data / "edgefarm.db"
    made = subprocess.run([sys.executable, "-m", "edgefarm.cli", "db", "upgrade"], env=_env(data), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    base = _free_pid_base()
    # the twin: its own pid namespace (same host name, same files); forks until its pids reach `base`
    climb = f'while [ "$(sh -c \'echo $$\')" -lt {base} ]; do :; done; "$@"'
    twin = subprocess.Popen(["unshare", "--map-root-user", "--pid", "--fork", "sh", "-c", climb, "sh",
                             sys.executable, "-c", _TWIN, f"sqlite:///{db}", str(BEAT_S)], env=_env(data), cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert twin.stdout is not None and twin.stdin is not None
        run_id, pid, holder = twin.stdout.readline().split()
        assert int(pid) >= base and not pid_alive(int(pid)), pid  # its pid is no process here
        reaper = _reap_here(tmp_path, farm_dirs["inventory"], data)
        reaped = _reaped(reaper)
        running = _running(db)
        engine = make_engine(f"sqlite:///{db}")
        held = [x.holder for x in live_leases(engine, "local-cpu")]
        grabbed = try_acquire(engine, "local-cpu", 2, slots=2)
        engine.dispose()
        table.append({"fault": f"a twin orchestrator with this host name in its own pid namespace (pid {pid}, no "
                               f"process here) holds a live run and a device lease; an orchestrator here reaps",
                      "expected": "the twin's run stays running and its lease stands (a fresh heartbeat is alive)",
                      "observed": f"reaper exit {reaper.returncode}, reaped {reaped or 'none'}; running runs "
                                  f"{running}; leases {held}; the "
                                  f"device {'was taken' if grabbed else 'stayed held'}",
                      "ok": not reaped and running == [int(run_id)] and held == [holder] and not grabbed,
                      "wall_s": round(time.monotonic() - t0, 1)})
        assert reaped == {}, reaped
        assert running == [int(run_id)]  # its heartbeat is fresh: alive, whatever its pid
        assert held == [holder]
        assert grabbed is None  # its lease stands: the device is not free
        twin.stdin.close()
        assert twin.wait(timeout=120) == 0, twin.stderr.read() if twin.stderr else ""
    finally:
        if twin.poll() is None:
            twin.kill()
            twin.wait()
