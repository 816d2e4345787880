"""Hostile inputs, round three (issue 40): runs that hang, crash or reap the living, and a reaped run that came
back as passed. Each test replays a probe that did not hold."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

import flows.execute as execute
from devices import agent_client
from devices.health import check_device
from edgellm.errors import ConfigurationError, ErrorKind, InfrastructureError
from flows.settings import Settings
from results.db import make_engine, write_session
from results.errors import RunReaped
from results.leases import acquire, live_leases, try_acquire
from results.liveness import heartbeat_s, reap_stale_runs, stale_limit_s
from results.machine import this_host
from results.models import Run, RunStatus
from results.queries import latest_status, row_history
from results.recorder import Recorder
from tests.helpers.docs_db import PIPELINE, build_docs_db
from tests.test_hostile_inputs_web import _Answering, _local_device
from tests.test_hostile_publish import ROW

REPO = Path(__file__).resolve().parents[1]


def _edgefarm(args: list[str], env: dict[str, str], timeout: float = 60,
              prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "flows.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EDGEFARM_"))}
    env.update({"EDGEFARM_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    return env


# item 9 ------------------------------------------------------------------------------------------------------------
def test_a_matrix_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`nightly --matrix FIFO` opened the FIFO and waited for a writer forever."""
    fifo = tmp_path / "matrix.yml"
    os.mkfifo(fifo)
    done = _edgefarm(["nightly", "--matrix", str(fifo), "--data-dir", str(tmp_path / "data")], _env(tmp_path / "d"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{fifo}: is a FIFO, not a regular file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_inventory_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`devices list` over an inventory holding a FIFO named like a device file hung forever."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    os.mkfifo(inventory / "board.yml")
    done = _edgefarm(["devices", "list", "--inventory", str(inventory)], _env(tmp_path / "d"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{inventory / 'board.yml'}: is a FIFO, not a regular file" in done.stderr, done.stderr


# item 10 -----------------------------------------------------------------------------------------------------------
def test_db_upgrade_of_a_read_only_database_is_infrastructure_naming_it(tmp_path: Path) -> None:
    """On a read-only file system (a bind mount made read-only in a user namespace: root ignores file modes)
    `db upgrade` crashed with a traceback (exit 1) opening its migration lock."""
    data = tmp_path / "data"
    env = _env(data)
    made = _edgefarm(["db", "upgrade", "--revision", "0013"], env)
    assert made.returncode == 0, made.stderr
    (data / "edgefarm.db.migrate.lock").unlink()
    read_only = ["unshare", "--map-root-user", "--mount", "sh", "-c", f'mount --bind -o ro "{data}" "{data}" && '
                 'exec "$@"', "sh"]
    done = _edgefarm(["db", "upgrade"], env, prefix=read_only)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot migrate database 'sqlite:///{data / 'edgefarm.db'}'" in done.stderr, done.stderr
    assert "read-only" in done.stderr, done.stderr


# item 2 ------------------------------------------------------------------------------------------------------------
def _suspended_plan(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """execute_plan of a nightly whose one job records the row as passing, while (as if the orchestrator were
    suspended past three heartbeats) a second run reaps this one; returns the run id."""
    started: list[int] = []

    def submit_jobs(ctx: Any, jobs: Any, report: Any, sources: Any, checkpoints: Any = None) -> None:
        started.append(ctx.run_id)
        engine = make_engine(url)
        rec = Recorder(engine)
        for stage in PIPELINE:
            rec.record_result(ctx.run_id, model=ROW[0], precision=ROW[1], platform=ROW[2], stage=stage,
                              test_id="tiny-qwen3-fp32", status="pass", device="local-cpu",
                              toolchain="edgellm-ort", toolchain_version="0.1.0+onnxruntime-1.22.0")
        time.sleep(0.05)
        assert ctx.run_id in reap_stale_runs(engine, stale_after_s=0.01)  # the second run, while this one slept
        engine.dispose()

    farm = SimpleNamespace(inventory=[], touched_devices=set())
    monkeypatch.setattr(execute, "Farm", SimpleNamespace(get=lambda ctx: farm, close=lambda ctx: None))
    monkeypatch.setattr(execute, "record_plan_decisions", lambda ctx, plan, report: None)
    monkeypatch.setattr(execute, "locate_checkpoints", lambda *a: {})
    monkeypatch.setattr(execute, "submit_jobs", submit_jobs)
    monkeypatch.setattr(execute, "timing_summary", lambda *a: {})
    monkeypatch.setattr(execute, "toolchain_versions", lambda: {"edgellm-farm": "0.1.0"})
    plan = SimpleNamespace(kind="nightly", runnable=lambda: [], sources={}, quantize_on=None)
    settings = Settings(db_url=url, data_dir=tmp_path, inventory_dir=tmp_path, docs_dir=tmp_path / "docs")
    with pytest.raises(RunReaped) as caught:
        execute.execute_plan(plan, settings, trigger="test")  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.INFRASTRUCTURE and caught.value.kind.exit_code == 3
    assert f"run {started[0]} was ended as 'error'" in str(caught.value) and "reaped" in str(caught.value)
    return started[0]


def test_a_run_reaped_while_suspended_is_not_passed_nor_published(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed after being reaped, the run exited 0 as `passed` and was published: finish_run did not check the
    run was still running."""
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    before = latest_status(engine, model=ROW[0], precision=ROW[1], platform=ROW[2])
    run_id = _suspended_plan(tmp_path, url, monkeypatch)
    with Session(engine) as s:
        run = s.get(Run, run_id)
        assert run is not None and run.status is RunStatus.ERROR and run.published_at is None
    after = latest_status(engine, model=ROW[0], precision=ROW[1], platform=ROW[2])
    assert [(r.run_id, r.verdict) for r in after] == [(r.run_id, r.verdict) for r in before]
    assert run_id not in [h.run_id for h in row_history(engine, *ROW)]
    with pytest.raises(RunReaped, match=f"run {run_id} was ended"):  # its heartbeat learns it too
        Recorder(engine).heartbeat(run_id)
    engine.dispose()


_HOLDER = """
import sys, time
from results.db import make_engine
from results.leases import LeaseLost, hold
engine = make_engine(sys.argv[1])
try:
    with hold(engine, "dev-s", 1, ttl_s=0.6):
        print("held", flush=True)
        time.sleep(1.5)  # suspended here for a while by the test
except LeaseLost as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
"""


def test_a_lease_holder_suspended_past_its_ttl_learns_it_lost_the_device(tmp_path: Path) -> None:
    """SIGSTOPped past its lease's TTL, a holder whose device another run took ended its block as if it had held
    the device all along (its heartbeat thread only logged the loss)."""
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url], cwd=REPO, env=_env(tmp_path / "d"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        taken = acquire(engine, "dev-s", 1, ttl_s=30, wait_s=10)  # reclaimed once the TTL passed
        os.kill(holder.pid, signal.SIGCONT)
        _, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 3, err
    assert "dev-s" in err and "expired or was reclaimed" in err, err
    assert [x.holder for x in live_leases(engine, "dev-s")] == [taken.holder]  # the new holder keeps its slot
    engine.dispose()


# item 8 ------------------------------------------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_live_run_of_another_machine_with_the_same_host_name_is_not_reaped(tmp_path: Path) -> None:
    """Two machines named alike on one database: a run on one reaped the other's live run (fresh heartbeat)
    because its pid was not a process here."""
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    rec = Recorder(engine)
    name = socket.gethostname()
    twins = {rec.start_run("nightly", "schedule", "abc123"): host
             for host in (name, f"{name}#0123456789abcdef")}  # an older edgefarm's record, another machine's
    mine = rec.start_run("nightly", "schedule", "abc123")  # this machine's, its orchestrator gone
    dead = _dead_pid()
    with write_session(engine) as s:
        for run_id, host in twins.items():
            s.execute(update(Run).where(Run.id == run_id).values(host=host, pid=dead))
        s.execute(update(Run).where(Run.id == mine).values(pid=dead))
    reaped = reap_stale_runs(engine)
    assert sorted(reaped) == [mine], reaped
    assert "is gone" in reaped[mine]
    with Session(engine) as s:
        assert {s.get(Run, r).status for r in twins} == {RunStatus.RUNNING}  # type: ignore[union-attr]
    assert reap_stale_runs(engine, stale_after_s=0.0).keys() == twins.keys()  # a stale heartbeat still reaps
    engine.dispose()


def test_a_fresh_lease_of_another_machine_with_the_same_host_name_is_not_reclaimed(tmp_path: Path) -> None:
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    name, dead = socket.gethostname(), _dead_pid()
    for i, holder in enumerate((f"{name}:{dead}:feedface", f"{name}#0123456789abcdef:{dead}:feedface")):
        twin = try_acquire(engine, f"dev-{i}", 1, holder=holder, ttl_s=3600)
        assert twin is not None
        assert try_acquire(engine, f"dev-{i}", 1) is None, holder  # its pid means nothing here: it may live
        assert [x.holder for x in live_leases(engine, f"dev-{i}")] == [holder]
    gone = try_acquire(engine, "dev-9", 1, holder=f"{this_host()}:{dead}:feedface", ttl_s=3600)
    assert gone is not None
    assert try_acquire(engine, "dev-9", 1) is not None  # this machine's dead holder: reclaimed at once
    engine.dispose()


def test_the_heartbeat_period_comes_from_the_environment_and_bad_values_are_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFARM_HEARTBEAT_S", "0.5")
    assert (heartbeat_s(), stale_limit_s()) == (0.5, 1.5)
    for bad in ("soon", "0", "nan", "-1"):
        monkeypatch.setenv("EDGEFARM_HEARTBEAT_S", bad)
        with pytest.raises(ConfigurationError, match=f"bad \\$EDGEFARM_HEARTBEAT_S '{bad}': need seconds"):
            stale_limit_s()
    monkeypatch.delenv("EDGEFARM_HEARTBEAT_S")
    assert (heartbeat_s(), stale_limit_s()) == (20.0, 60.0)


# item 11 -----------------------------------------------------------------------------------------------------------
DEEP = "[" * 300_000 + "]" * 300_000  # 600 KB: under the transport's output bound, past any parser's recursion


def test_a_board_agent_answering_300000_deep_json_is_the_devices_fault(tmp_path: Path) -> None:
    """The agent's (and a toolchain probe's) JSON is parsed recursively: 300,000 levels raised RecursionError, which
    the farm classifies as its own bug (exit 4)."""
    device = _local_device(tmp_path)
    with pytest.raises(InfrastructureError, match="printed JSON nested too deeply to read"):
        agent_client.run(device, _Answering(DEEP), "env")
    report = check_device(device, transport=_Answering(DEEP))
    assert not report.healthy and report.error_kind is ErrorKind.INFRASTRUCTURE, report
    assert any("hostile: agent env printed JSON nested too deeply" in p for p in report.problems), report.problems
    env = {"python": "3.10.1", "machine": "x86_64", "disk_free_bytes": 2**40}
    probed = check_device(device, transport=_Answering(env, probe=DEEP))
    assert not probed.healthy, probed
    assert any("its probe printed JSON nested too deeply" in p for p in probed.problems), probed.problems
