"""Accuracy: ``edgellm eval --reference`` on a device compares the engine with the Hugging Face reference of the
same checkpoint (logits, greedy tokens, perplexity) against the per-precision thresholds. The reference file is
made once per model on the orchestrating host (``tasks.reference``) and staged like any artifact: the device
needs neither torch nor transformers. A reference that failed is this stage's error, with its reason."""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Mapping

from artifacts.kinds import ArtifactKind
from devices.inventory import Device
from devices.transport import Transport
from edgellm.cli import eval as eval_cli
from edgellm.errors import ConfigurationError
from edgellm.thresholds import FIELDS
from results.models import ResultStatus
from stages import Stage
from tasks.common import (
    attempt_recorder,
    from_device_run,
)
from tasks.device_exec import run_stage
from tasks.farm import Farm, FarmContext
from tasks.outcome import StageOutcome
from tasks.spec import JobSpec


def eval_metrics(report: dict[str, object]) -> dict[str, tuple[float, str]]:
    metrics: dict[str, tuple[float, str]] = {}
    checks = report.get("checks") or {}
    if isinstance(checks, dict):
        for name, check in checks.items():
            value = check.get("value") if isinstance(check, dict) else None
            if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
                metrics[name] = (float(value), "")
    ref, eng = report.get("reference_perplexity"), report.get("engine_perplexity")
    if isinstance(ref, (int, float)) and isinstance(eng, (int, float)) and ref > 0:
        metrics["perplexity"] = (float(eng), "")
        metrics["reference_perplexity"] = (float(ref), "")
        metrics["perplexity_ratio"] = (float(eng) / float(ref), "")
    return metrics


@functools.cache
def _flag_of() -> dict[str, str]:
    """threshold name -> the ``edgellm eval`` option that overrides it (asked of the CLI's own parser)."""
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    return {a.dest: a.option_strings[0] for a in parser._actions if a.dest in FIELDS and a.option_strings}


def threshold_flags(limits: Mapping[str, float]) -> list[str]:
    """``edgellm eval`` options for the catalog's limits of a model (over the library's per-precision defaults)."""
    flags = []
    for name, value in sorted(limits.items()):
        if name not in _flag_of():
            raise ConfigurationError(f"threshold {name!r} cannot be given to edgellm eval; valid: "
                                     f"{', '.join(sorted(_flag_of()))}")
        flags += [_flag_of()[name], repr(float(value))]
    return flags


def accuracy(ctx: FarmContext, job: JobSpec, inferred: StageOutcome, reference: StageOutcome) -> StageOutcome:
    """Compare the engine with the model's transformers reference on a device of the platform."""

    def body() -> StageOutcome:
        farm = Farm.get(ctx)
        engine, ref = inferred.outputs["engine"], reference.outputs["reference"]

        def argv(device: Device, transport: Transport, job_dir: str) -> list[str]:
            return [device.interpreter, "-m", "edgellm", "eval", "--engine-dir", f"cache/{engine.sha256}",
                    "--reference", f"cache/{ref.sha256}", "--output", f"{job_dir}/eval.json",
                    *threshold_flags(job.thresholds)]

        run = run_stage(farm, platform=job.platform, what=f"accuracy-{job.key}", argv=argv, inputs=[engine, ref],
                        fetch={"eval.json": "eval.json"}, fetch_on=(ResultStatus.PASS, ResultStatus.FAIL),
                        timeout=job.timeout(Stage.ACCURACY), on_attempt_failed=attempt_recorder(farm, job,
                                                                                                 Stage.ACCURACY))
        out = from_device_run(Stage.ACCURACY, run, job)
        if "eval.json" in run.fetched:
            report = json.loads(run.fetched["eval.json"].read_text())
            out.artifacts.append(farm.store.put(run.fetched["eval.json"], ArtifactKind.REPORT))
            out.metrics.update(eval_metrics(report))
            failed = report.get("failed_checks") or []
            if failed:
                out.reason = "failed checks: " + ", ".join(map(str, failed))
            if bool(report.get("passed")) != (run.status is ResultStatus.PASS):
                out.status = ResultStatus.FAIL
                out.reason = "eval exit code and its report disagree"
        return out

    return body()
