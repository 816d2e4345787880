"""The farm end to end, with real parts: Prefect flows, the edgellm CLI on local and SSH devices, SQLite and
PostgreSQL, the artifact store. Tests in this module share one data dir and database (caches carry across)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.models import ArtifactRecord, Attempt, CacheEntry, Result, Run
from edgefarm.results.queries import passing_rows
from edgefarm.toolchains.base import driver

pytestmark = pytest.mark.usefixtures("prefect_harness")

MINI = {
    "name": "mini",
    "models": ["stories260K", "tiny-qwen3"],
    "precisions": ["fp32", "fp16", "fp8"],
    "platforms": ["x86-cpu", "orin"],
    "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                 "stages": ["export", "build", "infer", "accuracy", "bench"]},
}


def _matrix(tmp: Path, spec: dict[str, object]) -> Path:
    path = tmp / f"{spec['name']}.yml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _nightly(args: list[str]) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(app, ["nightly", "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    start = result.stdout.index('{\n  "run_id"')
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[start:])
    return result.exit_code, summary


def test_nightly_embedded_default_records_evidence_and_publishes_docs(farm_dirs: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    code, summary = _nightly(["--matrix", str(_matrix(tmp_path, MINI)), "--inventory", str(farm_dirs["inventory"]),
                              "--data-dir", str(farm_dirs["data"])])
    assert code == 0, summary
    # orin fp16 is not applicable too: the tiny models' head sizes have no TensorRT Edge-LLM attention kernel
    assert summary["plan"] == {"run": 4, "not_applicable": 8}
    assert summary["failed"] == []
    assert summary["cache_hits"] == {}
    engine = make_engine(f"sqlite:///{farm_dirs['db']}")
    with Session(engine) as s:
        rows = {(k.model, k.precision.value, k.platform) for k in passing_rows(s)}
        assert rows == {(m, p, "x86-cpu") for m in ("stories260K", "tiny-qwen3") for p in ("fp32", "fp16")}
        na = s.scalars(select(Result).where(Result.platform == "orin", Result.precision == "fp8")).all()
        assert na and all(r.status.value == "not_applicable" and "needs SM89+" in r.reason for r in na)
        metrics = s.execute(select(Result.stage, func.count()).where(Result.status == "pass")
                            .group_by(Result.stage)).all()
        assert dict((st.value, n) for st, n in metrics) == {"export": 4, "build": 4, "infer": 4, "accuracy": 4,
                                                            "bench": 4}
        made_by = set(s.execute(select(Result.toolchain, Result.toolchain_version).where(Result.status == "pass")))
        # every result names its toolchain
        assert made_by == {("edgellm-ort", driver("edgellm-ort").environment.host_version())}
        planned = set(s.scalars(select(Result.toolchain).where(Result.platform == "orin")))
        assert planned == {"tensorrt-edgellm"}  # never ONNX Runtime on an Orin, even for a not-applicable row
        revisions = set(s.scalars(select(Result.model_revision).where(Result.status == "pass")))
        assert None not in revisions and len(revisions) == 2  # one checkpoint sha256 per model
        # one digest per checkpoint: the tree sha256 that keys exports and references is the model revision, and
        # an identity quantize keeps no copy of the checkpoint
        keyed = {(e["stage"], e.get("checkpoint_sha256")) for e in s.scalars(select(CacheEntry.inputs))}
        assert {sha for stage, sha in keyed if stage == "export"} == revisions
        assert {sha for stage, sha in keyed if stage == "reference"} == revisions
        assert not s.scalars(select(ArtifactRecord).where(ArtifactRecord.kind == "checkpoint")).all()
    docs = Path(summary["docs"]["out_dir"])
    md = (docs / "supported-models.md").read_text()
    x86 = md.split("## x86-cpu\n", 1)[1]  # one table per platform: models x precisions, cells link the evidence
    assert "| Model | Params | FP32 | FP16 |" in x86
    for model, anchor in (("stories260K", "stories260k"), ("tiny-qwen3", "tiny-qwen3")):
        line = next(x for x in x86.splitlines() if x.startswith(f"| {model} | "))
        assert line.split(" | ")[1] != "-"  # its parameter count
        assert f"(runs/run-1.md#{anchor}-fp32-x86-cpu)" in line and f"(runs/run-1.md#{anchor}-fp16-x86-cpu)" in line
    assert "## orin" not in md  # nothing passed there: no table
    html = (docs / "support-matrix.html").read_text()
    assert "not_applicable" in html and "run 1" in html
    assert f"edgellm-ort {driver('edgellm-ort').environment.host_version()}" in html and "edgellm-ort" in md
    evidence = (docs / "runs" / "run-1.md").read_text()
    assert "decode_tokens_per_s" in evidence and "accuracy" in evidence
    engine.dispose()


def test_nightly_rerun_reuses_every_export_and_engine(farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    code, summary = _nightly(["--matrix", str(_matrix(tmp_path, MINI)), "--inventory", str(farm_dirs["inventory"]),
                              "--data-dir", str(farm_dirs["data"])])
    assert code == 0, summary
    assert summary["cache_hits"] == {"export": 4, "build": 4}
    engine = make_engine(f"sqlite:///{farm_dirs['db']}")
    with Session(engine) as s:
        hits = s.scalars(select(CacheEntry.hits)).all()
        assert len(hits) == 10 and all(h >= 1 for h in hits)  # 4 exports, 4 engines, 2 references (per model)
        kinds = s.scalars(select(CacheEntry.inputs)).all()
        refs = {k["checkpoint_sha256"] for k in kinds if k["stage"] == "reference"}
        assert len(refs) == 2  # one per model, shared by its precisions and platforms
        latest = s.scalar(select(func.max(Run.id)))
        reasons = s.scalars(select(Result.reason).where(Result.run_id == latest, Result.stage == "build",
                                                      Result.platform == "x86-cpu", Result.status == "pass")).all()
        assert set(reasons) == {"cache hit"}
    engine.dispose()


def test_query_answers_which_rows_pass(farm_dirs: dict[str, Path]) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["query", "--status", "l0_covered", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {(r["model"], r["precision"], r["platform"]) for r in rows} == {
        (m, p, "x86-cpu") for m in ("stories260K", "tiny-qwen3") for p in ("fp32", "fp16")}
    assert all(r["status"] == "l0_covered" and isinstance(r["run_id"], int) for r in rows)
    assert {(r["toolchain"], r["toolchain_version"]) for r in rows} == {
        ("edgellm-ort", driver("edgellm-ort").environment.host_version())}
    csv_out = runner.invoke(app, ["query", "--platform", "orin", "--format", "csv"])
    assert csv_out.exit_code == 0 and "not_applicable" in csv_out.output
    bad = runner.invoke(app, ["query", "--precision", "fp9"])
    assert bad.exit_code == 2 and "unknown precision 'fp9'" in bad.output


def test_l0_list_run_on_the_local_device(farm_dirs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["run", "--priority", "l0_pipeline_x86cpu", "--inventory",
                                      str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"])])
    assert result.exit_code == 0, result.output
    engine = make_engine(f"sqlite:///{farm_dirs['db']}")
    with Session(engine) as s:
        run = s.scalars(select(Run).order_by(Run.id.desc())).first()
        assert run is not None and run.kind.value == "l0" and run.status.value == "passed"
        ids = set(s.scalars(select(Result.test_id).where(Result.run_id == run.id)))
        assert "stories260K-fp32-mxsl256-mxbs2-mxil128" in ids and len(ids) == 7
        assert "tiny-qwen3-128-int4-awq-int4_awq-mxsl256-mxbs2-mxil128" in ids  # pre-quantized: no quantizer
    engine.dispose()


def test_nightly_on_ssh_devices_survives_a_killed_host(ssh_hosts, device_python, postgres,
                                                       farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    from edgefarm.tasks.progress import subscribe

    postgres_url = postgres.create_database()
    ssh_hosts.ensure_up()
    inventory = ssh_hosts.write_inventory(tmp_path / "inventory", extra={"python": device_python.python,
                                                                          "env": device_python.env})
    (inventory / "local-cpu.yaml").write_text((farm_dirs["inventory"] / "local-cpu.yaml").read_text())
    victim = ssh_hosts[0]
    killed: list[str] = []

    def kill_after_first_stage(event) -> None:
        if event.device == victim.id and not killed:
            killed.append(event.job)
            victim.kill()

    spec = {**MINI, "name": "ssh", "precisions": ["fp32", "fp16"], "platforms": ["x86-cpu"],
            "models": ["stories260K", "tiny-qwen2", "tiny-llama"]}
    unsubscribe = subscribe(kill_after_first_stage)
    try:
        code, summary = _nightly(["--matrix", str(_matrix(tmp_path, spec)), "--inventory", str(inventory),
                                  "--db", postgres_url, "--data-dir", str(farm_dirs["data"]),
                                  "--docs-dir", str(tmp_path / "docs")])
    finally:
        unsubscribe()
        ssh_hosts.ensure_up()
    assert killed, "the victim host never ran a stage"
    assert code == 0, summary
    engine = make_engine(postgres_url)
    with Session(engine) as s:
        run_id = summary["run_id"]
        results = s.scalars(select(Result).where(Result.run_id == run_id)).all()
        keys = [(r.model, r.precision, r.platform, r.stage, r.test_id) for r in results]
        assert len(keys) == len(set(keys)) == 6 * 5  # no duplicate rows, every stage of every job recorded
        assert all(r.status.value == "pass" for r in results)
        failed = s.scalars(select(Attempt).where(Attempt.run_id == run_id, Attempt.device == victim.id,
                                                 Attempt.status == "error")).all()
        assert failed, "the killed host's attempts must be recorded"
        assert all(a.error_kind.value == "infrastructure" for a in failed)
        assert all(a.toolchain == "edgellm-ort" for a in failed)  # a failed try still names its toolchain
        used = {r.device for r in results} - {"orchestrator", None}
        assert len(used) >= 2  # the work really spread over devices
    engine.dispose()


def test_gc_keeps_every_referenced_artifact(farm_dirs: dict[str, Path]) -> None:
    from edgefarm.artifacts.store import ArtifactStore
    from edgefarm.results import cache
    from edgefarm.results.recorder import Recorder

    store = ArtifactStore(farm_dirs["data"] / "artifacts")
    stray = store.put(b"an artifact nothing refers to")
    store.close()  # the process that put it is done with it: only a reference would keep it now
    os.utime(store.path(stray.sha256), (0, 0))  # last stored long ago
    result = CliRunner().invoke(app, ["gc", "--older-than-days", "1", "--data-dir", str(farm_dirs["data"])])
    assert result.exit_code == 0, result.output
    assert "removed 1 unreferenced blob(s)" in result.output
    assert not store.has(stray.sha256)
    engine = make_engine(f"sqlite:///{farm_dirs['db']}")
    referenced = Recorder(engine).referenced_artifacts() | cache.referenced(engine)
    engine.dispose()
    assert referenced and all(store.has(sha) for sha in referenced)
    assert store.verify() == []
