"""The scaled-out path for real: a Prefect server and a process worker on 127.0.0.1, the L0 deployment registered
from infra/prefect.yaml, triggered through the API, its results found in the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm.flows.serve import PREFECT_YAML, start_server, stop_server
from edgefarm.results.db import make_engine
from edgefarm.results.models import Result, Run
from tests.fixtures.sshd import free_port

REPO = Path(__file__).resolve().parents[1]


def _prefect(args: list[str], env: dict[str, str], timeout: float = 120) -> str:
    proc = subprocess.run([sys.executable, "-m", "prefect", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def prefect_server(tmp_path: Path, migrated_prefect_home: Callable[[Path], Path]) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect-home")), DO_NOT_TRACK="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING", PREFECT_UI_ENABLED="false")
    saved = dict(os.environ)
    os.environ.update(env)  # start_server passes its own environment to the server
    try:
        proc, api_url = start_server("127.0.0.1", free_port(), tmp_path / "server.log")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    env["PREFECT_API_URL"] = api_url
    try:
        yield env
    finally:
        stop_server(proc)


def test_l0_deployment_from_infra_runs_on_a_process_worker(prefect_server: dict[str, str],
                                                          farm_dirs: dict[str, Path]) -> None:
    env = {**prefect_server, "EDGEFARM_HOME": str(REPO), "EDGEFARM_DATA_DIR": str(farm_dirs["data"]),
           "EDGEFARM_DB_URL": f"sqlite:///{farm_dirs['db']}", "EDGEFARM_INVENTORY": str(farm_dirs["inventory"]),
           "PYTHONPATH": str(REPO)}
    _prefect(["work-pool", "create", "x86-cpu", "--type", "process"], env)
    _prefect(["--no-prompt", "deploy", "--prefect-file", str(PREFECT_YAML), "--name", "l0-x86-cpu"], env)
    before = time.time()
    out = _prefect(["deployment", "run", "run-test-list/l0-x86-cpu"], env)
    assert "l0-x86-cpu" in out
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "x86-cpu", "--run-once"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        output, _ = worker.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        output, _ = worker.communicate()
        pytest.fail(f"the worker did not finish the L0 run in time:\n{output[-3000:]}")
    assert worker.returncode == 0, output[-3000:]
    engine = make_engine(env["EDGEFARM_DB_URL"])
    with Session(engine) as s:
        run = s.scalars(select(Run).where(Run.kind == "l0", Run.trigger == "deployment")
                        .order_by(Run.id.desc())).first()
        assert run is not None, f"no L0 run recorded by the deployment:\n{output[-3000:]}"
        assert run.started_at.timestamp() >= before - 5
        assert run.status.value == "passed"
        results = s.scalars(select(Result).where(Result.run_id == run.id)).all()
        from edgefarm.test_lists.loader import load_list

        assert len({r.test_id for r in results}) == len(load_list("l0_pipeline_x86cpu").entries)
        assert {r.status.value for r in results} == {"pass"}
    engine.dispose()


def test_serve_registers_the_nightly_schedule_and_stops_on_sigterm(
        tmp_path: Path, migrated_prefect_home: Callable[[Path], Path]) -> None:
    import json
    import urllib.request

    migrated_prefect_home(tmp_path / "prefect")  # serve's Prefect home in its data dir: no migration on start
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), EDGEFARM_DATA_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "edgefarm.cli", "serve", "--port", str(port), "--data-dir",
                             str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as under `&`
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline, names = time.time() + 120, {}
        while time.time() < deadline and len(names) < 2:
            time.sleep(1)
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:  # serve wants Prefect's CSRF token on every POST
                with urllib.request.urlopen(f"{api}/csrf-token?client=deployment-test", timeout=5) as resp:
                    csrf = {"Prefect-Csrf-Token": json.loads(resp.read())["token"],
                            "Prefect-Csrf-Client": "deployment-test"}
                req = urllib.request.Request(f"{api}/deployments/filter", data=b"{}", method="POST",
                                             headers={"Content-Type": "application/json", **csrf})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    names = {d["name"]: d for d in json.loads(resp.read())}
            except OSError:
                continue
        assert set(names) == {"nightly", "l0-x86-cpu"}
        crons = [s["schedule"] for s in names["nightly"]["schedules"]]
        assert crons == [{"cron": "0 2 * * *", "timezone": "UTC", "day_or": True}]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # serve honours SIGTERM even when started with SIGINT ignored
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
