"""Quantized rows through the farm, with real parts: Prefect, NVIDIA's tensorrt-edgellm quantizer and exporter (the
session's ``trt_env``), edgellm on ONNX Runtime on the local device.

One run: x86-cpu int4_awq and int8_sq of tiny-qwen3-128 pass quantize -> export -> build -> infer -> accuracy (against
the float source's reference) -> bench; its int4_awq checkpoint also feeds TensorRT Edge-LLM's export for Thor (export
evidence only), quantized once; nvfp4 on stories260K is not applicable with the reason; a rerun hits the quantize
cache. Without the toolchain (the package registry unreachable) the rows that need it are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.models import ArtifactRecord, CacheEntry, Metric, Result
from tests.helpers.toolchain_env import link_real_toolchain

# NVIDIA's quantizer and exporter runs are shared with the session's other modules (tests/fixtures/toolchain_runs.py)
pytestmark = pytest.mark.usefixtures("prefect_harness", "shared_toolchain_runs")
REPO = Path(__file__).resolve().parents[1]
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}
MATRIX = {
    "name": "quantized",
    "models": ["tiny-qwen3-128"],
    "precisions": ["int4_awq", "int8_sq"],
    "platforms": ["x86-cpu"],
    "defaults": {**LIMITS, "stages": ["quantize", "export", "build", "infer", "accuracy", "bench"]},
    # the export list's rows of the same int4_awq checkpoint (Thor, host only) and of stories260K's nvfp4
    "lists": [{"name": "l0_checkpoint_export", "models": ["tiny-qwen3-128"], "precisions": ["int4_awq"]},
              {"name": "l0_checkpoint_export", "models": ["stories260K"], "precisions": ["nvfp4"]}],
}


def _farm(root: Path) -> tuple[Path, Path]:
    data, inventory = root / "data", root / "inventory"
    inventory.mkdir(parents=True)
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"), "max_jobs": 2,
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    return data, inventory


def _nightly(root: Path, data: Path, inventory: Path, matrix: dict[str, object]) -> tuple[int, dict[str, object]]:
    path = root / f"{matrix['name']}.yml"
    path.write_text(yaml.safe_dump(matrix))
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(path), "--inventory", str(inventory),
                                      "--data-dir", str(data), "--docs-dir", str(root / "docs")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    return result.exit_code, summary


@pytest.fixture(scope="module")
def quantized_farm(trt_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The run above, once for the module (its toolchain linked into the farm's own data dir)."""
    root = tmp_path_factory.mktemp("quantized-farm")
    data, inventory = _farm(root)
    link_real_toolchain(data, trt_env)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("EDGEFARM_DB_URL", raising=False)
    code, summary = _nightly(root, data, inventory, MATRIX)
    yield {"root": root, "data": data, "inventory": inventory, "code": code, "summary": summary,
           "db": f"sqlite:///{data / 'edgefarm.db'}"}
    mp.undo()


def _results(db: str, run_id: int) -> dict[tuple[str, str, str, str], Result]:
    engine = make_engine(db)
    with Session(engine) as s:
        rows = {(r.model, r.precision.value, r.platform, r.stage.value): r
                for r in s.scalars(select(Result).where(Result.run_id == run_id))}
        s.expunge_all()
    engine.dispose()
    return rows


def test_cpu_int4_awq_and_int8_sq_pass_end_to_end(quantized_farm: dict[str, object]) -> None:
    summary = quantized_farm["summary"]
    assert quantized_farm["code"] == 0 and summary["failed"] == [], summary
    assert summary["plan"] == {"run": 4}  # two CPU rows, two export-only rows for Thor
    rows = _results(str(quantized_farm["db"]), int(summary["run_id"]))
    engine = make_engine(str(quantized_farm["db"]))
    with Session(engine) as s:
        for precision, expected in (("int4_awq", "int4_awq"), ("int8_sq", "int8_sq")):
            stages = {st: rows[("tiny-qwen3-128", precision, "x86-cpu", st)] for st in
                      ("quantize", "export", "build", "infer", "accuracy", "bench")}
            assert {st: r.status.value for st, r in stages.items()} == dict.fromkeys(stages, "pass")
            quantize = stages["quantize"]
            assert (quantize.toolchain.value, quantize.toolchain_version) == ("tensorrt-edgellm", "0.11.0")
            assert quantize.reason.startswith(f"tensorrt-edgellm 0.11.0 {precision} (")
            assert "14 of 14 linear layers" in quantize.reason
            assert stages["build"].reason.startswith(f"engine precision {expected} (read back from the built graph); "
                                                     f"engine ")  # "... stays on local-cpu": its device keeps it
            assert stages["build"].reason.endswith(f" stays on {stages['build'].device}")
            assert stages["export"].toolchain.value == "edgellm-ort"
            metrics = dict(s.execute(select(Metric.name, Metric.value).where(
                Metric.result_id.in_([stages["quantize"].id, stages["accuracy"].id, stages["bench"].id]))).all())
            assert metrics["quantize_s"] > 0 and metrics["quantize_peak_rss_bytes"] > 100e6
            assert metrics["checkpoint_bytes"] > 0 and metrics["linears_quantized"] == 14
            assert abs(metrics["perplexity_ratio"] - 1) < 0.05  # scored against the float source's reference
            assert 0 <= metrics["top1_agreement"] <= 1 and metrics["decode_tokens_per_s"] > 0
            # the reference is of the unquantized source: its key names the source's digest
            keys = [e for e in s.scalars(select(CacheEntry.inputs)) if e["stage"] == "reference"]
            assert [k["checkpoint_sha256"] for k in keys] == [quantize.model_revision]
    engine.dispose()


def test_one_quantized_checkpoint_feeds_both_exports(quantized_farm: dict[str, object]) -> None:
    rows = _results(str(quantized_farm["db"]), int(quantized_farm["summary"]["run_id"]))
    trt = rows[("tiny-qwen3-128", "int4_awq", "thor", "export")]
    assert (trt.status.value, trt.toolchain.value, trt.toolchain_version) == ("pass", "tensorrt-edgellm", "0.11.0")
    assert trt.reason.startswith("2 attention plugins for 2 layers, 14 quantized GEMMs (report: 14)")
    assert trt.device == "orchestrator"  # no Thor in the inventory: host-only rows need none
    engine = make_engine(str(quantized_farm["db"]))
    with Session(engine) as s:
        made = [e for e in s.scalars(select(CacheEntry)) if e.inputs["stage"] == "quantize"]
        assert sorted(e.inputs["method"] for e in made) == ["int4_awq", "int8_sq"]  # once per checkpoint to make
        int4 = next(e for e in made if e.inputs["method"] == "int4_awq")
        assert (int4.toolchain.value, int4.toolchain_version) == ("tensorrt-edgellm", "0.11.0")
        checkpoint_of = {r.platform: set(s.scalars(select(ArtifactRecord.sha256).where(
            ArtifactRecord.result_id == r.id, ArtifactRecord.kind == "checkpoint")))
            for key, r in rows.items() if key[1] == "int4_awq" and key[3] == "quantize"}
        assert checkpoint_of == {"x86-cpu": {int4.sha256}, "thor": {int4.sha256}}
        exports = {e.inputs["toolchain"]: e.inputs["checkpoint_sha256"] for e in s.scalars(select(CacheEntry))
                   if e.inputs["stage"] == "export" and e.inputs["precision"] == "int4_awq"}
        assert set(exports) == {"edgellm-ort", "tensorrt-edgellm"} and len(set(exports.values())) == 1
    engine.dispose()


def test_nvfp4_on_stories260k_is_not_applicable_with_the_reason(quantized_farm: dict[str, object]) -> None:
    rows = _results(str(quantized_farm["db"]), int(quantized_farm["summary"]["run_id"]))
    for stage in ("quantize", "export"):
        row = rows[("stories260K", "nvfp4", "thor", stage)]
        assert row.status.value == "not_applicable", row.reason
        assert "nvfp4 needs every linear width divisible by its block of 16; 15 linear(s) are not" in row.reason


def test_export_only_rows_are_never_supported(quantized_farm: dict[str, object]) -> None:
    md = (Path(str(quantized_farm["root"])) / "docs" / "supported-models.md").read_text()
    thor = md.split("## thor\n", 1)[1].split("\n## ", 1)[0]
    line = next(x for x in thor.splitlines() if x.startswith("| tiny-qwen3-128 |"))
    assert "Toolchain: tensorrt-edgellm 0.11.0" in thor  # the version once, in the heading (issue 41)
    assert "◇ implemented (export verified only), tensorrt-edgellm ([run 1](runs/run-1.md#tiny-qwen3-" in line
    assert "✓" not in line  # export-only evidence is never the supported mark
    cpu = md.split("## x86-cpu\n", 1)[1].split("\n## ", 1)[0]
    assert "(runs/run-1.md#tiny-qwen3-128-int4-awq-x86-cpu)" in cpu and "(runs/run-1.md#tiny-qwen3-128-int8-sq" in cpu
    assert "Toolchain: edgellm-ort " in cpu  # the toolchain the evidence ran on (its quantizer: on the run page)
    evidence = (Path(str(quantized_farm["root"])) / "docs" / "runs" / "run-1.md").read_text()
    assert "| quantize | pass | tensorrt-edgellm 0.11.0 |" in evidence
    result = CliRunner().invoke(app, ["query", "--status", "l0_covered", "--format", "json", "--db",
                                      str(quantized_farm["db"])])
    assert result.exit_code == 0, result.output
    passing = {(r["model"], r["precision"], r["platform"]) for r in json.loads(result.stdout)}
    assert passing == {("tiny-qwen3-128", "int4_awq", "x86-cpu"), ("tiny-qwen3-128", "int8_sq", "x86-cpu")}


def test_a_rerun_hits_the_quantize_cache(quantized_farm: dict[str, object]) -> None:
    root = Path(str(quantized_farm["root"]))
    code, summary = _nightly(root, Path(str(quantized_farm["data"])), Path(str(quantized_farm["inventory"])),
                             {**MATRIX, "name": "quantized-again"})
    assert code == 0 and summary["failed"] == [], summary
    # three rows record the two quantized checkpoints (int4_awq is shared by x86-cpu and Thor): all reused
    assert summary["cache_hits"]["quantize"] == 3 and summary["cache_hits"]["export"] == 3
    rows = _results(str(quantized_farm["db"]), int(summary["run_id"]))
    assert rows[("tiny-qwen3-128", "int4_awq", "x86-cpu", "quantize")].reason.startswith(
        "cache hit; tensorrt-edgellm 0.11.0 int4_awq")
    assert rows[("tiny-qwen3-128", "int8_sq", "x86-cpu", "accuracy")].status.value == "pass"


def test_without_the_toolchain_its_rows_are_skipped_with_the_reason(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry unreachable: the one-time install fails, and the rows needing it say why (nothing runs)."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "5")
    data, inventory = _farm(tmp_path)
    matrix = {**MATRIX, "name": "no-toolchain", "defaults": {**LIMITS, "stages": ["quantize", "export"]}}
    code, summary = _nightly(tmp_path, data, inventory, matrix)
    # nothing ran: exit 5 (pytest's "no tests ran"), with the reason
    assert code == 5 and summary["plan"] == {"skipped": 4} and summary["stages"] == {}, summary
    assert summary["nothing_ran"] and all(": skipped: " in why for why in summary["why_nothing_ran"]), summary
    assert summary["run_id"] is None  # nothing to do opens no run (issue 41): the summary carries the reasons
    for why in summary["why_nothing_ran"]:
        assert "tensorrt-edgellm 0.11.0 could not be installed: installing tensorrt-edgellm 0.11.0: package " \
               "registry unreachable" in why, why
        assert str(data) not in why
    assert not (data / "toolchains" / "tensorrt-edgellm-0.11.0").exists()  # a failed install leaves nothing
