"""Quantize: produce the checkpoint a precision is exported from, and return its reference.

Unquantized precisions: the identity (the source's own reference: no copy, no second digest). Quantized precisions:
the farm's quantizer (the toolchain that declares it, ``toolchains.base.quantizer``: NVIDIA's tensorrt-edgellm) runs
on the orchestrating host, calibrating offline on the text the project ships. Once per (model, precision, LM head,
KV cache) whichever toolchain consumes it: the same checkpoint feeds edgellm's ONNX Runtime export and TensorRT
Edge-LLM's export.

The result is a directory in the artifact store (the checkpoint and ``quantize.json``: the tool's argv, time, peak
RSS, size and the per-linear quantization report), cached by the generic body (``quantize_key``: source checkpoint
sha256, method, quantize options, toolchain version); a hit is judged again like a new checkpoint. Export reads it from
``<data dir>/host/checkpoints/<artifact sha256>/checkpoint``, whose tree digest is checked against the one recorded
at quantize time each time it is handed out.

Outcomes: a precondition the tool would trip on (block divisibility, no chat template) -> not applicable with the
reason; more linears left in float than allowed -> fail with the count; the quantizer not installed -> skipped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from artifacts.kinds import ArtifactKind
from artifacts.store import ArtifactRef
from edgellm.errors import TestFailure, UnsupportedError
from edgellm.reference import checkpoint_digest
from edgellm.types import UNQUANTIZED
from results.models import ResultStatus
from stages import Stage
from tasks.farm import Farm, FarmContext
from tasks.outcome import Keyed, StageOutcome
from tasks.spec import CheckpointRef, JobSpec
from toolchains.base import ToolchainDriver, quantizer
from toolchains.tensorrt_edgellm.calibration import CALIBRATION_FILE
from toolchains.tensorrt_edgellm.driver import TensorrtEdgellm, quantizer_kv_cache, quantizer_lm_head
from toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE
from toolchains.tensorrt_edgellm.quantize import NotApplicable, QuantReport, quant_report, quantize_options
from toolchains.tensorrt_edgellm.quantize import quantize as run_quantizer

log = logging.getLogger(__name__)

NUM_SAMPLES = 32  # calibration rows of the shipped text (of ~60): enough for tiny models, part of the cache key
RECORD, LOG = "quantize.json", "quantize.log"  # what the quantizer's wrapper writes beside the checkpoint


def quantize_key(ctx: FarmContext, job: JobSpec) -> Keyed | StageOutcome:
    """The table's cache key function; the outcome itself where no quantizer runs (identity, none available)."""
    if job.precision in UNQUANTIZED:
        return identity(job)
    maker = quantizer(job.precision, Path(ctx.data_dir), job.pins)  # at the version the job chose
    if maker is None:
        raise UnsupportedError(f"no toolchain of this farm quantizes {job.precision}")
    state = maker.available()
    if not state.ok:
        return StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.SKIPPED, toolchain=maker.name,
                            reason=f"toolchain {maker.name} is not available: {state.reason}")
    if not isinstance(maker, TensorrtEdgellm):
        raise UnsupportedError(f"the quantize stage drives tensorrt-edgellm's quantizer only, not {maker.name}")
    version = maker.host_version()

    def on_hit(ref: ArtifactRef) -> StageOutcome:  # a stored checkpoint is judged again like a new one
        out = _outcome(Farm.get(ctx), job, maker, version, ref)
        out.reason = f"cache hit; {out.reason}"
        return out

    return Keyed(key_inputs(job, ctx, version), toolchain=maker.name, toolchain_version=version, on_hit=on_hit)


def identity(job: JobSpec) -> StageOutcome:
    ref = job.checkpoint
    out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS,
                       reason=f"identity for {job.precision} (checkpoint sha256 {ref.sha256[:12]})")
    out.outputs["checkpoint"] = ref
    out.outputs["quantized_linears"] = 0
    size = sum(p.stat().st_size for p in Path(ref.path).rglob("*") if p.is_file())
    out.metrics["checkpoint_bytes"] = (float(size), "B")
    return out


def key_inputs(job: JobSpec, ctx: FarmContext, version: str) -> dict[str, Any]:
    options = quantize_options(job.precision.value, device=ctx.quantize_device, num_samples=NUM_SAMPLES,
                               lm_head=_lm_head(job), kv_cache=quantizer_kv_cache(job.kv_cache_precision),
                               calibration=CALIBRATION_FILE)
    return {"stage": "quantize", "checkpoint_sha256": job.checkpoint.sha256, **options,
            "toolchain": TensorrtEdgellm.name.value, "toolchain_version": version}


def _lm_head(job: JobSpec) -> str | None:
    head = quantizer_lm_head(job.lm_head_precision)
    return None if head is None else head.value


def quantize(ctx: FarmContext, job: JobSpec, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: run the quantizer on the source checkpoint."""
    farm, version = Farm.get(ctx), str(keyed.toolchain_version)
    maker = quantizer(job.precision, Path(ctx.data_dir), job.pins)
    assert isinstance(maker, TensorrtEdgellm)  # as the key found it
    work = farm.ctx.host_work_dir / "scratch"
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work, prefix="quantize-"))
    out_dir = tmp / "quantized"
    template = Path(job.chat_template) if job.chat_template else DEFAULT_CHAT_TEMPLATE
    try:
        try:
            result = run_quantizer(maker.env_path(), Path(job.checkpoint.path), out_dir, job.precision.value,
                                   chat_template=template, device=farm.ctx.quantize_device, num_samples=NUM_SAMPLES,
                                   lm_head=_lm_head(job), kv_cache=quantizer_kv_cache(job.kv_cache_precision),
                                   calibration=CALIBRATION_FILE, timeout=job.timeout(Stage.QUANTIZE),
                                   max_unquantized_share=farm.ctx.max_unquantized_share)
        except NotApplicable as exc:
            return StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.NOT_APPLICABLE, toolchain=maker.name,
                                toolchain_version=version, device="orchestrator",
                                reason=f"{maker.name} {version} {job.precision}: {exc.reason}")
        except TestFailure as exc:  # the tool failed, or its checkpoint is not what the method promised
            out = StageOutcome.from_error(Stage.QUANTIZE, exc, device="orchestrator")
            out.toolchain, out.toolchain_version = maker.name, version
            if (out_dir / RECORD).is_file():  # the report was read: keep it, and its counts, as evidence
                record = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))
                out.metrics.update(_run_metrics(record))
                out.duration_s = float(record["wall_s"])
                out.artifacts.append(farm.store.put(out_dir / RECORD, ArtifactKind.REPORT))
                out.artifacts.append(farm.store.put(out_dir / LOG, ArtifactKind.LOG))
            return out
        record = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))
        record["checkpoint_sha256"] = checkpoint_digest(result.checkpoint)
        (out_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        logged = farm.store.put(out_dir / LOG, ArtifactKind.LOG)
        ref = farm.store.put(out_dir, ArtifactKind.CHECKPOINT)
        keyed.made(ref)
        _install(farm, ref, out_dir)
        out = _outcome(farm, job, maker, version, ref)
        out.artifacts.append(logged)
        out.metrics.update(_run_metrics(record))
        out.duration_s = result.wall_s
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_metrics(record: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """Time, peak RSS and size of the quantizer's run, and the report's counts, from its ``quantize.json``."""
    report = record.get("report") or {}
    checked = [n for n in report.get("linears", {}) if n not in report.get("by_design", [])]
    return {"quantize_s": (float(record["wall_s"]), "s"),
            "quantize_peak_rss_bytes": (float(record["peak_rss_bytes"]), "B"),
            "checkpoint_bytes": (float(record["size_bytes"]), "B"),
            "linears_quantized": (float(report.get("quantized", 0)), ""),
            "linears_unquantized": (float(len(report.get("unquantized", []))), ""),
            "linears_checked": (float(len(checked)), "")}


def checkpoints_dir(farm: Farm) -> Path:
    return farm.ctx.host_work_dir / "checkpoints"


def _install(farm: Farm, ref: ArtifactRef, made: Path) -> None:
    """Put a just-made quantized checkpoint where export reads it (a move: its content is the stored blob's)."""
    dest = checkpoints_dir(farm) / ref.sha256
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(made, dest)
    except OSError:  # another run installed it meanwhile; it is checked when handed out
        if not dest.exists():
            raise


def materialize(farm: Farm, ref: ArtifactRef) -> tuple[Path, dict[str, Any]]:
    """The stored quantize directory on this host (extracted, verified, when absent or altered) and its record."""
    dest = checkpoints_dir(farm) / ref.sha256
    if dest.is_dir():
        record = _record(dest)
        if record is not None and checkpoint_digest(dest / "checkpoint") == record.get("checkpoint_sha256"):
            return dest, record
        log.warning("quantized checkpoint %s was altered on this host: extracting it again", dest)
        stale = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{ref.sha256[:12]}.stale."))
        os.replace(dest, stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{ref.sha256[:12]}."))
    try:
        farm.store.extract(ref.sha256, staging / "q")  # verified against its sha256 while it is read
        try:
            os.replace(staging / "q", dest)
        except OSError:  # extracted by a concurrent run meanwhile; checked below
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    record = _record(dest)
    if record is None or checkpoint_digest(dest / "checkpoint") != record.get("checkpoint_sha256"):
        raise TestFailure(f"stored quantized checkpoint sha256:{ref.sha256} does not match its own record")
    return dest, record


def _record(directory: Path) -> dict[str, Any] | None:
    path = directory / RECORD
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _outcome(farm: Farm, job: JobSpec, maker: ToolchainDriver, version: str, ref: ArtifactRef) -> StageOutcome:
    """The passing outcome: the checkpoint reference export reads, the report re-read from the checkpoint itself
    and checked against the share allowed now (a cache hit is judged like a new checkpoint)."""
    directory, record = materialize(farm, ref)
    checkpoint = directory / "checkpoint"
    report = quant_report(checkpoint, job.precision.value, lm_head=_lm_head(job))
    report.check(farm.ctx.max_unquantized_share)
    out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS, toolchain=maker.name,
                       toolchain_version=version, device="orchestrator",
                       reason=_summary(maker, version, report))
    out.outputs["checkpoint"] = CheckpointRef(model=job.model, path=str(checkpoint),
                                              sha256=str(record["checkpoint_sha256"]))
    out.outputs["quantized_linears"] = len(report.quantized)
    out.artifacts.append(ref)
    out.metrics["linears_quantized"] = (float(len(report.quantized)), "")
    out.metrics["linears_unquantized"] = (float(len(report.unquantized)), "")
    out.metrics["linears_checked"] = (float(len(report.checked)), "")
    return out


def _summary(maker: ToolchainDriver, version: str, report: QuantReport) -> str:
    kept = f"; left in float by design: {', '.join(report.by_design)}" if report.by_design else ""
    return (f"{maker.name} {version} {report.method} ({report.quant_algo}): {len(report.quantized)} of "
            f"{len(report.checked)} linear layers stored as {report.expected}{kept}")
