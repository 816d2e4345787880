"""TensorRT Edge-LLM's host stages as the farm runs them: quantize (its quantizer, the farm's quantizer for the
precisions it declares) and export (``tensorrt-edgellm-export`` + the structural check). The driver (``driver.py``)
imports this module when a stage runs; the generic stage bodies (``tasks/``) cache what these make.

Quantize: the product is a directory in the artifact store (the checkpoint and ``quantize.json``: the tool's argv,
time, peak RSS, size and the per-linear quantization report), keyed by (source checkpoint sha256, method, quantize
options, toolchain version); a hit is judged again like a new checkpoint. Outcomes: a precondition the tool would trip
on (block divisibility, no chat template) -> not applicable with the reason; more linears left in float than allowed
-> fail with the count.

Export: with the catalog's chat template when the checkpoint ships none; checked structurally (``onnx_check``: one
attention plugin per layer, as many quantized GEMMs as quantize's report counts quantized linears, the runtime's
inputs and outputs) before it is stored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.toolchains.base import QUANTIZE_RECORD, HostWork, NotApplicable
from edgefarm.toolchains.tensorrt_edgellm import variants
from edgefarm.toolchains.tensorrt_edgellm.calibration import CALIBRATION_FILE
from edgefarm.toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE
from edgefarm.toolchains.tensorrt_edgellm.export import export as trt_export
from edgefarm.toolchains.tensorrt_edgellm.onnx_check import check_onnx
from edgefarm.toolchains.tensorrt_edgellm.quantize import QuantReport, quant_report, quantize_options
from edgefarm.toolchains.tensorrt_edgellm.quantize import quantize as run_quantizer
from edgefarm.vocabulary.status import ResultStatus
from edgefarm.vocabulary.variant import LoraMode
from edgellm.errors import ErrorKind, TestFailure
from edgellm.reference import checkpoint_digest

if TYPE_CHECKING:
    from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm

NUM_SAMPLES = 32  # calibration rows of the shipped text (of ~60): enough for tiny models, part of the cache key
LOG = "quantize.log"  # what the quantizer's wrapper writes beside the checkpoint
ONNX_CHECK = 1  # version of the structural check a cached export passed (bump when it tightens)


# --- quantize ------------------------------------------------------------------------------------------------------

def _samples(job: JobSpec) -> int:
    """The catalog's calibration rows for the model, else the farm's default."""
    return job.calibration_samples or NUM_SAMPLES


def quantize_key_inputs(driver: TensorrtEdgellm, job: JobSpec, quantize_device: str, version: str) -> dict[str, Any]:
    options = quantize_options(job.precision.value, device=quantize_device, num_samples=_samples(job),
                               lm_head=driver.quantizer_lm_head(job.lm_head_precision),
                               kv_cache=driver.quantizer_kv_cache(job.kv_cache_precision),
                               calibration=CALIBRATION_FILE)
    return {"stage": "quantize", "checkpoint_sha256": job.checkpoint.sha256, **options,
            "toolchain": driver.name, "toolchain_version": version}


def quantize(driver: TensorrtEdgellm, work: HostWork, job: JobSpec, keyed: Keyed) -> StageOutcome:
    """A cache miss: run the quantizer on the source checkpoint."""
    version = str(keyed.toolchain_version)
    template = Path(job.chat_template) if job.chat_template else DEFAULT_CHAT_TEMPLATE
    with work.scratch("quantize-") as tmp:
        out_dir = tmp / "quantized"
        try:
            result = run_quantizer(driver.env_path(), Path(job.checkpoint.path), out_dir, job.precision.value,
                                   chat_template=template, device=work.quantize_device, num_samples=_samples(job),
                                   lm_head=driver.quantizer_lm_head(job.lm_head_precision),
                                   kv_cache=driver.quantizer_kv_cache(job.kv_cache_precision),
                                   calibration=CALIBRATION_FILE, timeout=work.timeout,
                                   max_unquantized_share=work.max_unquantized_share)
        except NotApplicable as exc:
            return StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.NOT_APPLICABLE, toolchain=driver.name,
                                toolchain_version=version, device="orchestrator",
                                reason=f"{driver.name} {version} {job.precision}: {exc}")
        except TestFailure as exc:  # the tool failed, or its checkpoint is not what the method promised
            out = StageOutcome.from_error(Stage.QUANTIZE, exc, device="orchestrator")
            out.toolchain, out.toolchain_version = driver.name, version
            if (out_dir / QUANTIZE_RECORD).is_file():  # the report was read: keep it, and its counts, as evidence
                record = json.loads((out_dir / QUANTIZE_RECORD).read_text(encoding="utf-8"))
                out.metrics.update(_run_metrics(record))
                out.duration_s = float(record["wall_s"])
                out.artifacts.append(work.put(out_dir / QUANTIZE_RECORD, ArtifactKind.REPORT))
                out.artifacts.append(work.put(out_dir / LOG, ArtifactKind.LOG))
            return out
        record = json.loads((out_dir / QUANTIZE_RECORD).read_text(encoding="utf-8"))
        record["checkpoint_sha256"] = checkpoint_digest(result.checkpoint)
        (out_dir / QUANTIZE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        logged = work.put(out_dir / LOG, ArtifactKind.LOG)
        ref = work.put(out_dir, ArtifactKind.CHECKPOINT)
        keyed.made(ref)
        work.install_checkpoint(ref, out_dir)
        out = judge_quantized(driver, work, job, version, ref)
        out.artifacts.append(logged)
        out.metrics.update(_run_metrics(record))
        out.duration_s = result.wall_s
        return out


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


def judge_quantized(driver: TensorrtEdgellm, work: HostWork, job: JobSpec, version: str,
                    ref: ArtifactRef) -> StageOutcome:
    """The passing outcome: the checkpoint reference export reads, the report re-read from the checkpoint itself
    and checked against the share allowed now (a cache hit is judged like a new checkpoint)."""
    directory, record = work.materialize_checkpoint(ref)
    checkpoint = directory / "checkpoint"
    report = quant_report(checkpoint, job.precision.value, lm_head=driver.quantizer_lm_head(job.lm_head_precision))
    report.check(work.max_unquantized_share)
    out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS, toolchain=driver.name,
                       toolchain_version=version, device="orchestrator", reason=_summary(driver, version, report))
    out.outputs["checkpoint"] = CheckpointRef(model=job.model, path=str(checkpoint),
                                              sha256=str(record["checkpoint_sha256"]))
    out.outputs["quantized_linears"] = len(report.quantized)
    out.artifacts.append(ref)
    out.metrics["linears_quantized"] = (float(len(report.quantized)), "")
    out.metrics["linears_unquantized"] = (float(len(report.unquantized)), "")
    out.metrics["linears_checked"] = (float(len(report.checked)), "")
    return out


def _summary(driver: TensorrtEdgellm, version: str, report: QuantReport) -> str:
    kept = f"; left in float by design: {', '.join(report.by_design)}" if report.by_design else ""
    return (f"{driver.name} {version} {report.method} ({report.quant_algo}): {len(report.quantized)} of "
            f"{len(report.checked)} linear layers stored as {report.expected}{kept}")


# --- export --------------------------------------------------------------------------------------------------------

def chat_template(job: JobSpec) -> Path:
    """The template an export supplies when the checkpoint ships none: the catalog's, else ours."""
    return Path(job.chat_template) if job.chat_template else DEFAULT_CHAT_TEMPLATE


def export_key_extra(job: JobSpec) -> dict[str, Any]:
    extra = {"chat_template_sha256": hashlib.sha256(chat_template(job).read_bytes()).hexdigest(),
             "onnx_check": ONNX_CHECK}
    if not job.features.plain:  # a variant's export is the product of its parts too (a plain one keeps its key)
        extra["variant"] = job.variant
        extra["variant_parts"] = {role: ref.sha256 for role, ref in job.parts}
        extra["variant_check"] = variants.CHECK_VERSION
    return extra


def variant_inputs(job: JobSpec) -> variants.VariantInputs:
    """The local directories of the checkpoints the row's variant reads (a draft, an adapter, a vocabulary map)."""
    def path(role: str) -> Path | None:
        ref = job.part(role)
        return None if ref is None else Path(ref.path)

    return variants.VariantInputs(draft=path("draft"), lora=path("lora"), vocab=path("vocab"))


def _variant_problems(driver: TensorrtEdgellm, job: JobSpec, source: Path, prepared: Path, root: Path,
                      inputs: variants.VariantInputs) -> list[str]:
    """What the variant's structure lacks in the export (and, for a merged LoRA, in the merged weights; for an
    inserted one, in how its graph inputs bind to the processed adapter)."""
    problems = variants.check_variant_export(root, job.features)
    lora = job.features.lora
    if lora is not None and lora.mode is LoraMode.MERGED and inputs.lora is not None:
        problems += variants.check_merged_lora(source, prepared, inputs.lora)
    if lora is not None and lora.mode is LoraMode.INSERTED:
        problems += variants.lora_binding_problems(root)
    return problems


def export(driver: TensorrtEdgellm, work: HostWork, job: JobSpec, ckpt: CheckpointRef, quantized_linears: int,
           keyed: Keyed) -> StageOutcome:
    """``tensorrt-edgellm-export`` into the store, after its structural check passed."""
    with work.scratch("trt-export-") as tmp:
        env, inputs, log = driver.env_path(), variant_inputs(job), tmp / "variant.log"
        source = variants.prepare_checkpoint(env, Path(ckpt.path), job.features, inputs, tmp / "variant", log=log)
        made = trt_export(env, source, tmp / "export", chat_template=chat_template(job), timeout=work.timeout,
                          extra_args=variants.exporter_args(job.features, inputs))
        root = made.onnx_dir.parent  # <out>/onnx: llm/, visual/, a processed LoRA ... one directory per part
        variants.after_export(env, root, job.features, inputs, log=log)
        problems = [] if job.features.plain else _variant_problems(driver, job, Path(ckpt.path), source, root, inputs)
        report = check_onnx(made.onnx_dir, expected_quantized=quantized_linears)
        report.problems.extend(problems)
        (tmp / "onnx_check.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        out = StageOutcome(stage=Stage.EXPORT, status=ResultStatus.PASS, device="orchestrator",
                           duration_s=made.wall_s)
        out.artifacts.append(work.put(made.log, ArtifactKind.LOG))
        if log.is_file():  # the variant's own tools (merge-lora, insert-lora, process-lora)
            out.artifacts.append(work.put(log, ArtifactKind.LOG))
        out.artifacts.append(work.put(tmp / "onnx_check.json", ArtifactKind.REPORT))
        out.metrics["export_s"] = (made.wall_s, "s")
        out.metrics["export_peak_rss_bytes"] = (float(made.peak_rss_bytes), "B")
        out.metrics["attention_plugins"] = (float(report.attention_plugins), "")
        out.metrics["quantized_gemms"] = (float(len(report.quantized_linears)), "")
        if report.problems:
            out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
            out.reason = f"ONNX export failed {len(report.problems)} structural check(s): {'; '.join(report.problems)}"
            return out
        # a plain row's export is its llm/ (what the build reads); a variant's is every part the exporter wrote
        ref = work.put(made.onnx_dir if job.features.plain else root, ArtifactKind.ONNX)
        keyed.made(ref)
        template = "the checkpoint's" if made.chat_template == "checkpoint" else Path(made.chat_template).name
        out.reason = (f"{report.attention_plugins} attention plugins for {report.layers} layers, "
                      f"{len(report.quantized_linears)} quantized GEMMs (report: {quantized_linears}); "
                      f"chat template {template}")
        if not job.features.plain:
            out.reason += f"; variant {job.variant}: structure checked ({', '.join(job.features.names())})"
        out.outputs["onnx"] = ref
        out.artifacts.append(ref)
        out.metrics["onnx_bytes"] = (float(ref.size), "B")
        return out
