"""edgellm's export host stage as the farm runs it: ``edgellm export`` in a subprocess of this host (the same edgellm
the orchestrator imported), its manifest checked against the checkpoint the stage was given, the ONNX directory stored.
The driver (``driver.py``) imports this module when the stage runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import edgellm
from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.devices.transport.local import LocalTransport
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome, classify
from edgefarm.toolchains.base import HostWork
from edgefarm.vocabulary.status import ResultStatus
from edgellm.compiler.export import EXPORT_MANIFEST
from edgellm.errors import ConfigurationError

if TYPE_CHECKING:
    from edgefarm.toolchains.edgellm.driver import EdgellmToolchain


def variant_flags(job: JobSpec) -> list[str]:
    """The LM-head and KV-cache precisions a test asks for reach the exporter (which refuses what it cannot)."""
    flags = []
    if job.lm_head_precision is not None:
        flags += ["--lm-head-precision", job.lm_head_precision.value]
    if job.kv_cache_precision is not None:
        flags += ["--kv-cache-precision", job.kv_cache_precision.value]
    return flags


def export(driver: EdgellmToolchain, work: HostWork, job: JobSpec, ckpt: CheckpointRef, keyed: Keyed) -> StageOutcome:
    with work.scratch("export-") as tmp:
        variant = "-".join([*(str(x) for x in job.export_variant[1:] if x is not None),
                            *(f"{t}=={v}" for t, v in job.toolchain_versions)])
        log_path = work.log_path(f"export-{job.model.replace('/', '--')}-{variant}.log")
        argv = [sys.executable, "-m", "edgellm", "export", ckpt.path, str(tmp / "onnx"),
                "--precision", job.precision.value, *variant_flags(job)]
        log_path.write_text(f"$ {' '.join(argv)}\n", encoding="utf-8")
        # the same edgellm the orchestrator imported, whatever the subprocess's cwd
        env = {"PYTHONPATH": str(Path(edgellm.__file__).resolve().parents[1])}
        result = LocalTransport("orchestrator", tmp.parent).run(argv, timeout=work.timeout, log=log_path, env=env)
        status, kind, reason = classify(result, work.timeout)
        out = StageOutcome(stage=Stage.EXPORT, status=status, error_kind=kind, reason=reason, device="orchestrator",
                           duration_s=result.duration)
        out.artifacts.append(work.put(log_path, ArtifactKind.LOG))
        if status is ResultStatus.PASS:
            recorded = json.loads((tmp / "onnx" / EXPORT_MANIFEST).read_text())["checkpoint"]["sha256"]
            if recorded != ckpt.sha256:  # the checkpoint changed during the run: its evidence would be another's
                raise ConfigurationError(f"checkpoint {ckpt.path} changed during the run: digest {ckpt.sha256} at "
                                         f"the start, {recorded} when exported")
            ref = work.put(tmp / "onnx", ArtifactKind.ONNX)
            keyed.made(ref)
            out.outputs["onnx"] = ref
            out.artifacts.append(ref)
            out.metrics["export_s"] = (result.duration, "s")
            out.metrics["onnx_bytes"] = (float(ref.size), "B")
        return out
