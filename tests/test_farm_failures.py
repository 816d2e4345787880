"""The farm's promises where they matter, on the real local device under the real Prefect harness: a stage that
genuinely fails is tried once, recorded as `fail` (a test failure, never retried), makes the command exit 1, keeps
its row out of supported-models.md and shows it as fail in the HTML matrix; `edgefarm docs` regenerated from the
database gives the same files."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.models import Attempt, Result, Run
from tests.fixtures.farm import FAILING

pytestmark = pytest.mark.usefixtures("prefect_harness")

def _text_files(root: Path) -> dict[str, str]:
    """Every generated text file, without its generation time stamp."""
    return {str(p.relative_to(root)): "\n".join(ln for ln in p.read_text().splitlines() if "Generated" not in ln)
            for p in sorted(root.rglob("*")) if p.suffix in (".md", ".html")}


def test_a_failing_stage_is_tried_once_recorded_and_kept_out_of_the_docs(farm_dirs: dict[str, Path],
                                                                          tmp_path: Path,
                                                                          impossible_catalog: None) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    matrix = tmp_path / "failing.yml"
    matrix.write_text(yaml.safe_dump(FAILING))
    db = f"sqlite:///{tmp_path / 'failing.db'}"
    docs = tmp_path / "docs"
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--db", db, "--inventory",
                                      str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"]),
                                      "--docs-dir", str(docs)])
    assert result.exit_code == 1, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    assert summary["failed"] == ["stories260K-fp32-mxsl256-mxbs2-mxil128@x86-cpu"]

    engine = make_engine(db)
    with Session(engine) as s:
        run = s.get(Run, summary["run_id"])
        assert run is not None and run.status.value == "failed" and run.published_at is not None
        got = {r.stage.value: r for r in s.scalars(select(Result).where(Result.run_id == run.id))}
        assert got["accuracy"].status.value == "fail" and got["accuracy"].error_kind.value == "test_failure"
        assert "logits_max_abs_diff" in (got["accuracy"].reason or "")
        assert got["build"].status.value == got["infer"].status.value == "pass"
        # one try on one device, kept as a test failure: nothing moved to another device, nothing retried
        tries = s.scalars(select(Attempt).where(Attempt.run_id == run.id, Attempt.stage == "accuracy")).all()
        assert [(a.device, a.status.value, a.error_kind.value) for a in tries] == [
            ("local-cpu", "fail", "test_failure")]
    engine.dispose()
    with get_client(sync_client=True) as client:
        flows = [f for f in client.read_flow_runs() if f.parameters.get("matrix") == str(matrix)]
        assert len(flows) == 1
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flows[0].id])))
    acc = [t for t in tasks if t.name.startswith("accuracy")]
    assert len(acc) == 1 and acc[0].run_count == 1, [(t.name, t.run_count) for t in acc]  # no retry

    md = (docs / "supported-models.md").read_text()
    assert "stories260K" not in md.split("## Key metrics")[0] and "No combination has passing evidence" in md
    html = (docs / "support-matrix.html").read_text()
    assert "<td class='cell failing'" in html and f"run {run.id}" in html
    query = CliRunner().invoke(app, ["query", "--db", db, "--format", "json"])
    assert [(r["model"], r["status"]) for r in json.loads(query.output)] == [("stories260K", "failing")]

    again = tmp_path / "again"
    regenerated = CliRunner().invoke(app, ["docs", "--db", db, "--out", str(again)])
    assert regenerated.exit_code == 0, regenerated.output
    assert _text_files(again) == _text_files(docs)
    assert sorted(p.name for p in again.rglob("*.png")) == sorted(p.name for p in docs.rglob("*.png"))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: the orchestrator's data dir fills up on the first export."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_infrastructure_and_the_run_ends(farm_dirs: dict[str, Path], tiny_disk: Path,
                                                        tmp_path: Path) -> None:
    matrix = tmp_path / "full.yml"
    matrix.write_text(yaml.safe_dump({**FAILING, "name": "full", "defaults": {
        **FAILING["defaults"], "timeout": 600}}))  # type: ignore[dict-item]
    db = f"sqlite:///{tmp_path / 'full.db'}"  # the database lives elsewhere (PostgreSQL in production)
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--db", db, "--inventory",
                                      str(farm_dirs["inventory"]), "--data-dir", str(tiny_disk),
                                      "--docs-dir", str(tmp_path / "docs")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1, result.output
    engine = make_engine(db)
    with Session(engine) as s:
        run = s.scalars(select(Run)).one()
        assert run.status.value == "error" and run.finished_at is not None  # ended, never left running
        export = s.scalars(select(Result).where(Result.run_id == run.id, Result.stage == "export")).one()
        assert (export.status.value, export.error_kind.value) == ("error", "infrastructure"), export.reason
        assert "No space left on device" in (export.reason or "")
        later = s.scalars(select(Result).where(Result.run_id == run.id, Result.stage != "export")).all()
        assert later and all(r.status.value == "skipped" for r in later)
    engine.dispose()


def test_an_active_waiver_waives_and_an_expired_one_runs(farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    defaults = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128, "stages": ["export", "build", "infer"]}
    (lists / "l0_waived.yml").write_text(yaml.safe_dump({
        "name": "l0_waived", "stage": "l0", "description": "waivers reach a run", "platforms": {"terms": ["x86-cpu"]},
        "defaults": defaults, "tests": [{"model": "stories260K", "precision": "fp32"},
                                        {"model": "stories260K", "precision": "fp16"}]}))
    (lists / "waivers.yml").write_text(yaml.safe_dump({"waivers": [
        {"pattern": "stories260K-fp32-*", "platforms": ["x86-cpu"], "bug": "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/1",
         "expires": "2099-01-01", "reason": "active: known issue"},
        {"pattern": "stories260K-fp16-*", "platforms": ["x86-cpu"], "bug": "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/2",
         "expires": "2020-01-01", "reason": "expired: must run again"},
    ]}))
    db = f"sqlite:///{tmp_path / 'waived.db'}"
    result = CliRunner().invoke(app, ["run", "--priority", str(lists / "l0_waived.yml"), "--db", db,
                                      "--inventory", str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"])])
    assert result.exit_code == 0, result.output
    engine = make_engine(db)
    with Session(engine) as s:
        got = {(r.precision.value, r.stage.value): r for r in s.scalars(select(Result))}
        tries = {(a.precision.value, a.stage.value) for a in s.scalars(select(Attempt))}
    engine.dispose()
    assert {st: got[("fp32", st)].status.value for st in ("export", "build", "infer")} == {
        "export": "waived", "build": "waived", "infer": "waived"}
    assert "issues/1)" in (got[("fp32", "infer")].reason or "")
    assert not any(p == "fp32" for p, _ in tries)  # the waived job never ran
    assert {st: got[("fp16", st)].status.value for st in ("export", "build", "infer")} == {
        "export": "pass", "build": "pass", "infer": "pass"}  # the expired waiver waives nothing


def test_a_bench_never_shares_its_device_with_another_lease(farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    import threading

    from sqlalchemy.exc import OperationalError

    from edgefarm.results.models import DeviceLease

    matrix = tmp_path / "bench.yml"
    matrix.write_text(yaml.safe_dump({"name": "bench", "models": ["stories260K", "tiny-qwen3"],
                                      "precisions": ["fp32", "fp16"], "platforms": ["x86-cpu"],
                                      "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                                                   "stages": ["export", "build", "infer", "bench"]}}))
    path = tmp_path / "bench.db"
    db = f"sqlite:///{path}"
    seen: list[list[tuple[str, int]]] = []  # every sample of the leases held: (device, slots)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            if path.exists():
                engine = make_engine(db)
                try:
                    while not stop.wait(0.02):
                        with Session(engine) as s:
                            seen.append([(lease.device_id, lease.slots) for lease in s.scalars(select(DeviceLease))])
                except OperationalError:  # the schema is not there yet: sample again
                    stop.wait(0.1)
                finally:
                    engine.dispose()
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--db", db, "--inventory",
                                          str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"]),
                                          "--docs-dir", str(tmp_path / "docs")])
    finally:
        stop.set()
        sampler.join()
    assert result.exit_code == 0, result.output
    exclusive = [held for held in seen if any(slots == 2 for _, slots in held)]  # local-cpu has max_jobs 2
    assert exclusive, f"no bench lease was ever seen in {len(seen)} samples"
    assert all(len(held) == 1 for held in exclusive), [held for held in exclusive if len(held) > 1]
    assert any(len(held) == 2 for held in seen), "the device never ran two jobs at once: nothing was tested"
