"""A toolchain is one file (plus the device type that places it on a platform): a toy driver defined only in
tests/helpers/toy_toolchain.py is planned and run through every stage by the generic layers (quantize, export,
build, infer, accuracy, bench), its version read back from the device, its results and cache entries named after it;
and no generic layer names any registered toolchain (README "Extending the farm" keeps these counts)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.models import CacheEntry, Result
from edgefarm.toolchains import base as toolchains
from tests.helpers import toy_toolchain
from tests.helpers.registries import registries_with

REPO = Path(__file__).resolve().parents[1]
GENERIC = ("tasks", "flows", "pages", "cli", "registries", "devices", "stages", "results", "artifacts", "test_lists")


@pytest.fixture
def toy() -> Iterator[str]:
    """The toy registered (its module's one class) and named by x86-cpu's device type (what its YAML would say)."""
    with registries_with(toolchains=[toy_toolchain.ToyEcho], toolchains_on={"x86-cpu": [toy_toolchain.NAME]}):
        yield toy_toolchain.NAME


@pytest.mark.usefixtures("prefect_harness")
def test_a_toolchain_defined_in_one_file_runs_every_stage(toy: str, tmp_path: Path) -> None:
    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"),
        "python": __import__("sys").executable, "env": {"PYTHONPATH": str(REPO)}}))
    matrix = tmp_path / "toy.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "toy", "models": ["stories260K"], "precisions": ["int4_wo"], "platforms": ["x86-cpu"],
        "toolchains": [toy], "defaults": {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32,
                                          "stages": ["quantize", "export", "build", "infer", "accuracy", "bench"]},
        "extra": [{"models": ["stories260K"], "precisions": ["fp16"], "platforms": ["x86-cpu"], "toolchains": [toy],
                   "defaults": {"stages": ["export", "build"]}}]}))
    args = ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory), "--data-dir", str(data),
            "--docs-dir", str(tmp_path / "docs")]
    dry = CliRunner().invoke(app, [*args[:1], "--dry-run", "--format", "json", *args[2:]])
    assert dry.exit_code == 0, dry.output
    jobs = {j["precision"]: j for j in json.loads(dry.stdout)["jobs"]}
    assert (jobs["int4_wo"]["decision"], jobs["int4_wo"]["toolchain"], jobs["int4_wo"]["quantizer"]) == (
        "run", toy, toy)
    assert jobs["fp16"]["decision"] == "not_applicable"
    assert jobs["fp16"]["reason"] == "toolchain toy-echo cannot produce fp16 (produces: int4_wo)"

    for attempt in range(2):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout[result.stdout.index('{\n  "run_id"'):])
        assert summary["failed"] == [] and summary["plan"] == {"run": 1, "not_applicable": 1}
        if attempt == 1:  # nothing changed: the checkpoint, the export and the engine are reused, verified
            assert summary["cache_hits"] == {"quantize": 1, "export": 1, "build": 1}
    with Session(make_engine(f"sqlite:///{data / 'edgefarm.db'}")) as s:
        rows = s.scalars(select(Result).where(Result.precision == "int4_wo", Result.run_id == 1)).all()
        assert {(r.stage, r.status.value) for r in rows} == {(st, "pass") for st in (
            "quantize", "export", "build", "infer", "accuracy", "bench")}
        assert {r.toolchain for r in rows} == {toy}
        versions = {r.stage: r.toolchain_version for r in rows}
        assert versions["quantize"] == versions["export"] == toy_toolchain.VERSION  # the host's
        assert {versions[s] for s in ("build", "infer", "accuracy", "bench")} == {"0.1-device"}  # read on the device
        assert all(r.test_id.endswith("-by.toy.echo") for r in rows)
        entries = s.scalars(select(CacheEntry)).all()
        assert {(e.kind.value, e.toolchain) for e in entries} >= {("checkpoint", toy), ("onnx", toy),
                                                                   ("engine_manifest", toy)}


def test_no_generic_layer_names_a_registered_toolchain() -> None:
    """tasks/, flows/, pages/, cli/, registries/, devices/ (code), stages/, results/, artifacts/ and test_lists/ ask
    drivers; only a toolchain's package, the device types that place it, matrices and docs name it."""
    names = [n for n in toolchains.names() if not n.startswith("edgellm-")]  # the library's own are generic words
    patterns = {n: re.compile(re.escape(n).replace("\\-", "[-_]"), re.IGNORECASE) for n in names}
    patterns["tensorrt"] = re.compile(r"tensorrt|\bllm_(?:build|inference|bench)\b", re.IGNORECASE)
    found = []
    for package in GENERIC:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" in path.parts:  # frozen history: 0004 added a toolchain by name
                continue
            text = path.read_text(encoding="utf-8")
            found += [f"{path.relative_to(REPO)}: {name}" for name, rx in patterns.items() if rx.search(text)]
    assert found == []
