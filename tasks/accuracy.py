"""Accuracy: the engine against the Hugging Face reference of the same checkpoint, made once per model on the
orchestrating host (``tasks.reference``), so the device needs neither torch nor transformers. How is the toolchain
driver's: either the reference is staged on the device and the device command compares (its exit code and report
must agree), or the device produces what the host then judges against the local reference (the device generates
requests the driver made from the reference, or computes what the driver compares). A reference that failed is this
stage's error, with its reason."""

from __future__ import annotations

import json
from pathlib import Path

from edgefarm.artifacts.inuse import held_dir
from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import Transport
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage
from edgefarm.stages.job import PPL_LIMIT_METRIC, JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks import engines
from edgefarm.tasks.build import with_engine
from edgefarm.tasks.common import attempt_recorder, from_device_run
from edgefarm.tasks.device_exec import run_stage
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.toolchains.base import DeviceStep, job_driver
from edgellm.errors import ErrorKind


def accuracy(ctx: FarmContext, job: JobSpec, inferred: StageOutcome, reference: StageOutcome) -> StageOutcome:
    """Compare the engine with the model's transformers reference on a device of the platform."""
    return with_engine(ctx, job, Stage.ACCURACY, inferred, lambda holder: _accuracy(ctx, job, holder, reference))


def _accuracy(ctx: FarmContext, job: JobSpec, inferred: StageOutcome, reference: StageOutcome) -> StageOutcome:
    farm = Farm.get(ctx)
    engine, ref = inferred.outputs["engine"], reference.outputs["reference"]
    toolchain = job_driver(job, ctx.data_dir)
    device_stages = toolchain.device()
    with held_dir(farm.ctx.scratch_dir, "accuracy-") as tmp:
        local_ref = None
        if device_stages.accuracy_reads_reference():  # the host judges what the device made against it
            local_ref = Path(tmp) / "reference.npz"
            farm.store.get_file(ref.sha256, local_ref)
        ours = device_stages.accuracy_request(local_ref) if local_ref is not None else None
        staged = [ref] if ours is None else []
        request = None
        if ours is not None:  # the device generates our requests; the reference stays here
            request = farm.store.put(json.dumps(device_stages.infer_request(ours), indent=1).encode(),
                                     ArtifactKind.REPORT)
            staged.append(request)

        on_device = engines.load(farm, engine)

        def step(device: Device, transport: Transport, job_dir: str) -> DeviceStep:
            return engines.runtime_step(toolchain, on_device, device_stages.accuracy_step(
                device, engines.locate(farm, device, transport, on_device),
                f"cache/{ref.sha256}" if ours is None else None,
                f"cache/{request.sha256}" if request is not None else None, job_dir, job.thresholds))

        run = run_stage(farm, platform=job.platform, what=f"accuracy-{job.key}", argv=step,
                        inputs=[*staged, *engines.runtime_inputs(farm, on_device)],
                        fetch_on=(ResultStatus.PASS, ResultStatus.FAIL), timeout=job.timeout(Stage.ACCURACY),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.ACCURACY, toolchain),
                        toolchain=toolchain, only=engines.holders(farm, on_device))
        out = from_device_run(Stage.ACCURACY, run, toolchain)
        if not run.fetched:
            return out
        report = device_stages.accuracy_report(run.fetched, reference=local_ref,
                                               checkpoint=Path(job.checkpoint.path), precision=job.precision,
                                               thresholds=job.thresholds, requests=ours)
    metrics = report.pop("metrics", {})
    for path in run.fetched.values():
        out.artifacts.append(farm.store.put(path, ArtifactKind.REPORT))
    judged_here = device_stages.accuracy_judged_on_host()
    if judged_here:  # the host's comparison is the stage's report
        out.artifacts.append(farm.store.put(json.dumps(report, indent=1).encode(), ArtifactKind.REPORT))
    out.metrics.update(metrics)
    checks = report.get("checks")
    ppl_check = checks.get("perplexity_rel_diff") if isinstance(checks, dict) else None
    limit = ppl_check.get("threshold") if isinstance(ppl_check, dict) else None
    if isinstance(limit, (int, float)) and not isinstance(limit, bool):  # the pages show the ratio with its limit
        out.metrics[PPL_LIMIT_METRIC] = (float(limit), "")
    failed = report.get("failed_checks") or []
    if failed:
        out.reason = "failed checks: " + ", ".join(map(str, failed))
        # edgellm eval's where and what (issue 36): "diverges at layer 7 (mlp): rel 3.1e-1; layers 0-6 within 2e-4"
        if report.get("layers_summary"):
            out.reason += f"; {report['layers_summary']}"
        if report.get("diagnosis"):
            from edgellm.diagnosis import diagnosis_line

            out.reason += f"; diagnosis: {diagnosis_line(report['diagnosis'])}"
    if judged_here:  # judged here, not by the device command's exit code
        if not report.get("passed") and run.status is ResultStatus.PASS:
            out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
    elif bool(report.get("passed")) != (run.status is ResultStatus.PASS):
        out.status = ResultStatus.FAIL
        out.reason = "eval exit code and its report disagree"
    return out
