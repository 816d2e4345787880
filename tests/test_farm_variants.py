"""Variant rows through the farm, with real parts (issue 23): Prefect, NVIDIA's exporter (the session's ``trt_env``)
on the host for Thor, the results database and the docs.

One matrix: the EAGLE3 pair (the draft runs after its base) and a reduced vocabulary of tiny-llama, export only.
Checked: every row passes its export with its variant's structure checked, each is recorded as its own row with its
variant, the exports stored are the exporter's whole output (llm/ and, for the base, what its draft reads), the
Edge-LLM-layout page lists the draft in its EAGLE3 table. Then the gate: a draft whose base's export fails is skipped,
naming the base.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.models import Result, ResultStatus
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import StageOutcome
from tests.helpers.toolchain_env import link_real_toolchain

pytestmark = pytest.mark.usefixtures("prefect_harness")
REPO = Path(__file__).resolve().parents[1]
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}


def test_the_eagle3_pair_and_a_reduced_vocabulary_export_through_the_farm(trt_env: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data, inventory, docs = tmp_path / "data", tmp_path / "inventory", tmp_path / "docs"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"), "max_jobs": 2,
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    link_real_toolchain(data, trt_env)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
    tests = tmp_path / "variants.yml"
    tests.write_text(yaml.safe_dump({
        "name": "variants", "stage": "l0", "description": "variant exports", "platforms": {"terms": ["thor"]},
        "defaults": {**LIMITS, "stages": ["export"]},
        "tests": [{"model": "tiny-llama-4l", "precision": "fp16",
                   "speculative": {"method": "eagle3", "draft": "tiny-llama-4l-eagle3"}},
                  {"model": "tiny-llama", "precision": "fp16", "reduced_vocab": "tiny-llama-vocab256"}]}))
    result = CliRunner().invoke(app, ["run", "--priority", str(tests), "--inventory", str(inventory),
                                      "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["docs", "--out", str(docs), "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    try:
        with Session(engine) as s:
            rows = {(r.model, r.variant): r for r in s.scalars(select(Result))}
    finally:
        engine.dispose()
    assert set(rows) == {("tiny-llama-4l", "spec=eagle3-base:tiny-llama-4l-eagle3"),
                         ("tiny-llama-4l-eagle3", "spec=eagle3-draft:tiny-llama-4l"),
                         ("tiny-llama", "vocab=tiny-llama-vocab256:256")}
    for (model, _variant), r in rows.items():
        assert (r.stage, r.status, r.toolchain_version) == ("export", ResultStatus.PASS, "0.11.0"), (model, r.reason)
        assert "structure checked" in (r.reason or ""), r.reason
    # a test list's run stays off the nightly's pages (issue 26: pages per purpose) and has its own
    nightly = (docs / "edge-llm" / "supported-models.md").read_text()
    assert "tiny-llama-4l-eagle3" not in nightly
    assert "tiny-llama-4l-eagle3" in (data / "docs" / "lists" / "variants.md").read_text()
    # its rows in Edge-LLM's layout: the draft in its table with its base, the vocabulary as an extension
    from edgefarm.pages.docs_layout import write_layout_pages
    from edgefarm.toolchains.base import docs_layouts

    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    try:
        layout = next(d for d in docs_layouts() if d.directory == "edge-llm")
        write_layout_pages(engine, tmp_path / "any-run", layout, generated_at="now", db_label="SQLite", data_dir=data,
                           kinds=None)
    finally:
        engine.dispose()
    page = (tmp_path / "any-run" / "edge-llm" / "supported-models.md").read_text()
    assert "| `tiny-llama-4l-eagle3` | `tiny-llama-4l` |" in page
    assert "vocab=tiny-llama-vocab256:256" in page and "◇ implemented" in page


def _job(after: str | None = None) -> JobSpec:
    from edgellm.types import Precision

    ref = CheckpointRef(model="d", path="/nonexistent", sha256="0" * 64)
    return JobSpec(model="d", precision=Precision.FP16, platform="thor", toolchain="tensorrt-edgellm",
                   test_id="d-fp16", checkpoint=ref, max_seq_len=64, max_batch_size=1, max_input_len=32,
                   stages=("export",), after=after)


@pytest.mark.parametrize("gate", [StageOutcome.skipped("export", "upstream quantize failed"),
                                  StageOutcome(stage="export", status=ResultStatus.FAIL, reason="no hidden_states"),
                                  RuntimeError("worker lost")])
def test_a_stage_that_runs_after_another_is_skipped_unless_that_one_passed(gate: object) -> None:
    """The gate (``JobSpec.after``): the draft's export runs only once its base's export passed; otherwise it is
    skipped with the base's job and why, before any work (the quantize outcome it needs passed)."""
    from edgefarm.tasks.common import run_stage

    quantized = StageOutcome(stage="quantize", status=ResultStatus.PASS)
    out = run_stage(None, "export", _job(after="b-fp16@thor"), (quantized, gate))  # type: ignore[arg-type]
    assert out.status is ResultStatus.SKIPPED
    assert out.reason is not None and out.reason.startswith("runs after b-fp16@thor, whose export did not pass (")
    assert json.dumps(out.reason)  # plain text, recordable
