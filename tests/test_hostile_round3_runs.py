"""Hostile inputs, round three (issue 40): runs that hang, crash or reap the living, and a reaped run that came
back as passed. Each test replays a probe that did not hold."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session
from typer.testing import CliRunner

import edgefarm.flows.execute as execute
from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactRef, ArtifactStore
from edgefarm.cli import app
from edgefarm.cli.show import TAIL_MAX_BYTES, _tail
from edgefarm.devices import agent_client
from edgefarm.flows.settings import Settings
from edgefarm.registries import current
from edgefarm.results import liveness
from edgefarm.results.db import make_engine, write_session
from edgefarm.results.errors import RunReaped
from edgefarm.results.leases import acquire, live_leases, try_acquire
from edgefarm.results.liveness import heartbeat_s, reap_stale_runs, stale_limit_s
from edgefarm.results.machine import this_host
from edgefarm.results.migrate import upgrade
from edgefarm.results.models import Run, RunStatus
from edgefarm.results.queries import latest_status, row_history
from edgefarm.results.recorder import Recorder
from edgefarm.tasks import device_exec
from edgefarm.toolchains.health import check_device
from edgellm.errors import ConfigurationError, ErrorKind, InfrastructureError
from tests.helpers.docs_db import PIPELINE, build_docs_db
from tests.test_hostile_inputs_web import _Answering, _local_device
from tests.test_hostile_publish import ROW

REPO = Path(__file__).resolve().parents[1]


def _edgefarm(args: list[str], env: dict[str, str], timeout: float = 60,
              prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "edgefarm.cli", *args], env=env, cwd=REPO,
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
    plan = SimpleNamespace(kind="nightly", name="nightly", jobs=[], runnable=lambda: [], sources={}, quantize_on=None)
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
from edgefarm.results.db import make_engine
from edgefarm.results.leases import LeaseLost, hold
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
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from edgefarm.flows.settings import Settings

    monkeypatch.setenv("EDGEFARM_HEARTBEAT_S", "0.5")
    Settings.resolve(data_dir=tmp_path)  # the settings read the farm's environment, and set the period
    assert (heartbeat_s(), stale_limit_s()) == (0.5, 1.5)
    for bad in ("soon", "0", "nan", "-1"):
        monkeypatch.setenv("EDGEFARM_HEARTBEAT_S", bad)
        with pytest.raises(ConfigurationError, match=f"bad \\$EDGEFARM_HEARTBEAT_S '{bad}': need seconds"):
            Settings.resolve(data_dir=tmp_path)
    monkeypatch.delenv("EDGEFARM_HEARTBEAT_S")
    Settings.resolve(data_dir=tmp_path)
    assert (heartbeat_s(), stale_limit_s()) == (20.0, 60.0)


# item 11 -----------------------------------------------------------------------------------------------------------
DEEP = "[" * 300_000 + "]" * 300_000  # 600 KB: under the transport's output bound, past any parser's recursion


def test_a_board_agent_answering_300000_deep_json_is_the_devices_fault(tmp_path: Path) -> None:
    """The agent's (and a toolchain probe's) JSON is parsed recursively: 300,000 levels raised RecursionError, which
    the farm classifies as its own bug (exit 4)."""
    device = _local_device(tmp_path)
    with pytest.raises(InfrastructureError, match="printed JSON nested too deeply to read"):
        agent_client.run(device, _Answering(DEEP), "env")
    report = check_device(device, current().device_type(device.type), transport=_Answering(DEEP))
    assert not report.healthy and report.error_kind is ErrorKind.INFRASTRUCTURE, report
    assert any("hostile: agent env printed JSON nested too deeply" in p for p in report.problems), report.problems
    env = {"python": "3.10.1", "machine": "x86_64", "disk_free_bytes": 2**40}
    probed = check_device(device, current().device_type(device.type), transport=_Answering(env, probe=DEEP))
    assert not probed.healthy, probed
    assert any("its probe printed JSON nested too deeply" in p for p in probed.problems), probed.problems


def _store_farm(data: Path, artifacts: list[ArtifactRef]) -> ArtifactStore:
    """A data dir whose database records one build result citing ``artifacts`` (already in its store)."""
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc123", toolchain={"edgellm-farm": "0.1.0"})
    rec.record_result(run, model="tiny-llama", precision="fp32", platform="x86-cpu", stage="build", test_id="b1",
                      status="pass", toolchain="edgellm-ort", toolchain_version="1", artifacts=artifacts)
    rec.finish_run(run, "passed")
    engine.dispose()
    return ArtifactStore(data / "artifacts")


def _hostile_tar(member: tarfile.TarInfo, body: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        member.size = len(body) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(body) if member.isfile() else None)
    return buf.getvalue()


def _link_out() -> tarfile.TarInfo:
    link = tarfile.TarInfo("engine/outside")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc"
    return link


def _device_node() -> tarfile.TarInfo:
    node = tarfile.TarInfo("engine/null")
    node.type, node.devmajor, node.devminor = tarfile.CHRTYPE, 1, 3
    return node


@pytest.mark.parametrize("member", [tarfile.TarInfo("../escaped.txt"), _link_out(), _device_node()],
                         ids=["dotdot", "link-out", "device"])
def test_show_refuses_a_hostile_tar_artifact_clearly(tmp_path: Path, member: tarfile.TarInfo) -> None:
    """`show engine:ID --output DIR` of a stored tar with a member outside DIR exited 4 ("bug", a traceback's
    FilterError) though tarfile's data filter let nothing escape: a store holding such a tar is refused, exit 3."""
    data = tmp_path / "data"
    data.mkdir()
    blob = ArtifactStore(data / "artifacts").put(_hostile_tar(member, b"pwned"), ArtifactKind.ENGINE)
    ref = ArtifactRef(blob.sha256, blob.size, ArtifactKind.ENGINE, Packing.TAR)
    _store_farm(data, [ref]).close()
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["show", f"engine:{ref.sha256[:12]}", "--output", str(out), "--data-dir",
                                      str(data)])
    assert result.exit_code == 3, result.output
    assert "refusing to unpack the stored tar" in result.output and "nothing was extracted" in result.output, \
        result.output
    assert not out.exists() and not (tmp_path / "escaped.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no staging left


def test_show_tail_of_a_large_log_reads_its_end_in_bounded_memory(tmp_path: Path) -> None:
    """`show --tail 3` read the whole log into memory, decoded and split it: a 286 MiB log peaked at 1 GiB."""
    data = tmp_path / "data"
    data.mkdir()
    line = b"0123456789 step ok\n"
    body = line * ((48 << 20) // len(line)) + b"tail one\ntail \x1b[31mtwo\ntail three"  # 48 MiB, short lines
    ref = ArtifactStore(data / "artifacts").put(body, ArtifactKind.LOG)
    _store_farm(data, [ref]).close()
    # VmHWM: this process's own peak (ru_maxrss would carry the forking test process's across exec)
    measured = ("import re, runpy, sys\n"
                "sys.argv = ['edgefarm', *sys.argv[1:]]\n"
                "try:\n"
                "    runpy.run_module('cli', run_name='__main__')\n"
                "finally:\n"
                "    hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
                "    print('maxrss_kib', hwm, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", measured, "show", f"log:{ref.sha256[:12]}", "--tail", "3",
                           "--data-dir", str(data)], cwd=REPO, env=_env(data), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["tail one", "tail \\x1b[31mtwo", "tail three"]
    lines = body.count(b"\n") + 1
    assert f"{lines} lines, the last 3" in done.stderr, done.stderr
    peak_mib = int(done.stderr.rsplit("maxrss_kib", 1)[1].split()[0]) / 1024
    assert peak_mib < 200, peak_mib  # the command itself ~100 MiB; reading the log whole took 600+


def test_tail_lines_at_the_edges(tmp_path: Path) -> None:
    log = tmp_path / "log"
    for text, tail, want in [(b"", 3, []), (b"a", 3, ["a"]), (b"a\nb\n", 5, ["a", "b"]), (b"a\r\nb", 1, ["b"]),
                             (b"x" * (TAIL_MAX_BYTES + 10) + b"\nend\n", 2, ["[cut] " + "x" * (TAIL_MAX_BYTES - 5),
                                                                              "end"])]:
        log.write_bytes(text)
        with log.open("rb") as f:
            got = _tail(f, len(text), tail)
        assert [g.removesuffix("\r") for g in got] == want, (text[:20], tail)


def test_a_reaped_run_stops_waiting_for_devices_once_its_heartbeat_learns_it(tmp_path: Path) -> None:
    """Resumed after being reaped, a run whose device another run took waited for it (6 h) before it could end."""
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    rec = Recorder(engine)
    run_id = rec.start_run("nightly", "schedule", "abc123")
    farm = SimpleNamespace(ctx=SimpleNamespace(run_id=run_id))
    assert liveness.reaped(run_id) is None
    with liveness.heartbeat(rec, run_id, every_s=0.05):
        time.sleep(0.1)
        assert reap_stale_runs(engine, stale_after_s=0.0).keys() == {run_id}
        deadline = time.monotonic() + 10
        while liveness.reaped(run_id) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(RunReaped, match=f"run {run_id} was ended as 'error'"):
            device_exec._acquire(farm, [], set(), exclusive=False)  # type: ignore[arg-type]
    engine.dispose()
    # its end ends what it learnt: the next run of this process with the same number (another database's, as when
    # a long-lived process or a test session runs one after another) is not taken for reaped
    other = make_engine(build_docs_db(tmp_path / "other.db", tmp_path / "other"))
    again = Recorder(other).start_run("nightly", "schedule", "abc123")
    assert again == run_id and liveness.reaped(again) is None
    other.dispose()
