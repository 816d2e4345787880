"""A stage sent to another worker (quantize_on) and one code revision per run, piece by piece: the job and its
outcome over the wire, the source digest, the worker that refuses another revision, another store or another
checkpoint, and the settings and matrix field that ask for it. The whole path through real workers:
tests/test_across_hosts.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.flows.execute import quantization_pool
from edgefarm.flows.plan import Plan, load_matrix
from edgefarm.flows.quantize_remote import quantize_checkpoint
from edgefarm.flows.revision import current, require_same, source_digest
from edgefarm.flows.settings import Settings
from edgefarm.results.db import make_engine
from edgefarm.results.models import ResultStatus, RunKind, RunWorker
from edgefarm.results.recorder import Recorder
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.stages.wire import job_from_json, job_to_json, outcome_from_json, outcome_to_json
from edgefarm.test_lists.catalog import Catalog
from edgellm.errors import ConfigurationError, ErrorKind
from edgellm.reference import checkpoint_digest
from edgellm.types import Precision

REPO = Path(__file__).resolve().parents[1]


def _job(data_dir: Path, sha256: str | None = None) -> JobSpec:
    path = Catalog.load().get("stories260K").locate(data_dir)
    return JobSpec(model="stories260K", precision=Precision.parse("int8_sq"), platform="x86-cpu",
                   toolchain="edgellm-ort", test_id="stories260K-int8_sq", max_seq_len=256, max_batch_size=2,
                   max_input_len=128, stages=("quantize", "export"), timeouts={"quantize": 600},
                   checkpoint=CheckpointRef("stories260K", str(path), sha256 or checkpoint_digest(path)),
                   toolchain_versions=(("tensorrt-edgellm", "0.11.0"),), quantizer="tensorrt-edgellm",
                   quantizer_version="0.11.0", calibration_samples=8)


def test_a_job_and_its_outcome_cross_the_wire_unchanged(tmp_path: Path) -> None:
    import json

    job = _job(tmp_path)
    assert job_from_json(json.loads(json.dumps(job_to_json(job)))) == job
    ref = ArtifactRef("b" * 64, 1234, ArtifactKind.CHECKPOINT, Packing.TAR)
    out = StageOutcome(stage="quantize", status=ResultStatus.FAIL, reason="accuracy", error_kind=ErrorKind.TEST_FAILURE,
                       metrics={"quantized_linears": (35.0, ""), "duration": (1.5, "s")}, artifacts=[ref],
                       outputs={"checkpoint": ref, "quantized_linears": 35, "note": "x"}, toolchain="tensorrt-edgellm",
                       toolchain_version="0.11.0")
    back = outcome_from_json(json.loads(json.dumps(outcome_to_json(out))))
    assert back == out
    assert isinstance(back.outputs["checkpoint"], ArtifactRef)
    with pytest.raises(ConfigurationError, match="does not read as a job"):
        job_from_json({**job_to_json(job), "precision": "int3_magic"})
    with pytest.raises(ConfigurationError, match="not a JSON object"):
        outcome_from_json(["quantize"])
    with pytest.raises(ConfigurationError, match="cannot be sent between workers"):
        outcome_to_json(StageOutcome(stage="quantize", status=ResultStatus.PASS, outputs={"path": tmp_path}))


def test_the_source_digest_is_the_files_not_the_host(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for root in (one, two):
        (root / "flows").mkdir(parents=True)
        (root / "flows" / "a.py").write_text("x = 1\n")
        (root / "tests").mkdir()
        (root / "tests" / "t.py").write_text("assert True\n")
    assert source_digest(one) == source_digest(two)  # same files, two checkouts
    (two / "tests" / "t.py").write_text("assert 1\n")  # tests are not the farm's code
    (two / "flows" / "__pycache__").mkdir()
    (two / "flows" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert source_digest(one) == source_digest(two)
    (two / "flows" / "a.py").write_text("x = 2\n")
    assert source_digest(one) != source_digest(two)
    (two / "flows" / "a.py").write_text("x = 1\n")
    (two / "flows" / "b.py").write_text("")
    assert source_digest(one) != source_digest(two)  # an added file counts
    here = current()
    require_same(here.source, here.git, what="quantize")
    with pytest.raises(ConfigurationError, match=r"runs revision .* the run runs 0123abc \(source ffffffffffff\); "
                                                 r"refused: one code revision per run"):
        require_same("f" * 64, "0123abc", what="quantize stories260K int8_sq")


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_a_worker_refuses_another_revision_store_or_checkpoint_and_records_why(
        migrated_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFARM_DB_URL", migrated_db_url)
    monkeypatch.setenv("EDGEFARM_DATA_DIR", str(tmp_path / "worker"))
    monkeypatch.delenv("EDGEFARM_ARTIFACTS", raising=False)
    monkeypatch.delenv("EDGEFARM_QUANTIZE_ON", raising=False)
    engine = make_engine(migrated_db_url)
    run_id = Recorder(engine).start_run(RunKind.NIGHTLY, "test", "abc")
    here = current()
    job = job_to_json(_job(tmp_path / "orchestrator"))
    cases = {
        "revision": dict(revision="0123abc", source_digest="f" * 64, artifacts=""),
        "store": dict(revision=here.git, source_digest=here.source, artifacts="s3://farm-bucket/x"),
        "checkpoint": dict(revision=here.git, source_digest=here.source, artifacts=""),
    }
    expected = {"revision": "refused: one code revision per run",
                "store": "the run's is s3://farm-bucket/x; refused",
                "checkpoint": "refused (another checkpoint revision)"}
    for name, params in cases.items():
        sent = job if name != "checkpoint" else job_to_json(_job(tmp_path / "orchestrator", "0" * 64))
        assert quantize_checkpoint.fn(job=sent, run_id=run_id, **params) == \
            "quantize stories260K int8_sq: error"
    with Session(engine) as s:
        rows = s.scalars(select(RunWorker).where(RunWorker.run_id == run_id).order_by(RunWorker.id)).all()
    assert len(rows) == 3
    for row, name in zip(rows, cases, strict=True):
        assert not row.accepted and expected[name] in (row.reason or ""), (name, row.reason)
        assert row.role == "quantize" and row.source_digest == here.source and row.revision == here.git
        assert row.data_dir == str((tmp_path / "worker").resolve())
        out = outcome_from_json(row.outcome)
        assert out.status is ResultStatus.ERROR and out.error_kind is ErrorKind.CONFIGURATION
        assert expected[name] in (out.reason or "")
    assert not (tmp_path / "worker" / "host").exists()  # refused before any work
    engine.dispose()


def test_quantize_on_is_a_pool_name_and_needs_a_shared_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"EDGEFARM_QUANTIZE_ON: bad work pool name 'GPU pool'"):
        Settings.resolve(data_dir=tmp_path, environ={"EDGEFARM_QUANTIZE_ON": "GPU pool"})
    settings = Settings.resolve(data_dir=tmp_path, environ={"EDGEFARM_QUANTIZE_ON": "x86-h200"})
    assert settings.quantize_on == "x86-h200"
    plan = Plan(name="m", kind="nightly")
    with pytest.raises(ConfigurationError, match=r"quantize_on 'x86-h200': .* set EDGEFARM_ARTIFACTS=s3://"):
        quantization_pool(plan, settings, None)
    assert quantization_pool(plan, settings, "x86-h200") is None  # the worker of that pool quantizes itself
    assert quantization_pool(plan, Settings.resolve(data_dir=tmp_path, environ={}), None) is None
    plan.quantize_on = "x86-h200"  # the matrix's, when the settings name none
    with pytest.raises(ConfigurationError, match="quantize_on 'x86-h200'"):
        quantization_pool(plan, Settings.resolve(data_dir=tmp_path, environ={}), None)


def test_a_matrix_names_its_quantization_pool(tmp_path: Path) -> None:
    src = REPO / "flows" / "matrices" / "nightly.yml"
    good = tmp_path / "good.yml"
    shutil.copyfile(src, good)
    good.write_text(good.read_text() + "quantize_on: x86-h200\n")
    assert load_matrix(good, Catalog.load()).quantize_on == "x86-h200"
    bad = tmp_path / "bad.yml"
    bad.write_text(src.read_text() + "quantize_on: ../../etc\n")
    with pytest.raises(ConfigurationError, match=r"bad.yml: quantize_on: bad work pool name '../../etc'"):
        load_matrix(bad, Catalog.load())


@pytest.mark.usefixtures("prefect_harness")
def test_quantize_on_a_pool_without_its_deployment_is_refused_before_the_run(tmp_path: Path) -> None:
    settings = Settings.resolve(data_dir=tmp_path, environ={"EDGEFARM_QUANTIZE_ON": "x86-h200",
                                                            "EDGEFARM_ARTIFACTS": "s3://farm-bucket/p"})
    with pytest.raises(ConfigurationError, match=r"no deployment quantize-checkpoint/quantize-on-x86-h200; register "
                                                 r"it \(prefect deploy --prefect-file infra/prefect.yaml --name "
                                                 r"quantize-on-x86-h200\)"):
        quantization_pool(Plan(name="m", kind="nightly"), settings, None)
