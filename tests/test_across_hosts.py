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

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm.flows.revision import current
from edgefarm.results.db import make_engine
from edgefarm.results.models import ArtifactRecord, Result, Run, RunWorker
from tests.fixtures.lab import CACHE_GB, RUN_TIMEOUT_S, Lab, running_lab
from tests.helpers.toolchain_env import link_real_toolchain

REPO = Path(__file__).resolve().parents[1]
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
# the nightly's worker sends its quantize stages to pool x86-h200, whose worker (a CPU here) stands in for a GPU host
WORKERS = {"orchestrator": {"EDGEFARM_QUANTIZE_ON": "x86-h200"}, "x86-cpu": {}, "x86-h200": {}}


@pytest.fixture
def lab(postgres, moto_s3, ssh_hosts, device_python, trt_env: Path, tmp_path: Path) -> Iterator[Lab]:
    ssh_hosts.ensure_up()
    inventory = ssh_hosts.write_inventory(tmp_path / "inventory", extra={"python": device_python.python,
                                                                          "env": device_python.env})
    with running_lab(tmp_path / "lab", postgres=postgres, moto=moto_s3, inventory=inventory, workers=WORKERS,
                     toolchain=trt_env) as made:
        yield made


def _rows(s: Session, run_id: int) -> dict[tuple[str, str, str, str], Result]:
    return {(r.model, r.precision.value, r.platform, r.stage): r
            for r in s.scalars(select(Result).where(Result.run_id == run_id))}


def _artifacts(s: Session, run_id: int) -> set[str]:
    return set(s.scalars(select(ArtifactRecord.sha256).where(ArtifactRecord.run_id == run_id)))


def _products(s: Session, result: Result, read: Callable[[str], bytes]) -> dict[str, str]:
    """What a result's checkpoint or export is, by digest: the files of a quantized checkpoint (its blob also holds
    the quantizer's report and log, with the run's paths and times), an export's files as its manifest lists them
    (the manifest records the export's duration too)."""
    found: dict[str, str] = {}
    for a in s.scalars(select(ArtifactRecord).where(ArtifactRecord.result_id == result.id)):
        if a.kind.value not in ("checkpoint", "onnx"):
            continue
        with tarfile.open(fileobj=io.BytesIO(read(a.sha256))) as tar:
            if a.kind.value == "checkpoint":
                for member in tar.getmembers():
                    data = tar.extractfile(member) if member.isfile() else None
                    if data is not None and member.name.startswith("checkpoint/"):
                        found[member.name] = hashlib.sha256(data.read()).hexdigest()
            else:
                data = tar.extractfile("export_manifest.json")
                assert data is not None
                found |= {name: f["sha256"] for name, f in json.loads(data.read())["files"].items()}
    return found


def _blobs_under(root: Path) -> list[Path]:
    """Files a data dir holds in an artifact store of its own (the bucket is the only store here)."""
    store = root / "artifacts"
    return [p for p in store.rglob("*") if p.is_file()] if store.exists() else []


def test_two_workers_and_a_quantization_pool_run_one_correct_nightly(lab: Lab, trt_env: Path,
                                                                    tmp_path: Path) -> None:
    matrix = tmp_path / "across-hosts.yml"
    matrix.write_text(yaml.safe_dump(MATRIX))
    started = time.time()
    l0 = lab.deployment_run("run-test-list/l0-x86-cpu", {})  # on the x86-cpu worker, meanwhile
    lab.finish(lab.deployment_run("nightly-support-matrix/nightly", {"matrix": str(matrix)}), "the nightly")
    lab.finish(l0, "the L0 run")
    wall = time.time() - started

    here = current()
    engine = make_engine(lab.db_url)
    with Session(engine) as s:
        runs = {str(r.kind): r for r in s.scalars(select(Run).where(Run.trigger == "deployment")).all()}
        assert set(runs) == {"nightly", "l0"}, f"runs: {sorted(runs)}\n{lab.tail()}"  # started by hand
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
        referenced = _artifacts(s, nightly.id) | _artifacts(s, l0_run.id)
        missing = [sha for sha in referenced if f"farm/sha256/{sha[:2]}/{sha[2:]}" not in keys]
        assert len(referenced) >= 10
        assert not missing, f"artifacts not in the bucket: {missing}"
    for pool, root in lab.data.items():
        assert _blobs_under(root) == [], f"{pool}'s data dir keeps artifact bytes outside its cache"
        cache = root / "artifact-cache"
        held = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
        assert held <= CACHE_GB * 1e9, f"{pool}'s read-through cache holds {held} B, over its {CACHE_GB} GB bound"
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
    proc = subprocess.run([sys.executable, "-m", "edgefarm.cli", "nightly", "--matrix", str(matrix), "--data-dir",
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
            a = _products(s, here_rows[key], lambda sha: lab.client.get_object(
                Bucket=lab.bucket, Key=f"farm/sha256/{sha[:2]}/{sha[2:]}")["Body"].read())
            b = _products(s_local, there[key], lambda sha: (embedded / "artifacts" / "sha256" / sha[:2] /
                                                              sha[2:]).read_bytes())
            assert a == b, f"{key}: products differ between two workers with S3 and the embedded run"
            compared += len(a)
        # the quantized checkpoint's files, and both exports' model.onnx and model.onnx.data at least
        assert compared >= 8, f"the comparison saw too few products to mean anything ({compared})"
    local.dispose()

    # a nightly from a fresh data dir takes its products from the bucket
    shutil.rmtree(lab.data["orchestrator"] / "docs")
    for child in lab.data["orchestrator"].iterdir():
        if child.name != "toolchains":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    lab.finish(lab.deployment_run("nightly-support-matrix/nightly", {"matrix": str(matrix)}), "the second nightly")
    with Session(engine) as s:
        again = s.scalars(select(Run).where(Run.kind == "nightly").order_by(Run.id.desc())).first()  # type: ignore[arg-type]
        assert again is not None and again.id != nightly.id and again.status.value == "passed"
        rows = _rows(s, again.id)
        for key, row in rows.items():
            if key[3] in ("quantize", "export", "build"):
                assert (row.reason or "").find("cache hit") >= 0, f"{key} was not taken from the bucket: {row.reason}"
    engine.dispose()
    print(f"two workers + quantization pool: nightly and L0 in {wall:.0f} s")

