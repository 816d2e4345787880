"""The farm drives TensorRT Edge-LLM's device stages: a real Prefect nightly of stories260K fp16 on a Thor whose
install is the STAND-IN of tests/fixtures/trt_standin (no TensorRT device exists here). Real parts around it: the
tensorrt-edgellm exporter (session ``trt_env``), the transformers reference, Prefect, the results database and the
docs. The stand-in only checks what it receives and writes the documented outputs; its answers to the reference
prompts are the reference's own greedy continuations (computed here with ``edgellm reference``), so every stage
passes, and still the row is never supported: a stand-in is never evidence.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgellm.reference import load_reference
from edgellm.runtime.tokenizer import TextCodec
from flows.cli import app
from results.db import make_engine
from results.models import Metric, Result
from tasks.reference import EVAL_MAX_TOKENS, REFERENCE_WINDOW
from tests.helpers.toolchain_env import link_real_toolchain

pytestmark = pytest.mark.usefixtures("prefect_harness")
REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "fixtures" / "trt_standin"
MODEL = REPO / "edgellm" / "assets" / "stories260K"
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}
MATRIX = {"name": "trt-standin", "models": ["stories260K"], "precisions": ["fp16"], "platforms": ["thor"],
          "defaults": {**LIMITS, "stages": ["export", "build", "infer", "accuracy", "bench"]}}


def _reference_answers(root: Path) -> Path:
    """prompt -> the transformers reference's greedy continuation (the same settings as the farm's reference)."""
    ref = root / "reference.npz"
    subprocess.run([sys.executable, "-m", "edgellm", "reference", str(MODEL), "--output", str(ref),
                    "--max-tokens", str(EVAL_MAX_TOKENS), "--window", str(REFERENCE_WINDOW)],
                   check=True, capture_output=True, timeout=600)
    data, codec = load_reference(ref), TextCodec(MODEL / "tokenizer.json")
    answers = {p: codec.decode([t for t in ids if t not in data.eos_ids])
               for p, ids in zip(data.prompts, data.greedy_ids, strict=True)}
    path = root / "answers.json"
    path.write_text(json.dumps(answers))
    return path


@pytest.fixture(scope="module")
def standin_farm(trt_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("trt-standin-farm")
    data, inventory = root / "data", root / "inventory"
    inventory.mkdir()
    log = root / "standin-calls.jsonl"
    (inventory / "thor-standin.yaml").write_text(yaml.safe_dump({
        "type": "thor", "transport": "local", "work_dir": str(data / "devices" / "thor-standin"), "max_jobs": 2,
        "python": sys.executable,
        "env": {"PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "TRT_STANDIN_LOG": str(log),
                "TRT_STANDIN_ANSWERS": str(_reference_answers(root))},
        "toolchains": {"tensorrt-edgellm": {
            "build_dir": str(STANDIN / "build"), "trt_package_dir": str(STANDIN / "trt"),
            "plugin_path": str(STANDIN / "build" / "libNvInfer_edgellm_plugin.so"), "version": "0.11.0",
            "standin": True}}}))
    link_real_toolchain(data, trt_env)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("EDGEFARM_DB_URL", raising=False)
    matrix = root / "matrix.yml"
    matrix.write_text(yaml.safe_dump(MATRIX))
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory),
                                      "--data-dir", str(data), "--docs-dir", str(root / "docs")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "\"run_id\"" in result.stdout, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    yield {"root": root, "data": data, "code": result.exit_code, "summary": summary, "calls": calls,
           "db": f"sqlite:///{data / 'edgefarm.db'}", "output": result.output}
    mp.undo()


def _rows(db: str, run_id: int) -> dict[str, Result]:
    engine = make_engine(db)
    with Session(engine) as s:
        rows = {r.stage.value: r for r in s.scalars(select(Result).where(Result.run_id == run_id))}
        s.expunge_all()
    engine.dispose()
    return rows


def _metrics(db: str, result_id: int) -> dict[str, float]:
    engine = make_engine(db)
    with Session(engine) as s:
        found = dict(s.execute(select(Metric.name, Metric.value).where(Metric.result_id == result_id)).all())
    engine.dispose()
    return found


def test_every_stage_runs_through_the_standin_tools(standin_farm: dict[str, object]) -> None:
    summary = standin_farm["summary"]
    assert standin_farm["code"] == 0 and summary["failed"] == [], standin_farm["output"]
    assert summary["plan"] == {"run": 1}
    rows = _rows(str(standin_farm["db"]), int(summary["run_id"]))
    assert {st: r.status.value for st, r in rows.items()} == dict.fromkeys(
        ("export", "build", "infer", "accuracy", "bench"), "pass"), {k: r.reason for k, r in rows.items()}
    for stage in ("build", "infer", "accuracy", "bench"):
        row = rows[stage]
        assert (row.toolchain.value, row.toolchain_version, row.device) == (
            "tensorrt-edgellm", "0.11.0+standin", "thor-standin")
        assert (row.route.value, row.standin) == ("onnx", True)
        assert row.reason.startswith("STAND-IN tools (test only, never evidence): ")
    assert rows["export"].standin is False  # the real exporter ran on the host
    assert "engine precision fp16 (read back: llm.engine and the builder_config" in rows["build"].reason
    accuracy = _metrics(str(standin_farm["db"]), rows["accuracy"].id)
    # the stand-in answered the reference's own greedy continuations: full agreement, no divergence
    assert accuracy["greedy_divergence_margin"] == 0.0 and accuracy["greedy_mean_match_fraction"] == 1.0
    bench = _metrics(str(standin_farm["db"]), rows["bench"].id)
    assert bench["prefill_tokens_per_s"] == pytest.approx(64000.0)  # 128 tokens in the stand-in's fixed 2 ms
    assert bench["decode_ms_per_token"] == pytest.approx(2.0) and bench["decode_latency_ms_p90"] == pytest.approx(2.0)


def test_argv_env_and_request_translation(standin_farm: dict[str, object]) -> None:
    calls = standin_farm["calls"]
    assert [c["tool"] for c in calls].count("llm_build") == 1
    build = next(c for c in calls if c["tool"] == "llm_build")
    assert build["opts"]["onnxDir"].startswith("cache/") and build["opts"]["engineDir"].endswith("/engine")
    assert (build["opts"]["maxBatchSize"], build["opts"]["maxInputLen"], build["opts"]["maxKVCacheCapacity"]) == (
        "2", "128", "256")
    for call in calls:
        assert call["env"] == {"TRT_PACKAGE_DIR": str(STANDIN / "trt"),
                               "EDGELLM_PLUGIN_PATH": str(STANDIN / "build" / "libNvInfer_edgellm_plugin.so"),
                               "LD_LIBRARY_PATH": f"{STANDIN / 'trt' / 'lib'}:/usr/local/cuda/lib64"}
    benches = sorted((c["opts"]["mode"], c["opts"].get("inputLen"), c["opts"].get("pastKVLen")) for c in calls
                     if c["tool"] == "llm_bench")
    assert benches == [("decode", None, "128"), ("prefill", "128", None)]
    inferences = [c for c in calls if c["tool"] == "llm_inference"]
    assert len(inferences) == 2  # the infer stage and the accuracy stage
    work = Path(str(standin_farm["data"])) / "devices" / "thor-standin"
    requests = [json.loads((work / c["opts"]["inputFile"]).read_text()) for c in inferences]
    by_size = {len(r["requests"]): r for r in requests}
    infer, accuracy = by_size[2], by_size[4]  # infer: max_batch_size prompts; accuracy: the 4 reference prompts
    assert (infer["top_k"], infer["temperature"], infer["apply_chat_template"]) == (1, 1.0, False)
    assert infer["requests"][0]["messages"] == [{"role": "user", "content": "Once upon a time"}]
    assert accuracy["max_generate_length"] == 64  # the reference's greedy length
    out = json.loads(next(Path(p) for p in (work / c["opts"]["outputFile"] for c in inferences)).read_text())
    assert out["stand_in"] is True


def test_standin_results_are_never_supported(standin_farm: dict[str, object]) -> None:
    md = (Path(str(standin_farm["root"])) / "docs" / "supported-models.md").read_text()
    assert "No combination has passing evidence yet." in md and "Tested, no passing evidence yet: thor." in md
    evidence = (Path(str(standin_farm["root"])) / "docs" / "runs" / "run-1.md").read_text()
    assert evidence.count("STAND-IN tools (test only, never evidence)") == 4  # build, infer, accuracy, bench
    result = CliRunner().invoke(app, ["query", "--format", "json", "--db", str(standin_farm["db"])])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["status"], row["standin"], row["route"]) == ("incomplete", True, "onnx")
    passing = CliRunner().invoke(app, ["query", "--status", "pass", "--format", "json", "--db",
                                       str(standin_farm["db"])])
    assert json.loads(passing.stdout) == []
    docs_dir = Path(str(standin_farm["root"])) / "docs-again"
    again = CliRunner().invoke(app, ["docs", "--out", str(docs_dir), "--db", str(standin_farm["db"])])
    assert again.exit_code == 0, again.output
    assert "No combination has passing evidence yet." in (docs_dir / "supported-models.md").read_text()
    html = (docs_dir / "support-matrix.html").read_text()
    assert "STAND-IN tools (test only, never evidence)" in html


def test_the_text_check_fails_an_engine_that_parts_from_the_reference(standin_farm: dict[str, object]) -> None:
    """The same comparison the accuracy stage made, on the stand-in's default text (``STAND-IN <prompt>``): it
    parts from the reference at the first token, where the reference was sure, so fp16's 0.25-logit limit fails."""
    from edgellm.types import Precision
    from toolchains.tensorrt_edgellm.accuracy import compare_text, judge, text_limits

    ref = Path(str(standin_farm["root"])) / "reference.npz"
    texts = [f"STAND-IN {p}" for p in load_reference(ref).prompts]
    report = judge(compare_text(ref, MODEL / "tokenizer.json", texts), text_limits(Precision.FP16, {}))
    assert not report["passed"] and report["failed_checks"] == ["greedy_divergence_margin"]
    assert report["checks"]["greedy_divergence_margin"]["value"] > 1.0
    assert all(g["matched"] == 0 for g in report["greedy"])
    with pytest.raises(Exception, match="no text-agreement limit for int8_sq on tensorrt-edgellm"):
        text_limits(Precision.INT8_SQ, {})
