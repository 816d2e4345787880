"""Infer: run a batch of fixed prompts through the engine on the device holding it. The toolchain driver says
the command and translates our requests (``edgellm infer``'s format) into its input file and its output back into
our responses."""

from __future__ import annotations

import json
import statistics

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import Transport
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks import engines
from edgefarm.tasks.build import with_engine
from edgefarm.tasks.common import (
    attempt_recorder,
    from_device_run,
)
from edgefarm.tasks.device_exec import run_stage
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.toolchains.base import DeviceStep, job_driver
from edgellm.errors import EdgeLLMError, TestFailure

PROMPTS = (
    "Once upon a time",
    "One day, a little girl named Lily",
    "The sun was shining and the birds",
    "Tom had a red ball. He",
)
MAX_NEW_TOKENS = 32


def requests_for(job: JobSpec) -> dict[str, object]:
    new = max(1, min(MAX_NEW_TOKENS, job.max_seq_len - job.max_input_len))
    return {"requests": [{"id": f"r{i}", "prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": new,
                          "temperature": 0.0} for i in range(job.max_batch_size)]}


def infer(ctx: FarmContext, job: JobSpec, built: StageOutcome) -> StageOutcome:
    """Generate for the fixed prompts with the built engine on a device of the platform."""
    return with_engine(ctx, job, Stage.INFER, built, lambda holder: _infer(ctx, job, holder))


def _infer(ctx: FarmContext, job: JobSpec, built: StageOutcome) -> StageOutcome:

    def body() -> StageOutcome:
        farm = Farm.get(ctx)
        engine = built.outputs["engine"]
        toolchain = job_driver(job, ctx.data_dir)
        device_stages = toolchain.device()
        ours = requests_for(job)["requests"]
        request = farm.store.put(json.dumps(device_stages.infer_request(ours), indent=1).encode(), ArtifactKind.REPORT)

        on_device = engines.load(farm, engine)

        def step(device: Device, transport: Transport, job_dir: str) -> DeviceStep:
            path = engines.locate(farm, device, transport, on_device)
            return engines.runtime_step(toolchain, on_device,
                                        device_stages.infer_step(device, path, f"cache/{request.sha256}", job_dir))

        run = run_stage(farm, platform=job.platform, what=f"infer-{job.key}", argv=step,
                        inputs=[request, *engines.runtime_inputs(farm, on_device)],
                        fetch_on=(ResultStatus.PASS, ResultStatus.FAIL), timeout=job.timeout(Stage.INFER),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.INFER, toolchain), toolchain=toolchain,
                        only=engines.holders(farm, on_device))
        out = from_device_run(Stage.INFER, run, toolchain)
        out.outputs["engine"] = engine
        if run.status is ResultStatus.FAIL and "out.json" in run.fetched:  # the tool names what failed in it
            try:
                device_stages.infer_responses(json.loads(run.fetched["out.json"].read_text()), ours)
            except EdgeLLMError as exc:
                out.reason = f"{out.reason}; {exc}"[:2000]
            except ValueError:
                pass
        if run.status is ResultStatus.PASS:
            out.artifacts.append(farm.store.put(run.fetched["out.json"], ArtifactKind.REPORT))
            try:
                written = json.loads(run.fetched["out.json"].read_text())
            except ValueError as exc:  # a tool that exits 0 with an empty or cut output file (a full disk)
                raise TestFailure(f"the inference tool exited 0 but its output file is not JSON ({exc})") from None
            responses = device_stages.infer_responses(written, ours)
            empty = [r["id"] for r in responses if not (r.get("output_ids") or r.get("text"))]
            if len(responses) != job.max_batch_size or empty:
                out.status = ResultStatus.FAIL
                out.reason = f"expected {job.max_batch_size} non-empty responses; empty: {empty}"
            timed = [r["timings"] for r in responses if r.get("timings")]
            if timed:  # a tool that writes no per-request timings gets none: nothing is guessed
                out.metrics["ttft_ms"] = (statistics.median(t["ttft_ms"] for t in timed), "ms")
                out.metrics["infer_ms_per_token"] = (statistics.median(t["ms_per_token"] for t in timed), "ms")
            peak = written.get("peak_memory_bytes") if isinstance(written, dict) else None
            if isinstance(peak, int) and not isinstance(peak, bool) and peak >= 0:  # edgellm infer's own peak
                out.metrics["infer_peak_memory_mb"] = (peak / 2**20, "MiB")
            if all(r.get("output_ids") is not None for r in responses):
                out.metrics["generated_tokens"] = (float(sum(len(r["output_ids"]) for r in responses)), "tokens")
            else:
                out.metrics["generated_chars"] = (float(sum(len(r.get("text") or "") for r in responses)), "chars")
        return out

    return body()
