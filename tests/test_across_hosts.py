"""The farm across hosts, as infra/README.md runs it: a Prefect server on PostgreSQL, the results database on
PostgreSQL, the artifact store in an S3 bucket (moto in server mode), SSH devices, and three `prefect worker start`
processes, each with its own data dir and nothing shared on disk: pool `orchestrator` (the nightly), pool `x86-cpu`
(its L0 list) and pool `x86-h200`, a CPU worker standing in for a GPU host that the nightly sends its quantize
stages to (EDGEFARM_QUANTIZE_ON). The deployments are registered from infra/prefect.yaml and triggered with
`prefect deployment run`. Then: every result is in PostgreSQL with the workers and the revision that made it,
every artifact in the bucket, no artifact bytes under a data dir, the docs published; the same matrix run embedded
(`edgefarm nightly`, SQLite, a local store) gives the same statuses and digests; and a nightly from a fresh data
dir takes every product from the bucket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from flows.revision import current
from flows.serve import PREFECT_YAML, start_server, stop_server
from results.db import make_engine
from results.models import ArtifactRecord, Result, Run, RunWorker
from tests.fixtures.sshd import free_port
from tests.helpers.toolchain_env import link_real_toolchain

REPO = Path(__file__).resolve().parents[1]
POOLS = ("orchestrator", "x86-cpu", "orin", "thor", "x86-h200")  # infra/README.md creates these
WORKERS = ("orchestrator", "x86-cpu", "x86-h200")
MATRIX = {
    "name": "across-hosts",
    "models": ["stories260K"],
    "precisions": ["fp32"],
    "platforms": ["x86-cpu"],
    "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                 "stages": ["export", "build", "infer", "accuracy"]},
    "extra": [{"models": ["stories260K"], "precisions": ["int8_sq"], "platforms": ["x86-cpu"],
               "defaults": {"stages": ["quantize", "export", "build", "infer", "accuracy"]}}],
}
RUN_TIMEOUT_S = 900


def _prefect(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", "prefect", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@dataclass
class Lab:
    env: dict[str, str]  # what every process shares: the Prefect API, the database, the bucket, the inventory
    data: dict[str, Path]  # each worker's own data dir
    db_url: str
    bucket: str
    client: object  # boto3 S3 client of the bucket's server
    logs: Path

    def worker_env(self, pool: str) -> dict[str, str]:
        env = {**self.env, "EDGEFARM_DATA_DIR": str(self.data[pool])}
        if pool == "orchestrator":
            env["EDGEFARM_QUANTIZE_ON"] = "x86-h200"  # the nightly's quantize stages go to that pool's worker
        return env

    def objects(self) -> set[str]:
        keys: set[str] = set()
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)  # type: ignore[attr-defined]
        for page in pages:
            keys |= {o["Key"] for o in page.get("Contents", [])}
        return keys

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
                         for p in sorted(self.logs.glob("*.log")))


@pytest.fixture
def lab(postgres, moto_s3, ssh_hosts, device_python, trt_env: Path, tmp_path: Path) -> Iterator[Lab]:
    logs = tmp_path / "logs"
    logs.mkdir()
    prefect_db = postgres.create_database().replace("postgresql+psycopg://", "postgresql+asyncpg://")
    db_url = postgres.create_database()
    bucket = moto_s3.create_bucket()
    ssh_hosts.ensure_up()
    inventory = ssh_hosts.write_inventory(tmp_path / "inventory", extra={"python": device_python.python,
                                                                          "env": device_python.env})
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EDGEFARM_", "AWS_"))}
    base.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
                PREFECT_LOGGING_LEVEL="WARNING", PREFECT_HOME=str(tmp_path / "prefect-home"),
                PREFECT_API_DATABASE_CONNECTION_URL=prefect_db)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(base)  # start_server passes its own environment to the server
    try:
        server, api_url = start_server("127.0.0.1", free_port(), logs / "prefect-server.log")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    base.pop("PREFECT_API_DATABASE_CONNECTION_URL")
    env = {**base, **moto_s3.env(), "PREFECT_API_URL": api_url, "PYTHONPATH": str(REPO), "EDGEFARM_HOME": str(REPO),
           "EDGEFARM_DB_URL": db_url, "EDGEFARM_INVENTORY": str(inventory),
           "EDGEFARM_ARTIFACTS": f"s3://{bucket}/farm", "EDGEFARM_ARTIFACT_CACHE_GB": "0.05",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2"}
    data = {pool: tmp_path / f"data-{pool}" for pool in WORKERS}
    for pool in ("orchestrator", "x86-h200"):  # the hosts that plan or run the quantizer have it installed
        link_real_toolchain(data[pool], trt_env)
    made = Lab(env=env, data=data, db_url=db_url, bucket=bucket, client=moto_s3.client(), logs=logs)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        # infra/README.md's commands: the pools, then every deployment of infra/prefect.yaml
        for pool in POOLS:
            _prefect(["work-pool", "create", pool, "--type", "process"], env)
        _prefect(["--no-prompt", "deploy", "--all", "--prefect-file", str(PREFECT_YAML)], env)
        for pool in WORKERS:
            with (logs / f"worker-{pool}.log").open("wb") as out:
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
                     "--name", f"worker-{pool}"], env=made.worker_env(pool), cwd=REPO, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True))
        yield made
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_server(server)


def _run_deployment(lab: Lab, name: str, params: dict[str, object]) -> None:
    args = ["deployment", "run", name, "--watch", "--watch-timeout", str(RUN_TIMEOUT_S), "--watch-interval", "3"]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    proc = subprocess.run([sys.executable, "-m", "prefect", *args], env=lab.env, cwd=REPO, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S + 60, check=False)
    assert proc.returncode == 0, f"{name} did not complete:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}\n{lab.tail()}"


def _start_deployment(lab: Lab, name: str, params: dict[str, object]) -> subprocess.Popen[str]:
    args = ["deployment", "run", name, "--watch", "--watch-timeout", str(RUN_TIMEOUT_S), "--watch-interval", "3"]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    return subprocess.Popen([sys.executable, "-m", "prefect", *args], env=lab.env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _rows(s: Session, run_id: int) -> dict[tuple[str, str, str, str], Result]:
    return {(r.model, r.precision.value, r.platform, r.stage): r
            for r in s.scalars(select(Result).where(Result.run_id == run_id))}


def _artifacts(s: Session, run_id: int) -> set[str]:
    return set(s.scalars(select(ArtifactRecord.sha256).where(ArtifactRecord.run_id == run_id)))


def _products(s: Session, result: Result) -> set[tuple[str, str]]:
    """The checkpoints and ONNX exports a result names as its evidence, by kind and digest."""
    return {(a.kind.value, a.sha256) for a in s.scalars(select(ArtifactRecord).where(
        ArtifactRecord.result_id == result.id)) if a.kind.value in ("checkpoint", "onnx")}


def _blobs_under(root: Path) -> list[Path]:
    """Files a data dir holds in an artifact store of its own (the bucket is the only store here)."""
    store = root / "artifacts"
    return [p for p in store.rglob("*") if p.is_file()] if store.exists() else []


def test_two_workers_and_a_quantization_pool_run_one_correct_nightly(lab: Lab, trt_env: Path,
                                                                    tmp_path: Path) -> None:
    matrix = tmp_path / "across-hosts.yml"
    matrix.write_text(yaml.safe_dump(MATRIX))
    started = time.time()
    l0 = _start_deployment(lab, "run-test-list/l0-x86-cpu", {})  # on the x86-cpu worker, meanwhile
    _run_deployment(lab, "nightly-support-matrix/nightly", {"matrix": str(matrix)})
    out, _ = l0.communicate(timeout=RUN_TIMEOUT_S + 60)
    assert l0.returncode == 0, f"the L0 run did not complete:\n{out[-3000:]}\n{lab.tail()}"
    wall = time.time() - started

    here = current()
    engine = make_engine(lab.db_url)
    with Session(engine) as s:
        runs = {r.kind: r for r in s.scalars(select(Run).where(Run.trigger == "deployment")).all()}
        assert set(runs) == {"nightly", "l0"}, f"runs: {sorted(runs)}\n{lab.tail()}"
        nightly, l0_run = runs["nightly"], runs["l0"]
        assert nightly.status.value == "passed" and l0_run.status.value == "passed", lab.tail()
        rows = _rows(s, nightly.id)
        assert {k[:3] for k in rows} == {("stories260K", "fp32", "x86-cpu"), ("stories260K", "int8_sq", "x86-cpu")}
        assert {r.status.value for r in rows.values()} == {"pass"}, {k: r.reason for k, r in rows.items()}
        quantized = rows[("stories260K", "int8_sq", "x86-cpu", "quantize")]
        assert "on pool x86-h200" in (quantized.reason or ""), quantized.reason
        assert {r.status.value for r in s.scalars(select(Result).where(Result.run_id == l0_run.id))} == {"pass"}

        # one code revision: the orchestrator and the quantization worker of the nightly, the L0's orchestrator
        workers = s.scalars(select(RunWorker).order_by(RunWorker.id)).all()
        seen = {(w.run_id, w.role, w.pool, w.data_dir) for w in workers}
        assert (nightly.id, "orchestrator", "orchestrator", str(lab.data["orchestrator"])) in seen, seen
        assert (nightly.id, "quantize", "x86-h200", str(lab.data["x86-h200"])) in seen, seen
        assert (l0_run.id, "orchestrator", "x86-cpu", str(lab.data["x86-cpu"])) in seen, seen
        assert {w.source_digest for w in workers} == {here.source}
        assert all(w.accepted for w in workers)
        assert nightly.code_version == here.git

        # every artifact in the bucket; none under a data dir
        keys = lab.objects()
        missing = [sha for sha in _artifacts(s, nightly.id) | _artifacts(s, l0_run.id)
                   if not any(sha in k for k in keys)]
        assert not missing, f"artifacts not in the bucket: {missing}"
    for pool, root in lab.data.items():
        assert _blobs_under(root) == [], f"{pool}'s data dir keeps artifact bytes outside its cache"
        cache = root / "artifact-cache"
        held = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
        assert held <= 0.05 * 1e9, f"{pool}'s read-through cache holds {held} B, over its 0.05 GB bound"
    docs = lab.data["orchestrator"] / "docs" / "supported-models.md"
    assert docs.is_file(), "the nightly did not publish its docs"
    assert "stories260K" in docs.read_text()

    # the same matrix embedded (`edgefarm nightly`: SQLite, a local store, the local device): the same evidence
    embedded = tmp_path / "embedded"
    link_real_toolchain(embedded, trt_env)
    inventory = tmp_path / "inventory-local"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(embedded / "devices" / "local-cpu"),
        "labels": ["cpu"], "max_jobs": 2, "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    env = {k: v for k, v in lab.env.items() if not k.startswith(("PREFECT_API_URL", "EDGEFARM_", "AWS_"))}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "nightly", "--matrix", str(matrix), "--data-dir",
                           str(embedded), "--inventory", str(inventory), "--json"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    local = make_engine(f"sqlite:///{embedded / 'edgefarm.db'}")
    with Session(local) as s_local, Session(engine) as s:
        run_id = s_local.scalars(select(Run.id).order_by(Run.id.desc())).first()
        assert run_id is not None
        there, here_rows = _rows(s_local, run_id), _rows(s, nightly.id)
        assert {k: r.status.value for k, r in there.items()} == {k: r.status.value for k, r in here_rows.items()}
        compared = 0
        for key in (k for k in here_rows if k[3] in ("quantize", "export")):
            a, b = _products(s, here_rows[key]), _products(s_local, there[key])
            assert a == b, f"{key}: products differ between two workers with S3 and the embedded run"
            compared += len(a)
        assert compared >= 3, "the comparison saw too few products to mean anything"
    local.dispose()

    # a nightly from a fresh data dir takes its products from the bucket
    shutil.rmtree(lab.data["orchestrator"] / "docs")
    for child in lab.data["orchestrator"].iterdir():
        if child.name != "toolchains":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    _run_deployment(lab, "nightly-support-matrix/nightly", {"matrix": str(matrix)})
    with Session(engine) as s:
        again = s.scalars(select(Run).where(Run.kind == "nightly").order_by(Run.id.desc())).first()
        assert again is not None and again.id != nightly.id and again.status.value == "passed"
        rows = _rows(s, again.id)
        for key, row in rows.items():
            if key[3] in ("quantize", "export", "build"):
                assert (row.reason or "").find("cache hit") >= 0, f"{key} was not taken from the bucket: {row.reason}"
    engine.dispose()
    print(f"two workers + quantization pool: nightly and L0 in {wall:.0f} s")

