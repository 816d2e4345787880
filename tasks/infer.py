"""Infer: run a batch of fixed prompts through the engine on a device of the platform (``edgellm infer``)."""

from __future__ import annotations

import json
import statistics

from artifacts.kinds import ArtifactKind
from devices.inventory import Device
from devices.transport import Transport
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

    def body() -> StageOutcome:
        farm = Farm.get(ctx)
        engine = built.outputs["engine"]
        request = farm.store.put(json.dumps(requests_for(job), indent=1).encode(), ArtifactKind.REPORT)

        def argv(device: Device, transport: Transport, job_dir: str) -> list[str]:
            return [device.interpreter, "-m", "edgellm", "infer", "--engine-dir", f"cache/{engine.sha256}",
                    "--input-file", f"cache/{request.sha256}", "--output-file", f"{job_dir}/out.json"]

        run = run_stage(farm, platform=job.platform, what=f"infer-{job.key}", argv=argv, inputs=[engine, request],
                        fetch={"out.json": "out.json"}, timeout=job.timeout(Stage.INFER),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.INFER))
        out = from_device_run(Stage.INFER, run, job)
        out.outputs["engine"] = engine
        if run.status is ResultStatus.PASS:
            responses = json.loads(run.fetched["out.json"].read_text())["responses"]
            out.artifacts.append(farm.store.put(run.fetched["out.json"], ArtifactKind.REPORT))
            empty = [r["id"] for r in responses if not r["output_ids"]]
            if len(responses) != job.max_batch_size or empty:
                out.status = ResultStatus.FAIL
                out.reason = f"expected {job.max_batch_size} non-empty responses; empty: {empty}"
            out.metrics["ttft_ms"] = (statistics.median(r["timings"]["ttft_ms"] for r in responses), "ms")
            out.metrics["infer_ms_per_token"] = (
                statistics.median(r["timings"]["ms_per_token"] for r in responses), "ms")
            out.metrics["generated_tokens"] = (float(sum(len(r["output_ids"]) for r in responses)), "tokens")
        return out

    return body()
