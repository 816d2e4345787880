"""onnxruntime-genai's export host stage as the farm runs it: a checkpoint the builder cannot build is not applicable
(with the reason), else the builder's output read back (``check``: the precision actually in the graph, every
decoder linear quantized at int4_wo) before it is stored. The driver (``driver.py``) imports this module when the
stage runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.toolchains.base import HostWork
from edgefarm.toolchains.onnxruntime_genai.check import check_export
from edgefarm.toolchains.onnxruntime_genai.export import BuilderFailed, applicability
from edgefarm.toolchains.onnxruntime_genai.export import export as build
from edgefarm.vocabulary.status import ResultStatus
from edgellm.errors import ErrorKind

if TYPE_CHECKING:
    from edgefarm.toolchains.onnxruntime_genai.driver import OnnxruntimeGenai


def export(driver: OnnxruntimeGenai, work: HostWork, job: JobSpec, ckpt: CheckpointRef,
           keyed: Keyed) -> StageOutcome:
    version = str(keyed.toolchain_version)
    config = json.loads((Path(ckpt.path) / "config.json").read_text(encoding="utf-8"))
    reason = applicability(config, job.precision.value)
    if reason is not None:
        return StageOutcome(stage=Stage.EXPORT, status=ResultStatus.NOT_APPLICABLE, device="orchestrator",
                            reason=f"{driver.name} {version} cannot build {job.model}: {reason}")
    log = work.log_path(f"export-{job.model.replace('/', '--')}-{job.precision}-{driver.name}.log")
    with work.scratch("genai-export-") as tmp:
        try:
            made = build(Path(ckpt.path), tmp / "export", job.precision.value, timeout=work.timeout, log=log)
        except BuilderFailed as exc:
            out = StageOutcome.from_error(Stage.EXPORT, exc, device="orchestrator")
            out.reason = f"{out.reason}: {exc.log_tail.splitlines()[-1] if exc.log_tail else ''}"[:2000]
            out.artifacts.append(work.put(log, ArtifactKind.LOG))
            return out
        check = check_export(made.out_dir, job.precision.value, config)
        (tmp / "export_check.json").write_text(json.dumps(check.to_dict(), indent=2) + "\n", encoding="utf-8")
        out = StageOutcome(stage=Stage.EXPORT, status=ResultStatus.PASS, device="orchestrator",
                           duration_s=made.wall_s)
        out.artifacts.append(work.put(log, ArtifactKind.LOG))
        out.artifacts.append(work.put(tmp / "export_check.json", ArtifactKind.REPORT))
        out.metrics["export_s"] = (made.wall_s, "s")
        if made.peak_rss_bytes:
            out.metrics["export_peak_rss_bytes"] = (float(made.peak_rss_bytes), "B")
        out.metrics["quantized_gemms"] = (float(check.matmulnbits), "")
        if check.problems:  # a precision that was not applied, a linear left out: never stored as this export
            out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
            out.reason = f"export failed {len(check.problems)} check(s): {'; '.join(check.problems)}"[:2000]
            return out
        ref = work.put(made.out_dir, ArtifactKind.ONNX)
        keyed.made(ref)
        out.reason = check.detail()
        out.outputs["onnx"] = ref
        out.artifacts.append(ref)
        out.metrics["onnx_bytes"] = (float(ref.size), "B")
        return out
