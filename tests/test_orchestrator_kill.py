"""kill -9 of a real `edgefarm nightly`: its temporary Prefect server and its stage processes die with it, and
the next run reaps the dead run as `error`, unpublished. Real processes, the real local device, SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm.results.db import make_engine
from edgefarm.results.models import RowLatest, Run, RunStatus

MATRIX = {"name": "kill", "models": ["stories260K"], "precisions": ["fp32", "fp16"], "platforms": ["x86-cpu"],
          "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                       "stages": ["export", "build", "infer", "accuracy", "bench"]}}


def _edgefarm(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "edgefarm.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _running_run(db: Path) -> int | None:
    if not db.exists():
        return None
    engine = make_engine(f"sqlite:///{db}")
    try:
        with Session(engine) as s:
            return s.scalar(select(Run.id).where(Run.status == RunStatus.RUNNING))
    except Exception:  # the schema is still being created
        return None
    finally:
        engine.dispose()


def test_kill_9_of_the_orchestrator_takes_its_children_and_the_next_run_reaps_it(
        farm_dirs: dict[str, Path], tmp_path: Path, migrated_prefect_home: Callable[[Path], Path]) -> None:
    data = tmp_path / "data"
    migrated_prefect_home(data / "prefect")  # its temporary Prefect server's home: a database already migrated
    db = data / "edgefarm.db"
    (tmp_path / "kill.yml").write_text(yaml.safe_dump(MATRIX))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"EDGEFARM_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    env.pop("EDGEFARM_DB_URL", None)
    orchestrator = _edgefarm(["nightly", "--matrix", str(tmp_path / "kill.yml"), "--inventory",
                              str(farm_dirs["inventory"]), "--data-dir", str(data)], env)
    me = psutil.Process(orchestrator.pid)
    server: list[psutil.Process] = []
    stages: list[psutil.Process] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and orchestrator.poll() is None:
        children = me.children(recursive=True)
        server = [p for p in children if "server" in " ".join(p.cmdline()) and "prefect" in " ".join(p.cmdline())]
        stages = [p for p in children if "edgellm" in p.cmdline() and p.ppid() == me.pid]
        if server and stages and _running_run(db):
            break
        time.sleep(0.2)
    assert orchestrator.poll() is None, orchestrator.stdout.read().decode() if orchestrator.stdout else ""
    assert server, "the orchestrator never started its temporary Prefect server"
    assert stages, "no stage process ran on the local device"
    run_id = _running_run(db)
    assert run_id is not None

    os.kill(orchestrator.pid, signal.SIGKILL)
    orchestrator.wait()
    gone_by = time.monotonic() + 30
    while time.monotonic() < gone_by and any(_alive(p) for p in server + stages):
        time.sleep(0.2)
    assert not [p.pid for p in server + stages if _alive(p)], "children outlived the killed orchestrator"
    assert _running_run(db) == run_id  # nobody has looked yet

    # the next run: one export (a run with nothing to do opens no run, so it would reap nothing); its start reaps
    small = tmp_path / "next.yml"
    small.write_text(yaml.safe_dump({**MATRIX, "name": "next", "precisions": ["fp32"],
                                     "defaults": {**MATRIX["defaults"], "stages": ["export"]}}))
    nxt = _edgefarm(["nightly", "--json", "--matrix", str(small), "--inventory", str(farm_dirs["inventory"]),
                     "--data-dir", str(data)], env)
    out, _ = nxt.communicate(timeout=600)
    assert nxt.returncode == 0, out.decode()
    engine = make_engine(f"sqlite:///{db}")
    with Session(engine) as s:
        dead = s.get(Run, run_id)
        assert dead is not None and dead.status is RunStatus.ERROR and dead.finished_at is not None
        assert dead.published_at is None  # its partial results are no evidence
        assert s.scalar(select(RowLatest.run_id).where(RowLatest.run_id == run_id)) is None
    engine.dispose()
    query = subprocess.run([sys.executable, "-m", "edgefarm.cli", "query", "--format", "json"], env=env,
                           capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=300)
    assert query.returncode == 0, query.stderr
    assert all(r["run_id"] != run_id for r in json.loads(query.stdout))


@pytest.mark.usefixtures("farm_dirs")
def test_die_with_parent_kills_a_grandchild_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = ("import subprocess, sys, time\n"
              "from edgefarm.devices.lifetime import die_with_parent\n"
              "p = subprocess.Popen(['sleep', '300'], preexec_fn=die_with_parent)\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[1])
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)
