"""A results database with a small, varied support matrix recorded through the real Recorder (SQLite), for the
docs tests: supported rows, a failure, a not-applicable row, an export-verified-only row, two nightly runs."""

from __future__ import annotations

from pathlib import Path

from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.recorder import Recorder

PIPELINE = ("export", "build", "infer", "accuracy", "bench")
VERSIONS = {"edgellm-farm": "0.1.0", "onnxruntime": "1.22.0"}
ORT = ("edgellm-ort", "0.1.0+onnxruntime-1.22.0")
TRT = ("tensorrt-edgellm", "0.11.0")


def _row(rec: Recorder, run: int, model: str, precision: str, platform: str, stages: dict[str, str],
         reason: str | None = None, metrics: dict[str, tuple[float, str]] | None = None,
         device: str | None = None, toolchain: tuple[str, str | None] = ORT) -> None:
    for stage, status in stages.items():
        ran = status in ("pass", "fail", "error")
        rec.record_result(run, model=model, precision=precision, platform=platform, stage=stage,
                          test_id=f"{model}-{precision}", status=status, device=device, toolchain=toolchain[0],
                          toolchain_version=toolchain[1] if ran else None,
                          reason=reason if status not in ("pass",) else None,
                          metrics=metrics if stage in ("bench", "accuracy") else None)


def build_docs_db(db_path: Path, data_dir: Path) -> str:
    """Two nightly runs on x86-cpu and orin; returns the database URL."""
    url = f"sqlite:///{db_path}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    passed = dict.fromkeys(PIPELINE, "pass")
    for i, decode in enumerate((410.0, 436.5)):
        run = rec.start_run("nightly", "schedule", "abc123", toolchain=VERSIONS)
        metrics = {"decode_tokens_per_s": (decode, "tok/s"), "prefill_tokens_per_s": (9000.0 + 100 * i, "tok/s"),
                   "perplexity_ratio": (1.0001, "")}
        _row(rec, run, "stories260K", "fp32", "x86-cpu", passed, metrics=metrics, device="local-cpu")
        half = {k: (v * (0.8 if k.endswith("per_s") else 1.0), u) for k, (v, u) in metrics.items()}
        _row(rec, run, "stories260K", "fp16", "x86-cpu", passed, metrics=half, device="local-cpu")
        _row(rec, run, "tiny-qwen3", "fp32", "x86-cpu",
             {"export": "pass", "build": "pass", "infer": "pass", "accuracy": "fail", "bench": "skipped"},
             reason=f"perplexity ratio 1.9 > 1.2; log {data_dir}/devices/local-cpu/logs/run-{run}/accuracy.log "
                    "(ssh edge@10.1.2.3:2222, server http://10.1.2.3:4200/api, /home/ci/secret/notes.txt)",
             device="local-cpu")
        _row(rec, run, "stories260K", "fp8", "orin", dict.fromkeys(PIPELINE, "not_applicable"),
             reason="fp8 needs SM89+; orin is SM87", toolchain=(TRT[0], None))
        _row(rec, run, "tiny-qwen3", "int4_awq", "orin",
             {"quantize": "pass", "export": "pass", "build": "skipped", "infer": "skipped", "accuracy": "skipped"},
             reason="no orin device in the inventory", toolchain=TRT)
        rec.finish_run(run, "failed")
    engine.dispose()
    return url
