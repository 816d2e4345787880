"""Chaos: one nightly scenario on the local device and two SSH hosts, results on PostgreSQL, while faults are
injected. Real parts throughout: sshd hosts on 127.0.0.1, a tmpfs filled to ENOSPC, the artifact store's own blobs,
a SIGKILLed ``edgefarm nightly`` process and its temporary Prefect server.

  run 1  fault 1: sshd of dev-a killed (listener and sessions) while an artifact is being uploaded to it
         fault 2: the local device cpu-0's disk is full (all runs)
  run 2  fault 4: the orchestrator (a separate ``edgefarm nightly`` process) SIGKILLed while a stage runs on a device
         fault 3: between runs 2 and 3, two store blobs are corrupted: an engine's manifest (the build-cache
                  entry; the engine itself stays on its device) and the infer request every run stores again
  run 3  the restart: a rerun of the same matrix

Expected: nothing lost (run 1's evidence unchanged, every referenced artifact intact, the database consistent, no
orphan process), nothing wrong published (only finished runs, only rows that passed), every failure classified
(infrastructure, retried elsewhere; never a bug). The table (fault, expected, observed, ok) is written to
``.data/test-artifacts/chaos.json``; ``benchmarks/chaos.py`` runs this test and keeps it in benchmarks/results/.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.store import ArtifactStore
from edgefarm.cli import app
from edgefarm.cli.query import query_rows
from edgefarm.results.db import make_engine
from edgefarm.results.models import ArtifactRecord, Attempt, DeviceLease, Result, RowLatest, Run, RunStatus
from edgefarm.results.quarantine import active as quarantined
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.tasks.device_cache import STALE_PARTIAL_MIN
from edgefarm.tasks.infer import requests_for
from edgellm.errors import ErrorKind
from edgellm.types import Precision
from tests.fixtures.farm import DevicePython
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.sshd import SshHost, SshHosts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / ".data" / "test-artifacts" / "chaos.json"
MODELS = ("stories260K", "tiny-qwen3")
DEFAULTS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
            "stages": ["export", "build", "infer", "accuracy"]}
MATRIX = {"name": "chaos", "models": list(MODELS), "precisions": ["fp32"], "platforms": ["x86-cpu"],
          "defaults": DEFAULTS}
OK_KINDS = {None, ErrorKind.INFRASTRUCTURE}  # a fault is the machine's, never the model's or the code's


@dataclass
class Check:
    fault: str
    expected: str
    observed: list[str] = field(default_factory=list)
    ok: bool = True

    def see(self, ok: bool, what: str) -> None:
        self.observed.append(what if ok else f"NOT OK: {what}")
        self.ok = self.ok and ok


@dataclass
class Scenario:
    checks: list[Check] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def check(self, fault: str, expected: str) -> Check:
        c = Check(fault, expected)
        self.checks.append(c)
        return c

    def phase(self, name: str, t0: float) -> None:
        self.phases_s[name] = round(time.monotonic() - t0, 1)

    def write(self) -> None:
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        table = [{**asdict(c), "observed": "; ".join(c.observed)} for c in self.checks]
        TABLE.write_text(json.dumps({"test": "tests/test_chaos.py::test_chaos_nightly",
                                     "wall_s": round(time.monotonic() - self.started, 1),
                                     "phases_s": self.phases_s, "table": table}, indent=2) + "\n")

    def failures(self) -> str:
        return "\n".join(f"{c.fault}: {o}" for c in self.checks for o in c.observed if o.startswith("NOT OK"))


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """cpu-0's work dir on a 1 MiB tmpfs filled to ENOSPC by a ballast file."""
    mount = tmp_path / "cpu-0-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        (mount / "work").mkdir()
        fd = os.open(mount / "ballast", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield mount / "work"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _inventory(tmp_path: Path, ssh_hosts: SshHosts, device_python: DevicePython, work: str,
               full_disk: Path) -> Path:
    """cpu-0 (local, full disk) sorts first, then dev-a (the victim), then dev-b: each stage meets the faults."""
    inventory = ssh_hosts.write_inventory(tmp_path / "inventory", extra={
        "python": device_python.python, "env": device_python.env, "work_dir": work, "max_jobs": 2})
    for extra in sorted(inventory.glob("*.yaml"))[2:]:
        extra.unlink()  # two SSH hosts
    (inventory / "cpu-0.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(full_disk), "labels": ["cpu", "local"],
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}}))
    return inventory


class KillMidTransfer(threading.Thread):
    """Kills ``host`` (sshd listener and sessions) once an upload into its cache has written bytes, not finished."""

    def __init__(self, host: SshHost, cache: Path) -> None:
        super().__init__(daemon=True)
        self.host, self.cache = host, cache
        self.stop = threading.Event()
        self.killed: tuple[str, int] | None = None  # (partial name, bytes there when killed)

    def run(self) -> None:
        while not self.stop.is_set() and self.killed is None:
            for name, sent in _partials(self.cache):
                if sent > 0:
                    self.host.kill()
                    self.killed = (name, sent)
                    return
            time.sleep(0.002)


def _partials(cache: Path) -> list[tuple[str, int]]:
    """Uploads in progress in a device cache: (name, bytes written so far)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(cache):
            if ".partial-" not in entry.name:
                continue
            sent = 0
            with contextlib.suppress(FileNotFoundError):
                paths = [Path(entry.path)] if entry.is_file() else list(Path(entry.path).rglob("*"))
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        sent += path.stat().st_size if path.is_file() else 0
            found.append((entry.name, sent))
    return found


def _gist(reason: str | None) -> str:
    """A failure reason without its local paths: who failed, doing what, and the error."""
    text = reason or ""
    head = text.split(" /", 1)[0]
    tail = text[text.index("[Errno"):].split(":")[0] if "[Errno" in text else text.rsplit(": ", 1)[-1]
    return head if not tail or tail in head else f"{head} ... {tail}"


def _nightly_in_process(args: list[str]) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["nightly", "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    start = result.stdout.index('{\n  "run_id"')
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[start:])
    return result.exit_code, summary, result.output


def _processes_in(dirs: list[Path]) -> list[psutil.Process]:
    """Every live process whose working directory is under one of ``dirs`` (stage commands and their shells)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and any(Path(proc.cwd()).is_relative_to(d) for d in dirs):
                found.append(proc)
    return found


def _lingering(dirs: list[Path], grace_s: float = 5.0) -> list[psutil.Process]:
    """Processes in ``dirs`` that are still there after ``grace_s`` (a finished command's watcher may take its last
    one-second ``sleep``)."""
    deadline = time.monotonic() + grace_s
    while (left := _processes_in(dirs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # gone, or a zombie
        return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _edgellm_command(cmd: list[str]) -> str | None:
    """The ``edgellm`` subcommand a command line runs (``python -m edgellm infer ...``), if any."""
    for i in range(len(cmd) - 2):
        if cmd[i] == "-m" and cmd[i + 1] == "edgellm":
            return cmd[i + 2]
    return None


def _describe(proc: psutil.Process) -> str:
    cmd = _cmdline(proc)
    if not cmd:
        return f"pid {proc.pid}"
    what = [Path(cmd[0]).name]
    if (sub := _edgellm_command(cmd)) is not None:
        what += ["-m", "edgellm", sub]
    elif "prefect" in " ".join(cmd) and "server" in cmd:
        what.append("(Prefect server)")
    return " ".join([*what, f"pid {proc.pid}"])


def _evidence(engine: Engine, run_id: int) -> dict[str, Any]:
    """What a published run says, for a before/after comparison."""
    with Session(engine) as s:
        run = s.get(Run, run_id)
        assert run is not None
        results = sorted((r.id, r.model, r.stage.value, r.status.value, r.device, r.reason)
                         for r in s.scalars(select(Result).where(Result.run_id == run_id)))
        artifacts = sorted((a.sha256, a.kind.value) for a in s.scalars(
            select(ArtifactRecord).where(ArtifactRecord.run_id == run_id)))
        return {"status": run.status.value, "published_at": run.published_at, "results": results,
                "artifacts": artifacts}


def _run_page(docs: Path, run_id: int) -> str:
    page = docs / "runs" / f"run-{run_id}.md"
    return "\n".join(ln for ln in page.read_text().splitlines() if "Generated" not in ln) if page.exists() else ""


def _engine_blob(engine: Engine, run_id: int, model: str) -> str | None:
    with Session(engine) as s:
        return s.scalar(select(ArtifactRecord.sha256).join(Result, ArtifactRecord.result_id == Result.id)
                        .where(Result.run_id == run_id, Result.model == model, Result.stage == Stage.BUILD,
                               ArtifactRecord.kind == ArtifactKind.ENGINE_MANIFEST))


def _request_sha() -> str:
    """The infer request of the matrix's jobs (the same bytes every run stores)."""
    import hashlib

    job = JobSpec(model=MODELS[0], precision=Precision.FP32, platform="x86-cpu", toolchain="edgellm-ort",
                  test_id="chaos", checkpoint=CheckpointRef(MODELS[0], "", "0" * 64),
                  max_seq_len=DEFAULTS["max_seq_len"], max_batch_size=DEFAULTS["max_batch_size"],  # type: ignore[arg-type]
                  max_input_len=DEFAULTS["max_input_len"], stages=())  # type: ignore[arg-type]
    return hashlib.sha256(json.dumps(requests_for(job), indent=1).encode()).hexdigest()


def _corrupt(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    path.chmod(0o444)


def _tries(engine: Engine, run_ids: list[int]) -> tuple[list[Attempt], list[Result]]:
    with Session(engine) as s:
        attempts = list(s.scalars(select(Attempt).where(Attempt.run_id.in_(run_ids))))
        results = list(s.scalars(select(Result).where(Result.run_id.in_(run_ids))))
        s.expunge_all()
    return attempts, results


def test_chaos_nightly(ssh_hosts: SshHosts, device_python: DevicePython, postgres: PostgresServer, full_disk: Path,
                       tmp_path: Path, migrated_prefect_home: Callable[[Path], Path]) -> None:
    sc = Scenario()
    ssh_hosts.ensure_up()
    victim, spare = ssh_hosts[0], ssh_hosts[1]
    work = f"chaos-{secrets.token_hex(4)}"  # this test's own work dirs: other sessions may share the host users
    ssh_work = [victim.home / work, spare.home / work]
    stage_dirs = [*ssh_work, full_disk]
    inventory = _inventory(tmp_path, ssh_hosts, device_python, work, full_disk)
    db_url = postgres.create_database()
    data, docs = tmp_path / "data", tmp_path / "docs"
    migrated_prefect_home(data / "prefect")  # run 2's temporary Prefect server (a subprocess): already migrated
    matrix = tmp_path / "chaos.yml"
    matrix.write_text(yaml.safe_dump(MATRIX))
    args = ["--matrix", str(matrix), "--inventory", str(inventory), "--db", db_url, "--data-dir", str(data),
            "--docs-dir", str(docs)]
    engine = make_engine(db_url)
    store = ArtifactStore(data / "artifacts")
    f1 = sc.check("sshd of dev-a killed mid-transfer (run 1)",
                  "the upload fails as infrastructure, kept as an attempt on dev-a; the stage moves to another "
                  "device; the partial upload never becomes a cache entry; run 1 passes every row")
    f2 = sc.check("cpu-0's disk full: work dir on a 1 MiB tmpfs filled to ENOSPC (runs 1-3)",
                  "every try on cpu-0 is an infrastructure attempt naming ENOSPC; its stages move to an SSH host; "
                  "no result comes from cpu-0")
    f3 = sc.check("store blobs corrupted between runs 2 and 3 (stories260K's engine manifest, the infer request)",
                  "each found by its digest, never served, made again; the store verifies after the rerun; "
                  "no device blamed for it")
    f4 = sc.check("orchestrator SIGKILLed mid-stage (run 2), then rerun (run 3)",
                  "its temporary Prefect server and stage processes (SSH device included) die with it; run 2 is "
                  "never published and is reaped as error by run 3; run 3 passes every row")
    lost = sc.check("nothing lost", "run 1's results, publication and run page unchanged after runs 2-3; every "
                                    "artifact a result refers to is in the store and verifies (but a blob the "
                                    "fault itself destroyed, when its rebuild is not byte-identical); no orphan "
                                    "process")
    wrong = sc.check("nothing wrong published", "supported rows are exactly those whose latest published run "
                                                "passed every stage; the killed run's results are in no row")
    kinds = sc.check("every failure classified", "results and attempts of every run carry no error kind but "
                                                 "infrastructure (no bug, configuration or test failure)")
    consistent = sc.check("database consistent", "no run left running; no lease held after the rerun; one "
                                                  "result per (run, row, stage, test)")
    orchestrator: subprocess.Popen[bytes] | None = None
    try:
        # -- run 1: dev-a killed mid-upload, cpu-0 full ------------------------------------------------------------
        t0 = time.monotonic()
        killer = KillMidTransfer(victim, victim.home / work / "cache")
        killer.start()
        try:
            code1, s1, out1 = _nightly_in_process(args)
        finally:
            killer.stop.set()
            killer.join()
            ssh_hosts.ensure_up()  # dev-a comes back for the next runs
        sc.phase("run 1 (faults 1, 2)", t0)
        run1 = s1["run_id"]
        assert code1 == 0, out1
        assert killer.killed is not None, "dev-a never received an upload to kill"
        attempts, results = _tries(engine, [run1])
        on_victim = [a for a in attempts if a.device == victim.id]
        f1.see(bool(on_victim) and all(a.error_kind is ErrorKind.INFRASTRUCTURE for a in on_victim),
               f"killed during the upload {killer.killed[0]} after {killer.killed[1]} bytes; attempts on dev-a: "
               + ", ".join(f"{a.stage.value} {a.error_kind and a.error_kind.value} ({_gist(a.reason)})"
                           for a in on_victim))
        f1.see(all(r.status.value == "pass" for r in results) and len(results) == 4 * len(MODELS)
               and not any(r.device == victim.id for r in results),
               f"run 1: {len(results)} results, all pass, on {sorted({str(r.device) for r in results})}")
        cache_a = victim.home / work / "cache"
        entries = [p for p in cache_a.iterdir() if ".partial-" not in p.name]
        # dev-a takes two jobs at once: the kill may cut off a second upload besides the one the killer saw
        leftover = [name for name, _ in _partials(cache_a)]
        f1.see(all(store.has(p.name.split(".")[0]) for p in entries) and killer.killed[0] in leftover,
               f"dev-a's cache after its restart: {len(entries)} entries, the dead upload's partial left "
               f"(partials: {leftover})")
        old = time.time() - (STALE_PARTIAL_MIN + 60) * 60  # as if the next night: older than the sweep age
        for name in leftover:
            for path in [cache_a / name, *(cache_a / name).rglob("*")]:
                os.utime(path, (old, old))
        on_cpu0 = [a for a in attempts if a.device == "cpu-0"]
        f2.see(bool(on_cpu0) and all(a.error_kind is ErrorKind.INFRASTRUCTURE and "No space left" in (a.reason or "")
                                     for a in on_cpu0),
               f"run 1: {len(on_cpu0)} attempt(s) on cpu-0 ({', '.join(sorted({a.stage.value for a in on_cpu0}))}), "
               f"all infrastructure: {_gist(on_cpu0[0].reason) if on_cpu0 else '-'}")
        before = _evidence(engine, run1)
        page1 = _run_page(docs, run1)

        # -- run 2: the orchestrator SIGKILLed while a stage runs on a device -------------------------------------
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
        env.pop("EDGEFARM_DB_URL", None)
        orchestrator = subprocess.Popen([sys.executable, "-m", "edgefarm.cli", "nightly", "--json", *args], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
        me = psutil.Process(orchestrator.pid)
        tree: list[psutil.Process] = []
        remote: list[psutil.Process] = []
        run2 = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and orchestrator.poll() is None:
            with contextlib.suppress(psutil.Error):
                tree = me.children(recursive=True)
            remote = _processes_in(ssh_work)  # stage commands with their shells and watchers
            stages = [p for p in remote if _edgellm_command(_cmdline(p)) not in (None, "env")]
            with Session(engine) as s:
                run2 = s.scalar(select(Run.id).where(Run.status == RunStatus.RUNNING, Run.id > run1))
            server = [p for p in tree if "server" in _cmdline(p) and "prefect" in " ".join(_cmdline(p))]
            if run2 and server and stages:
                break
            time.sleep(0.1)
        assert orchestrator.poll() is None, orchestrator.stdout.read().decode() if orchestrator.stdout else ""
        assert run2 is not None and server and stages, (run2, tree, remote)
        children = ", ".join(_describe(p) for p in tree if _alive(p))
        on_device = ", ".join(_describe(p) for p in stages if _alive(p))
        os.kill(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait()
        killed_at = time.monotonic()
        survivors = [p for p in tree + remote if _alive(p)]
        while time.monotonic() < killed_at + 30 and survivors:
            time.sleep(0.2)
            survivors = [p for p in survivors if _alive(p)]
        survivors += _lingering(stage_dirs)
        f4.see(not survivors,
               f"killed pid {orchestrator.pid} with its children {children}; on the SSH devices {on_device} "
               f"({len(remote)} processes with their shells): "
               + (f"survivors {[_describe(p) for p in survivors]}" if survivors
                  else f"all gone within {time.monotonic() - killed_at:.1f} s"))
        with Session(engine) as s:
            dead = s.get(Run, run2)
            f4.see(dead is not None and dead.status is RunStatus.RUNNING,
                   f"run {run2} still marked running until someone looks")
        sc.phase("run 2 (fault 4: kill)", t0)

        # -- between runs: corrupt an engine blob and the infer request blob --------------------------------------
        engine_sha = _engine_blob(engine, run1, MODELS[0])
        request_sha = _request_sha()
        assert engine_sha is not None and store.path(request_sha).is_file()
        for sha in (engine_sha, request_sha):
            _corrupt(store.path(sha))
        assert sorted(store.verify()) == sorted([engine_sha, request_sha])

        # -- run 3: the restart ------------------------------------------------------------------------------------
        t0 = time.monotonic()
        code3, s3, out3 = _nightly_in_process(args)
        sc.phase("run 3 (restart; fault 3)", t0)
        run3 = s3["run_id"]
        assert code3 == 0, out3
        attempts, results = _tries(engine, [run3])
        f4.see(s3["failed"] == [] and all(r.status.value == "pass" for r in results)
               and len(results) == 4 * len(MODELS),
               f"run {run3}: {len(results)} results, all pass, on {sorted({str(r.device) for r in results})}, "
               f"cache hits {s3['cache_hits']}")
        with Session(engine) as s:
            dead = s.get(Run, run2)
            assert dead is not None
            partial = len(s.scalars(select(Result.id).where(Result.run_id == run2)).all())
            f4.see(dead.status is RunStatus.ERROR and dead.finished_at is not None and dead.published_at is None,
                   f"run {run2} ({partial} results recorded before the kill) reaped as {dead.status.value}, "
                   f"published_at {dead.published_at}")
        corrupt_left = store.verify()
        f3.see(not corrupt_left and store.has(request_sha) and not store.path(engine_sha).exists(),
               f"store after run {run3}: {len(list(store.list()))} blobs, corrupt {corrupt_left}; the engine "
               f"evicted at its cache lookup, the request replaced when stored again")
        builds = {r.model: r for r in results if r.stage is Stage.BUILD}
        f3.see(builds[MODELS[0]].reason != "cache hit" and builds[MODELS[1]].reason == "cache hit",
               f"{MODELS[0]} engine rebuilt on {builds[MODELS[0]].device} ({builds[MODELS[0]].reason}), "
               f"{MODELS[1]} a cache hit")
        fresh = [name for name, _ in _partials(cache_a)]  # what the kill of run 2 cut off, if anything
        f1.see(bool(leftover) and not set(leftover) & set(fresh),
               f"dev-a's dead upload(s) (backdated {STALE_PARTIAL_MIN // 60} h) swept by a later run's first contact; "
               f"{len(fresh)} newer partial(s) left (run 2's killed uploads, swept once {STALE_PARTIAL_MIN // 60} h "
               f"old)")
        all_attempts, all_results = _tries(engine, [run1, run2, run3])
        blamed = [a for a in all_attempts if "corrupt" in (a.reason or "")]
        f3.see(not blamed, f"attempts blaming a device for the corrupt blobs: "
                           f"{[(a.device, a.stage.value, (a.reason or '')[:80]) for a in blamed]}")
        later_cpu0 = [a for a in all_attempts if a.device == "cpu-0" and a.run_id != run1]
        f2.see(all(a.error_kind is ErrorKind.INFRASTRUCTURE for a in later_cpu0)
               and not any(r.device == "cpu-0" for r in all_results),
               f"runs 2-3: {len(later_cpu0)} more attempt(s) on cpu-0, no result from it; quarantined: "
               f"{sorted(quarantined(engine))}")

        # -- invariants ---------------------------------------------------------------------------------------------
        after = _evidence(engine, run1)
        lost.see(after == before, f"run {run1}: {len(after['results'])} results and publication "
                                  f"{'unchanged' if after == before else 'CHANGED'}")
        lost.see(_run_page(docs, run1) == page1 and page1 != "", f"docs/runs/run-{run1}.md unchanged")
        with Session(engine) as s:
            referenced = set(s.scalars(select(ArtifactRecord.sha256).where(ArtifactRecord.result_id.is_not(None))))
        missing = sorted(sha for sha in referenced if not store.has(sha))
        lost.see(set(missing) <= {engine_sha},
                 f"{len(referenced)} artifacts referenced by results all intact"
                 + (f" but the engine blob the fault destroyed (run {run1}'s {engine_sha[:12]}): its rebuild is "
                    f"another blob ({str(_engine_blob(engine, run3, MODELS[0]))[:12]}; engine manifests carry "
                    f"created_unix and build_seconds)" if missing == [engine_sha]
                    else f"; missing or corrupt: {missing}"))
        leftovers = _lingering(stage_dirs)
        lost.see(not leftovers, f"processes left in device work dirs: {[_describe(p) for p in leftovers]}")

        rows = query_rows(db_url, model=None, precision=None, platform=None, status=None)
        with Session(engine) as s:
            latest = {(r.model, r.platform): r.run_id for r in s.scalars(select(RowLatest))}
            published = sorted(r.id for r in s.scalars(select(Run).where(Run.published_at.is_not(None))))
            unproven = [(r.model, r.stage.value, r.status.value) for r in s.scalars(select(Result)) if
                        latest.get((r.model, r.platform)) == r.run_id and r.status.value != "pass"]
        wrong.see(published == [run1, run3] and sorted(set(latest.values())) == [run3],
                  f"published runs {published}; rows' latest run {sorted(set(latest.values()))}")
        supported = sorted(r["model"] for r in rows if r["status"] == "l0_covered")
        md = (docs / "supported-models.md").read_text().split("## Key metrics")[0]
        wrong.see(supported == sorted(MODELS) and not unproven and all(m in md for m in MODELS)
                  and all(r["run_id"] != run2 for r in rows),
                  f"supported {supported} (query and supported-models.md); unproven results in latest runs: "
                  f"{unproven}")

        seen = {(x.error_kind.value if x.error_kind else None) for x in [*all_attempts, *all_results]}
        bad = [(x.run_id, x.device, x.stage.value, x.error_kind.value, (x.reason or "")[:80])
               for x in [*all_attempts, *all_results] if x.error_kind not in OK_KINDS]
        kinds.see(not bad, f"{len(all_attempts)} attempts, {len(all_results)} results in runs {run1}-{run3}; "
                           f"kinds {sorted(str(k) for k in seen)}; others: {bad}")

        with Session(engine) as s:
            running = list(s.scalars(select(Run.id).where(Run.status == RunStatus.RUNNING)))
            held = [(lease.device_id, lease.holder) for lease in s.scalars(select(DeviceLease))]
        keys = [(r.run_id, r.model, r.precision, r.platform, r.stage, r.test_id) for r in all_results]
        consistent.see(not running and not held and len(keys) == len(set(keys)),
                       f"running runs {running}; leases held {held}; {len(keys)} results, "
                       f"{len(keys) - len(set(keys))} duplicates")
    finally:
        if orchestrator is not None and orchestrator.poll() is None:  # the test broke off before its kill
            orchestrator.kill()
            orchestrator.wait()
        sc.write()
        engine.dispose()
        postgres.drop_database(db_url.rsplit("/", 1)[1])
        ssh_hosts.ensure_up()
        for path in ssh_work:
            shutil.rmtree(path, ignore_errors=True)
    assert all(c.ok for c in sc.checks), sc.failures()
