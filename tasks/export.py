"""Export: checkpoint -> ONNX directory, on the orchestrating host, cached by content.

The checkpoint is what quantize handed over (the source itself for unquantized precisions). edgellm's toolchains
run ``edgellm export``; tensorrt-edgellm runs its own ``tensorrt-edgellm-export`` (with the catalog's chat template
when the checkpoint ships none), then the export is checked structurally (``onnx_check``: one attention plugin per
layer, as many quantized GEMMs as quantize's report counts quantized linears, the runtime's inputs and outputs).

Key (``export_key``; the generic body looks it up) = (checkpoint sha256, precision, export parameters, toolchain and
its version, edgellm source digest or the chat template): a rerun with the same inputs reuses the stored ONNX
artifact (verified) and says so; anything changed exports again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import edgellm
from artifacts.kinds import ArtifactKind
from devices.transport.local import LocalTransport
from edgellm.build_id import build_id
from edgellm.compiler.export import EXPORT_MANIFEST, OPSET
from edgellm.errors import ConfigurationError, ErrorKind
from results.models import ResultStatus
from stages import Stage
from tasks.device_exec import classify
from tasks.farm import Farm, FarmContext
from tasks.outcome import Keyed, StageOutcome
from tasks.spec import CheckpointRef, JobSpec
from toolchains.base import Toolchain, require
from toolchains.tensorrt_edgellm.driver import TensorrtEdgellm
from toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE
from toolchains.tensorrt_edgellm.export import export as trt_export
from toolchains.tensorrt_edgellm.onnx_check import check_onnx

ONNX_CHECK = 1  # version of the structural check a cached tensorrt-edgellm export passed (bump when it tightens)


def export_key_inputs(checkpoint_sha: str, job: JobSpec, toolchain_version: str) -> dict[str, object]:
    _, precision, toolchain, lm_head, kv_cache = job.export_variant
    inputs: dict[str, object] = {
        "stage": "export", "checkpoint_sha256": checkpoint_sha, "precision": precision.value,
        "lm_head_precision": lm_head and lm_head.value, "kv_cache_precision": kv_cache and kv_cache.value,
        "toolchain": toolchain.value, "toolchain_version": toolchain_version}
    if toolchain is Toolchain.TENSORRT_EDGELLM:
        return {**inputs, "chat_template_sha256": hashlib.sha256(chat_template(job).read_bytes()).hexdigest(),
                "onnx_check": ONNX_CHECK}
    return {**inputs, "opset": OPSET, "edgellm_build": build_id()}


def chat_template(job: JobSpec) -> Path:
    """The template a tensorrt-edgellm export supplies when the checkpoint ships none: the catalog's, else ours."""
    return Path(job.chat_template) if job.chat_template else DEFAULT_CHAT_TEMPLATE


def variant_flags(job: JobSpec) -> list[str]:
    """The LM-head and KV-cache precisions a test asks for reach the exporter (which refuses what it cannot)."""
    flags = []
    if job.lm_head_precision is not None:
        flags += ["--lm-head-precision", job.lm_head_precision.value]
    if job.kv_cache_precision is not None:
        flags += ["--kv-cache-precision", job.kv_cache_precision.value]
    return flags


def export_key(ctx: FarmContext, job: JobSpec, quantized: StageOutcome) -> Keyed:
    """The table's cache key function: the checkpoint quantize handed on, exported by the job's toolchain here."""
    ckpt: CheckpointRef = quantized.outputs["checkpoint"]  # what quantize made (identity: the source)
    version = require(job.toolchain, Path(ctx.data_dir), job.pins).host_version()
    return Keyed(export_key_inputs(ckpt.sha256, job, version), toolchain=job.toolchain, toolchain_version=version)


def export(ctx: FarmContext, job: JobSpec, quantized: StageOutcome, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: export the checkpoint with the job's toolchain."""
    farm, ckpt, timeout_s = Farm.get(ctx), quantized.outputs["checkpoint"], job.timeout(Stage.EXPORT)
    if job.toolchain is Toolchain.TENSORRT_EDGELLM:
        return _trt_export(farm, job, ckpt, int(quantized.outputs.get("quantized_linears", 0)), keyed, timeout_s)
    return _export(farm, job, ckpt, keyed, timeout_s)


def _export(farm: Farm, job: JobSpec, ckpt: CheckpointRef, keyed: Keyed, timeout_s: int) -> StageOutcome:
    model, precision = job.model, job.precision
    work = farm.ctx.host_work_dir / "scratch"
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work, prefix="export-"))
    try:
        logs = farm.ctx.host_work_dir / "logs" / f"run-{farm.ctx.run_id}"
        logs.mkdir(parents=True, exist_ok=True)
        variant = "-".join([*(str(x) for x in job.export_variant[1:] if x is not None),
                            *(f"{t}=={v}" for t, v in job.toolchain_versions)])
        log_path = logs / f"export-{model.replace('/', '--')}-{variant}.log"
        argv = [sys.executable, "-m", "edgellm", "export", ckpt.path, str(tmp / "onnx"),
                "--precision", precision.value, *variant_flags(job)]
        log_path.write_text(f"$ {' '.join(argv)}\n", encoding="utf-8")
        # the same edgellm the orchestrator imported, whatever the subprocess's cwd
        env = {"PYTHONPATH": str(Path(edgellm.__file__).resolve().parents[1])}
        result = LocalTransport("orchestrator", work).run(argv, timeout=timeout_s, log=log_path, env=env)
        status, kind, reason = classify(result, timeout_s)
        out = StageOutcome(stage=Stage.EXPORT, status=status, error_kind=kind, reason=reason, device="orchestrator",
                           duration_s=result.duration)
        out.artifacts.append(farm.store.put(log_path, ArtifactKind.LOG))
        if status is ResultStatus.PASS:
            recorded = json.loads((tmp / "onnx" / EXPORT_MANIFEST).read_text())["checkpoint"]["sha256"]
            if recorded != ckpt.sha256:  # the checkpoint changed during the run: its evidence would be another's
                raise ConfigurationError(f"checkpoint {ckpt.path} changed during the run: digest {ckpt.sha256} at "
                                         f"the start, {recorded} when exported")
            ref = farm.store.put(tmp / "onnx", ArtifactKind.ONNX)
            keyed.made(ref)
            out.outputs["onnx"] = ref
            out.artifacts.append(ref)
            out.metrics["export_s"] = (result.duration, "s")
            out.metrics["onnx_bytes"] = (float(ref.size), "B")
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _trt_export(farm: Farm, job: JobSpec, ckpt: CheckpointRef, quantized_linears: int, keyed: Keyed,
                timeout_s: int) -> StageOutcome:
    """``tensorrt-edgellm-export`` into the store, after its structural check passed."""
    driver = require(Toolchain.TENSORRT_EDGELLM, Path(farm.ctx.data_dir), job.pins)  # the job's version
    assert isinstance(driver, TensorrtEdgellm)
    work = farm.ctx.host_work_dir / "scratch"
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work, prefix="trt-export-"))
    try:
        made = trt_export(driver.env_path(), Path(ckpt.path), tmp / "export", chat_template=chat_template(job),
                          timeout=timeout_s)
        report = check_onnx(made.onnx_dir, expected_quantized=quantized_linears)
        (tmp / "onnx_check.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        out = StageOutcome(stage=Stage.EXPORT, status=ResultStatus.PASS, device="orchestrator",
                           duration_s=made.wall_s)
        out.artifacts.append(farm.store.put(made.log, ArtifactKind.LOG))
        out.artifacts.append(farm.store.put(tmp / "onnx_check.json", ArtifactKind.REPORT))
        out.metrics["export_s"] = (made.wall_s, "s")
        out.metrics["export_peak_rss_bytes"] = (float(made.peak_rss_bytes), "B")
        out.metrics["attention_plugins"] = (float(report.attention_plugins), "")
        out.metrics["quantized_gemms"] = (float(len(report.quantized_linears)), "")
        if report.problems:
            out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
            out.reason = f"ONNX export failed {len(report.problems)} structural check(s): {'; '.join(report.problems)}"
            return out
        ref = farm.store.put(made.onnx_dir, ArtifactKind.ONNX)
        keyed.made(ref)
        template = "the checkpoint's" if made.chat_template == "checkpoint" else Path(made.chat_template).name
        out.reason = (f"{report.attention_plugins} attention plugins for {report.layers} layers, "
                      f"{len(report.quantized_linears)} quantized GEMMs (report: {quantized_linears}); "
                      f"chat template {template}")
        out.outputs["onnx"] = ref
        out.artifacts.append(ref)
        out.metrics["onnx_bytes"] = (float(ref.size), "B")
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
